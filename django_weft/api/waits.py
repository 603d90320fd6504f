"""Routes that ask a run something and may wait for its answer: the result (a long poll), queries, updates.

A wait holds no transaction and no lock: it looks at the row now and then, as ``handle.result()`` and
``UpdateHandle.result()`` do (an update's reply wakes it at once on PostgreSQL, by LISTEN on the request's
connection while it waits). These routes are exempt from ATOMIC_REQUESTS (see ``urls``): inside the request's
transaction the run's progress would not be seen. A wait lasts at most ``timeout`` seconds (at most 30, and
WEFT_API_MAX_WAIT_SECONDS), then answers 408; an update that timed out stays accepted and is applied when the run
gets to it.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema
from pydantic import Field

from django_weft.api.auth import require
from django_weft.api.errors import ApiError
from django_weft.api.schemas import (
    ERRORS,
    Body,
    ErrorOut,
    QueryName,
    RunOut,
    UpdateId,
    UpdateName,
    WorkflowId,
    payload_value,
    run_out,
)
from django_weft.common.storable import check_text
from django_weft.conf import weft_settings
from django_weft.exceptions import WorkflowCancelled, WorkflowFailed, WorkflowNotFound, WorkflowTimedOut
from django_weft.models import Workflow, WorkflowUpdate
from django_weft.services import client
from django_weft.services.updates import UpdateHandle

router = Router(tags=["runs"])

MAX_WAIT = 30.0
WAIT = Field(10.0, ge=0, le=MAX_WAIT, description=f"Seconds to wait (at most {MAX_WAIT:g}); 0 answers at once.")


class WaitQuery(Schema):
    timeout: float = WAIT


class QueryIn(Body):
    args: list[Any] = Field(default_factory=list, max_length=64, description="The query handler's arguments.")


class QueryOut(Schema):
    result: Any = None


class UpdateIn(Body):
    payload: Any = None
    update_id: str | None = Field(None, min_length=1, max_length=128,
                                  description="Makes a repeat the same update (its reply is given again).")
    timeout: float = WAIT


class UpdateOut(Schema):
    update_id: str
    name: str
    result: Any = Field(None, description="The handler's reply (a handler that raised: 422 update_failed).")


class PendingOut(ErrorOut):
    update_id: str = Field(description="Ask again: GET runs/{workflow_id}/updates/{name}/{update_id}.")


def _seconds(timeout: float) -> float:
    return max(0.0, min(timeout, MAX_WAIT, float(weft_settings.API_MAX_WAIT_SECONDS)))


@router.get("runs/{workflow_id}/result", url_name="run_result", response={200: RunOut, 408: ErrorOut, **ERRORS},
            summary="Wait for the run to finish (completed, failed, cancelled or timed out: 200; still open: 408)")
def result(request: HttpRequest, workflow_id: WorkflowId, params: Query[WaitQuery]) -> dict[str, Any]:
    require(request, "view_workflow")
    handle = client.get_handle(workflow_id)
    try:
        handle.result(timeout=_seconds(params.timeout))
    except (WorkflowFailed, WorkflowCancelled, WorkflowTimedOut):
        pass  # finished: the run says how
    except TimeoutError as exc:
        raise ApiError(408, "timeout", str(exc)) from None
    return run_out(Workflow.objects.end_of_chain(handle.refresh()))


@router.post("runs/{workflow_id}/queries/{name}", response={200: QueryOut, **ERRORS},
             summary="Ask a query handler (the run's state is replayed; nothing is written)")
def query(request: HttpRequest, workflow_id: WorkflowId, name: QueryName,
          body: QueryIn | None = None) -> dict[str, Any]:
    require(request, "view_workflow")
    answer = client.get_handle(workflow_id).query(name, *(body.args if body else []))
    return {"result": payload_value(answer)}


@router.post("runs/{workflow_id}/updates/{name}", url_name="run_update",
             response={200: UpdateOut, 408: PendingOut, **ERRORS},
             summary="Send an update and wait for its reply (408: not applied yet, ask again by update_id)")
def update(request: HttpRequest, workflow_id: WorkflowId, name: UpdateName,
           body: UpdateIn | None = None) -> dict[str, Any]:
    require(request, "signal_workflow")
    body = body or UpdateIn.model_validate({})
    sent = client.get_handle(workflow_id).start_update(name, body.payload, update_id=body.update_id)
    return _reply(sent, workflow_id, body.timeout)


@router.get("runs/{workflow_id}/updates/{name}/{update_id}", url_name="run_update_reply",
            response={200: UpdateOut, 408: PendingOut, **ERRORS},
            summary="An update's reply, waiting up to timeout for it (408: still pending)")
def get_update(request: HttpRequest, workflow_id: WorkflowId, name: UpdateName, update_id: UpdateId,
               params: Query[WaitQuery]) -> dict[str, Any]:
    require(request, "view_workflow")
    for what, text in (("workflow_id", workflow_id), ("name", name), ("update_id", update_id)):
        check_text(text, what)  # PostgreSQL refuses NUL even in a WHERE (a 500)
    # The update belongs to one run of the id's chain (a chain that continued as new shares the workflow id).
    record = (WorkflowUpdate.objects.filter(run__workflow_id=workflow_id, name=name, update_id=update_id)
              .order_by("-received_at").first())
    if record is None:
        raise WorkflowNotFound(f"no update {name!r} with update_id {update_id!r} of workflow id {workflow_id!r}")
    return _reply(UpdateHandle(workflow_id, record), workflow_id, params.timeout)


def _reply(sent: UpdateHandle, workflow_id: str, timeout: float) -> dict[str, Any]:
    """The update's reply (a failed handler: 422 update_failed), or 408 with its id if it is still pending."""
    try:
        value = sent.result(_seconds(timeout))
    except TimeoutError as exc:
        raise ApiError(408, "timeout", str(exc), {"update_id": sent.update_id}) from None
    return {"update_id": sent.update_id, "name": sent.name, "result": payload_value(value)}

