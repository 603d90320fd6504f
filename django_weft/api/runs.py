"""Routes of runs: start, list, get, signal, cancel (the core routes of design 8.6)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from typing import Any

from django.db.models import Q
from django.http import HttpRequest
from ninja import Query, Router, Schema
from pydantic import Field

from .. import client, finding
from .auth import caller, require
from .errors import ApiError
from .schemas import ERRORS, ChangedOut, ReasonIn, RunOut, RunPage, SignalIn, SignalOut, StartIn, StartOut, run_out

router = Router(tags=["runs"])

PAGE_LIMIT = 500


class ListQuery(Schema):
    status: list[str] | None = Field(None, description="Repeat or comma-separate for several.")
    type: list[str] | None = Field(None, description="Workflow names; repeat for several.")
    limit: int = Field(50, ge=1, le=PAGE_LIMIT)
    cursor: str | None = Field(None, max_length=200, description="The `next` of the previous page.")


def _listed(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()] or None


def _cursor_of(created_at: dt.datetime, run_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(run_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after_cursor(cursor: str) -> Q:
    try:
        created_at, run_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        moment, after = dt.datetime.fromisoformat(created_at), uuid.UUID(run_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ApiError(422, "invalid_cursor", "cursor is not one this API returned") from None
    return Q(created_at__lt=moment) | Q(created_at=moment, run_id__lt=after)


@router.post("runs", response={201: StartOut, **ERRORS}, summary="Start a run")
def start(request: HttpRequest, body: StartIn) -> tuple[int, dict[str, Any]]:
    require(request, "add_workflow")
    handle = client.start(body.workflow, body.input, workflow_id=body.workflow_id,
                          idempotency_key=body.idempotency_key, start_after=body.start_after,
                          execution_timeout=body.execution_timeout, tags=body.tags,
                          search_attributes=body.search_attributes or None,
                          on_terminal_conflict=body.on_terminal_conflict)
    run = handle.refresh()
    return 201, {"workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status}


@router.get("runs", response={200: RunPage, **ERRORS}, summary="List runs, newest first")
def list_runs(request: HttpRequest, params: Query[ListQuery]) -> dict[str, Any]:
    require(request, "view_workflow")
    runs = finding.list_runs(status=_listed(params.status), type=_listed(params.type))
    if params.cursor:
        runs = runs.filter(_after_cursor(params.cursor))
    page = list(runs[:params.limit + 1])
    more = len(page) > params.limit
    page = page[:params.limit]
    return {"results": [run_out(run) for run in page],
            "next": _cursor_of(page[-1].created_at, page[-1].run_id) if more else None}


@router.get("runs/{workflow_id}", response={200: RunOut, **ERRORS}, summary="The latest run of a workflow id")
def get_run(request: HttpRequest, workflow_id: str) -> dict[str, Any]:
    require(request, "view_workflow")
    return run_out(client.get_handle(workflow_id).refresh())


@router.post("runs/{workflow_id}/signals/{name}", response={202: SignalOut, **ERRORS}, summary="Signal the open run")
def signal(request: HttpRequest, workflow_id: str, name: str, body: SignalIn | None = None) -> tuple[int, dict]:
    require(request, "signal_workflow")
    payload, signal_id = (body.payload, body.signal_id) if body else (None, None)
    delivered = client.signal(workflow_id, name, payload, signal_id=signal_id)
    handle = client.get_handle(workflow_id)
    return 202, {"workflow_id": workflow_id, "run_id": handle.run_id, "delivered": delivered}


@router.post("runs/{workflow_id}/cancel", response={200: ChangedOut, **ERRORS}, summary="Cancel the open run")
def cancel(request: HttpRequest, workflow_id: str, body: ReasonIn | None = None) -> dict[str, Any]:
    require(request, "cancel_workflow")
    reason = (body.reason if body else "") or f"cancelled by {caller(request)} through the HTTP API"
    handle = client.get_handle(workflow_id)
    changed = handle.cancel(reason)
    run = handle.refresh()
    return {"workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status, "changed": changed}
