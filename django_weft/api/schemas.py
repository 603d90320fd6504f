"""Request and response bodies. The OpenAPI document is written from these, so what it says is what the
routes check and return. Payloads (``input``, ``payload``, ``result``) are any JSON value; they are stored as
msgpack like every payload, and a result holding a value JSON has no type for is shown as :func:`as_json`
writes it."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from ninja import Path, Schema
from pydantic import ConfigDict, Field, model_validator

from django_weft.common import privacy
from django_weft.common.codec import decode
from django_weft.common.jsonable import TOO_DEEP, as_json  # noqa: F401  (the API's names for them)
from django_weft.models import StepAttempt, Workflow, WorkflowStep

ID = Field(min_length=1, max_length=255)


def _segment(what: str, example: str, note: str = "") -> Any:
    """A path parameter: any text, sent percent-encoded as one segment (django_weft.api.routing)."""
    return Path(description=f"{what}, percent-encoded as one path segment (a '/' as %2F){note}.", example=example)


# The path parameters: the example says that a "/" is fine (schemathesis then generates %2F too).
WorkflowId = Annotated[str, _segment("The workflow id", "order/42",
                                     "; an id that is a route of its own (count) with a letter encoded: %63ount")]
SignalName = Annotated[str, _segment("The signal's name", "payment/received")]
QueryName = Annotated[str, _segment("The query handler's name", "cart/items")]
UpdateName = Annotated[str, _segment("The update handler's name", "cart/add")]
UpdateId = Annotated[str, _segment("The update's id", "mail/7731")]
ScheduleId = Annotated[str, _segment("The schedule id", "team/nightly")]
QueueName = Annotated[str, _segment("The queue's name (of WEFT_QUEUES)", "emails")]
TypeName = Annotated[str, _segment("The workflow type's registered name", "shop.checkout")]
EventKey = Annotated[str, _segment("The event's key", "progress")]
StreamKey = Annotated[str, _segment("The stream's key", "log")]


class ErrorOut(Schema):
    error: str
    code: str


class Body(Schema):
    """A request body: a JSON object of the fields the document names. (ninja's Schema reads the attributes of
    whatever it is given, so a list would pass as an object of all defaults; and a misspelt field, ignored, would
    look applied: ``idempotencyKey`` started a new run at each repeat.)"""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        if not isinstance(getattr(value, "_obj", value), dict):  # ninja may hand it over wrapped
            raise ValueError("must be a JSON object")
        return value


# The error responses every route may give (its own success status beside them in ``response=``).
ERRORS: dict[int, type[Schema]] = {status: ErrorOut for status in (400, 401, 403, 404, 409, 413, 422)}


class StartIn(Body):
    workflow: str = Field(min_length=1, max_length=200, description="The registered workflow name.")
    input: Any = None
    workflow_id: str | None = Field(None, min_length=1, max_length=255)
    idempotency_key: str | None = Field(None, min_length=1, max_length=255)
    start_after: float | None = Field(None, ge=0, description="Seconds to wait before the run starts.")
    execution_timeout: float | None = Field(None, gt=0, description="Seconds the run may take in all.")
    tags: list[str] = Field(default_factory=list, max_length=64)
    search_attributes: dict[str, Any] = Field(default_factory=dict)
    on_terminal_conflict: Literal["error", "start_new"] = "error"
    queue: str | None = Field(None, min_length=1, max_length=100,
                              description="A queue of WEFT_QUEUES: the run waits, queued, until admitted.")
    concurrency_key: str | None = Field(None, min_length=1, max_length=255,
                                        description="Counted by the queue's concurrency_per_key and rate_per_key.")
    priority: int = Field(0, ge=-(2**31 - 1), le=2**31 - 1, description="Lower is admitted first.")


class FlowStartIn(StartIn):
    debounce: float | None = Field(None, gt=0, description="Seconds: a start within the window of a run still "
                                                           "waiting it out replaces that run's input.")
    on_conflict: Literal["queue", "skip", "replace"] = Field(
        "queue", description="A start to a concurrency_key with open runs: queue behind them, skip (answer the "
                             "oldest), replace (cancel them).")


class StartOrSignalIn(StartIn):
    """The start fields (for a run that has to be started) and the signal; with ``idempotency_key`` instead of
    ``signal_id``, the key names the run and its first signal."""

    signal: str = Field(min_length=1, max_length=255, description="The signal's name.")
    payload: Any = None
    signal_id: str | None = Field(None, min_length=1, max_length=128,
                                  description="With workflow_id: concurrent callers converge on one run, one signal.")


class QueueOut(Schema):
    name: str
    limits: dict[str, Any] = Field(description="In force: the setting's with the overrides over them.")
    overrides: dict[str, Any] = Field(description="Set by an operator at run time.")
    backlog: int = Field(description="Queued runs.")
    ready: int = Field(description="Queued runs whose start time has come.")
    admitted: int = Field(description="Admitted runs still open (what concurrency counts).")
    oldest_wait_seconds: float | None
    rate_limited: int = Field(description="Ready runs the last admission pass held back for a rate limit.")
    admitted_total: int
    paused_types: list[str]


class QueueLimitsIn(Body):
    concurrency: int | None = Field(None, ge=1)
    concurrency_per_key: int | None = Field(None, ge=1)
    rate: str | None = Field(None, max_length=32, description='"N/s", "N/m" or "N/h".')
    rate_per_key: str | None = Field(None, max_length=32)


class StartOut(Schema):
    workflow_id: str
    run_id: uuid.UUID
    status: str


class StartOrSignalOut(StartOut):
    outcome: Literal["started", "signalled"] = Field(description="started: 201; signalled: 200.")
    delivered: bool = Field(description="False when the signal repeated one the run has (nothing new stored).")


class ForkIn(Body):
    from_step: int = Field(ge=1, le=2**31 - 1, description="The journal position to execute from (steps before it "
                                                            "are kept).")
    workflow_id: str | None = Field(None, min_length=1, max_length=255, description="Default: one derived from "
                                                                                    "the source's.")
    run_id: uuid.UUID | None = Field(None, description="The run to fork (default: the latest of the workflow id).")


class RunOut(Schema):
    workflow_id: str
    run_id: uuid.UUID
    workflow_type: str
    version: int
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
    failure_category: str
    termination_reason: str
    wait_reason: str
    cancel_requested_at: dt.datetime | None = Field(
        description="When its cancel was requested: while the run is open, its code is cleaning up.")
    queue: str = Field(description='Its queue ("" for none).')
    concurrency_key: str | None
    priority: int
    admitted_at: dt.datetime | None = Field(description="When its queue admitted it.")
    tags: list[str]
    search_attributes: dict[str, Any]
    parent_run_id: uuid.UUID | None
    restarted_from: uuid.UUID | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class AttemptOut(Schema):
    attempt: int
    outcome: str = Field(description="completed, failed, timed_out, lost (with its executor), cancelled")
    executor: str
    started_at: dt.datetime | None = Field(description="Null for a lost attempt: its executor died unheard.")
    finished_at: dt.datetime
    error: dict[str, Any] | None = None


class StepOut(Schema):
    seq: int
    kind: str
    name: str
    status: str
    attempt: int
    failure_category: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: Any = None
    error: dict[str, Any] | None = None
    attempts: list[AttemptOut] = Field(description="The step's attempts when it took more than one (failed and "
                                                   "retried, lost with their executor); empty otherwise.")


class PendingActivityOut(Schema):
    seq: int
    activity: str
    attempt: int = Field(description="The attempt running or waiting (waiting for a retry: the one that begins next).")
    state: Literal["running", "waiting_for_completion", "waiting_for_retry", "retries_paused", "waiting_for_slot",
                   "slot_granted"]
    started_at: dt.datetime | None
    executor: str = Field(description="The executor running it (running attempts).")
    timeout_at: dt.datetime | None
    next_retry_at: dt.datetime | None
    last_error: dict[str, Any] | None = None
    last_heartbeat_at: dt.datetime | None
    heartbeat_details: Any = None
    executor_last_seen: dt.datetime | None = Field(
        None, description="Running attempts: when the executor's process last renewed its heartbeat row.")
    executor_silent: bool | None = Field(
        None, description="Running attempts: that process has not been seen for two heartbeats (killed or stalled); "
                          "the run is taken over once its lease runs out. Null when no row tells.")


class PendingActivitiesOut(Schema):
    pending_activities: list[PendingActivityOut] = Field(
        description="Attempts executing for over a second, waiting for an async completion, a retry or a slot.")


class StepPage(Schema):
    results: list[StepOut]
    next: str | None = Field(description="The cursor of the next page (pass it as ?cursor=), null on the last.")


class RunPage(Schema):
    results: list[RunOut]
    next: str | None = Field(description="The cursor of the next page (pass it as ?cursor=), null on the last.")


class CountRow(Schema):
    key: Any = Field(description="The group's value (a status, a type, a category, a version, an attribute value).")
    count: int


class CountOut(Schema):
    counts: list[CountRow] = Field(description="The groups, largest first.")
    total: int


class SignalIn(Body):
    payload: Any = None
    signal_id: str | None = Field(None, min_length=1, max_length=128)


class SignalOut(Schema):
    workflow_id: str
    run_id: uuid.UUID
    delivered: bool = Field(description="False when signal_id was delivered before (nothing new was stored).")


class ReasonIn(Body):
    reason: str = Field("", max_length=1000)


class ChangedOut(Schema):
    workflow_id: str
    run_id: uuid.UUID
    status: str
    changed: bool = Field(description="False when nothing changed: the run had already ended (or, for a cancel, its "
                                      "cancel was requested before).")
    cancel_requested: bool = Field(description="A cancel was requested: the run's code sees it and may clean up "
                                               "before the run ends cancelled.")


# What stands for a part of a value nested deeper than MAX_DEPTH (stored before the limit was enforced).
def payload(data: bytes | memoryview | None) -> Any:
    """A stored payload as JSON, or "hidden" for a caller without django_weft.view_payloads (None stays None)."""
    if data is None:
        return None
    return privacy.shown(lambda: as_json(decode(data)))


def payload_value(value: Any) -> Any:
    """A decoded payload (a query's answer, heartbeat details) as JSON, or "hidden"."""
    return privacy.shown(lambda: as_json(value))


def run_out(run: Workflow) -> dict[str, Any]:
    return {
        "workflow_id": run.workflow_id, "run_id": run.run_id, "workflow_type": run.workflow_type,
        "version": run.version, "status": run.status,
        "result": payload(run.result), "error": run.error, "failure_category": run.failure_category,
        "termination_reason": run.termination_reason, "wait_reason": run.wait_reason,
        "cancel_requested_at": run.cancel_requested_at,
        "queue": run.queue, "concurrency_key": run.concurrency_key, "priority": run.priority,
        "admitted_at": run.admitted_at,
        "tags": list(run.tags or []), "search_attributes": as_json(run.search_attributes or {}),
        "parent_run_id": run.parent_id, "restarted_from": run.restarted_from_id,
        "created_at": run.created_at, "started_at": run.started_at, "finished_at": run.finished_at,
    }


def step_out(step: WorkflowStep, attempts: list[StepAttempt]) -> dict[str, Any]:
    return {
        "seq": step.seq, "kind": step.kind, "name": step.name, "status": step.status, "attempt": step.attempt,
        "failure_category": step.failure_category, "started_at": step.started_at, "finished_at": step.finished_at,
        "result": payload(step.result), "error": step.error,
        "attempts": [{"attempt": a.attempt, "outcome": a.outcome, "executor": a.executor, "started_at": a.started_at,
                      "finished_at": a.finished_at, "error": a.error} for a in attempts],
    }
