"""Routes of runs: start (and start_or_signal), list, count, get, signal, cancel, terminate, fork."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from django.db.models import Q
from django.http import HttpRequest
from ninja import Query, Router, Status

from django_weft.api import pages
from django_weft.api.auth import caller, require
from django_weft.api.errors import ApiError
from django_weft.api.filters import CountQuery, RunFilters, to_keywords
from django_weft.api.pages import PageQuery
from django_weft.api.schemas import (
    ERRORS,
    ChangedOut,
    CountOut,
    FlowStartIn,
    ForkIn,
    PendingActivitiesOut,
    ReasonIn,
    RunOut,
    RunPage,
    SignalIn,
    SignalName,
    SignalOut,
    StartOrSignalIn,
    StartOrSignalOut,
    StartOut,
    StepPage,
    WorkflowId,
    as_json,
    payload_value,
    run_out,
    step_out,
)
from django_weft.models import StepAttempt, Workflow, WorkflowStep
from django_weft.services import client, visibility, with_start
from django_weft.services.client import WorkflowHandle

router = Router(tags=["runs"])

class ListQuery(RunFilters, PageQuery):
    pass


def _key(run: Workflow) -> tuple[str, str]:
    return run.created_at.isoformat(), str(run.run_id)


def _after_cursor(cursor: str) -> Q:
    created_at, run_id = pages.decode(cursor, 2)
    moment: dt.datetime | None = None
    try:
        parsed, after = dt.datetime.fromisoformat(created_at), uuid.UUID(run_id)
        # Ours are aware and in range; an edited one may be naive or overflow in UTC (a 500 in the adapter).
        if parsed.utcoffset() is not None:
            moment = parsed.astimezone(dt.UTC)
    except (ValueError, OverflowError):
        pass
    if moment is None:
        raise ApiError(422, "invalid_cursor", "cursor is not one this API returned")
    return Q(created_at__lt=moment) | Q(created_at=moment, run_id__lt=after)


@router.post("runs", response={201: StartOut, **ERRORS}, summary="Start a run")
def start(request: HttpRequest, body: FlowStartIn) -> Status:
    require(request, "add_workflow")
    handle = client.start(body.workflow, body.input, workflow_id=body.workflow_id,
                          idempotency_key=body.idempotency_key, start_after=body.start_after,
                          execution_timeout=body.execution_timeout, tags=body.tags,
                          search_attributes=body.search_attributes or None,
                          on_terminal_conflict=body.on_terminal_conflict, queue=body.queue,
                          concurrency_key=body.concurrency_key, priority=body.priority, debounce=body.debounce,
                          on_conflict=body.on_conflict)
    run = handle.refresh()
    return Status(201, {"workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status})


@router.get("runs", response={200: RunPage, **ERRORS}, summary="List runs, newest first")
def list_runs(request: HttpRequest, params: Query[ListQuery]) -> dict[str, Any]:
    require(request, "view_workflow")
    runs = visibility.list_runs(**to_keywords(params))
    if params.cursor:
        runs = runs.filter(_after_cursor(params.cursor))
    found, after = pages.page(runs, params.limit, _key)
    return {"results": [run_out(run) for run in found], "next": after}


# Registered before runs/{workflow_id}, whose pattern would take "count" and "start_or_signal" for ids.
@router.get("runs/count", response={200: CountOut, **ERRORS}, summary="Count runs, grouped")
def count_runs(request: HttpRequest, params: Query[CountQuery]) -> dict[str, Any]:
    require(request, "view_workflow")
    counts = visibility.count_runs(group_by=params.group_by, **to_keywords(params))
    rows = sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))
    return {"counts": [{"key": as_json(key), "count": n} for key, n in rows], "total": sum(counts.values())}


@router.post("runs/start_or_signal", response={200: StartOrSignalOut, 201: StartOrSignalOut, **ERRORS},
             summary="Signal the open run of a workflow id, or start one whose first signal this is")
def start_or_signal(request: HttpRequest, body: StartOrSignalIn) -> Status:
    require(request, "add_workflow")
    require(request, "signal_workflow")
    options = {"start_after": body.start_after, "execution_timeout": body.execution_timeout,
               "tags": body.tags, "search_attributes": body.search_attributes or None, "queue": body.queue,
               "concurrency_key": body.concurrency_key, "priority": body.priority or None}
    outcome = with_start.start_or_signal(
        body.workflow, body.input, signal=body.signal, payload=body.payload, signal_id=body.signal_id,
        workflow_id=body.workflow_id, idempotency_key=body.idempotency_key,
        on_terminal_conflict=body.on_terminal_conflict,
        **{key: value for key, value in options.items() if value is not None})
    run = outcome.handle.refresh()
    return Status(201 if outcome.outcome == "started" else 200, {
        "workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status, "outcome": outcome.outcome,
        "delivered": outcome.delivered})


@router.get("runs/{workflow_id}", response={200: RunOut, **ERRORS}, summary="The latest run of a workflow id")
def get_run(request: HttpRequest, workflow_id: WorkflowId) -> dict[str, Any]:
    require(request, "view_workflow")
    return run_out(client.get_handle(workflow_id).refresh())


@router.get("runs/{workflow_id}/pending_activities", response={200: PendingActivitiesOut, **ERRORS},
            summary="The activity attempts in flight: executing, waiting for a completion, a retry or a slot")
def pending(request: HttpRequest, workflow_id: WorkflowId) -> dict[str, Any]:
    require(request, "view_workflow")
    items = client.get_handle(workflow_id).pending_activities()
    return {"pending_activities": [{**item.as_dict(), "heartbeat_details": payload_value(item.heartbeat_details)
                                    if item.heartbeat_details is not None else None}
                                   for item in items]}


@router.get("runs/{workflow_id}/steps", response={200: StepPage, **ERRORS},
            summary="The journal of the latest run, in step order, with each step's attempt history")
def steps(request: HttpRequest, workflow_id: WorkflowId, params: Query[PageQuery]) -> dict[str, Any]:
    require(request, "view_workflow")
    run = client.get_handle(workflow_id).refresh()
    rows = WorkflowStep.objects.filter(run=run).order_by("seq")
    if params.cursor:
        rows = rows.filter(seq__gt=_seq_cursor(params.cursor))
    found, following = pages.page(rows, params.limit, lambda step: [str(step.seq)])
    history: dict[int, list[StepAttempt]] = {}
    if found:
        for row in StepAttempt.objects.filter(run=run, seq__gte=found[0].seq, seq__lte=found[-1].seq).order_by(
                "seq", "attempt"):
            history.setdefault(row.seq, []).append(row)
    return {"results": [step_out(step, history.get(step.seq, [])) for step in found], "next": following}


def _seq_cursor(cursor: str) -> int:
    [seq] = pages.decode(cursor, 1)
    if not seq.isdigit():
        raise ApiError(422, "invalid_cursor", "cursor is not one this API returned")
    return int(seq)


@router.post("runs/{workflow_id}/signals/{name}", response={202: SignalOut, **ERRORS}, summary="Signal the open run")
def signal(request: HttpRequest, workflow_id: WorkflowId, name: SignalName, body: SignalIn | None = None) -> Status:
    require(request, "signal_workflow")
    payload, signal_id = (body.payload, body.signal_id) if body else (None, None)
    delivered = client.signal(workflow_id, name, payload, signal_id=signal_id)
    handle = client.get_handle(workflow_id)
    return Status(202, {"workflow_id": workflow_id, "run_id": handle.run_id, "delivered": delivered})


@router.post("runs/{workflow_id}/cancel", response={200: ChangedOut, **ERRORS}, summary="Cancel the open run")
def cancel(request: HttpRequest, workflow_id: WorkflowId, body: ReasonIn | None = None) -> dict[str, Any]:
    return _end(request, workflow_id, body, "cancelled", WorkflowHandle.cancel)


@router.post("runs/{workflow_id}/terminate", response={200: ChangedOut, **ERRORS},
             summary="End the open run at once (timed_out, termination_reason terminated)")
def terminate(request: HttpRequest, workflow_id: WorkflowId, body: ReasonIn | None = None) -> dict[str, Any]:
    return _end(request, workflow_id, body, "terminated", WorkflowHandle.terminate)


def _end(request: HttpRequest, workflow_id: str, body: ReasonIn | None, verb: str,
         action: Callable[[WorkflowHandle, str], bool]) -> dict[str, Any]:
    """Cancel or terminate: the same permission, a default reason naming the caller, the run as it is after."""
    require(request, "cancel_workflow")
    reason = (body.reason if body else "") or f"{verb} by {caller(request)} through the HTTP API"
    handle = client.get_handle(workflow_id)
    changed = action(handle, reason)
    run = handle.refresh()
    return {"workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status, "changed": changed,
            "cancel_requested": run.cancel_requested_at is not None}


@router.post("runs/{workflow_id}/fork", response={201: StartOut, **ERRORS},
             summary="Start a run that keeps the journal before a step and executes from there")
def fork(request: HttpRequest, workflow_id: WorkflowId, body: ForkIn) -> Status:
    require(request, "retry_workflow")
    handle = client.get_handle(workflow_id, body.run_id).fork(body.from_step, workflow_id=body.workflow_id)
    run = handle.refresh()
    return Status(201, {"workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status})
