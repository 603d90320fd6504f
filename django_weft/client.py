"""The client API: start runs, find them, wait for them, cancel them.

Everything here works inside the caller's ``transaction.atomic()``: a start in a transaction that rolls
back leaves nothing behind, and nothing runs before the caller commits.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from . import clock, transitions
from .codec import decode, encode
from .durations import to_seconds
from .exceptions import (
    InvalidArgument,
    WorkflowAlreadyExists,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowTimedOut,
)
from .models import RunStatus, Workflow
from .registry import get_workflow

TERMINAL_CONFLICT_CHOICES = ("error", "start_new")
MAX_ID_LENGTH = 255


class WorkflowHandle:
    """A reference to one run (``run_id``) of a workflow id."""

    def __init__(self, workflow_id: str, run_id: uuid.UUID) -> None:
        self.workflow_id = workflow_id
        self.run_id = run_id
        self._run: Workflow | None = None

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.workflow_id!r} run={self.run_id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkflowHandle) and other.run_id == self.run_id

    def __hash__(self) -> int:
        return hash(self.run_id)

    def refresh(self) -> Workflow:
        """Reload the run from the database and return it."""
        try:
            self._run = Workflow.objects.get(pk=self.run_id)
        except Workflow.DoesNotExist:
            raise WorkflowNotFound(
                f"run {self.run_id} of workflow {self.workflow_id!r} no longer exists (retention may have "
                "deleted it)"
            ) from None
        return self._run

    @property
    def run(self) -> Workflow:
        return self._run or self.refresh()

    @property
    def status(self) -> str:
        """The run's current status (read from the database on every access)."""
        return self.refresh().status

    def result(self, timeout: float | None = None, poll_interval: float = 0.05) -> Any:
        """Wait for the run to finish and return its result.

        Raises WorkflowFailed, WorkflowCancelled or WorkflowTimedOut for runs that did not complete,
        and TimeoutError if ``timeout`` seconds pass first. Something (a ``weft_maintenance`` process,
        or ``run_maintenance``) must be executing the run.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = poll_interval
        while True:
            run = self.refresh()
            if run.is_finished:
                return _outcome(run)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.run_id} of {self.workflow_id!r} is still {run.status}")
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    def cancel(self, reason: str = "") -> bool:
        """Cancel this run. Returns False if it had already finished."""
        return transitions.cancel(self.run_id, clock.now(), reason)

    def suspend(self, reason: str = "") -> None:
        """Pause this run until :meth:`resume`."""
        transitions.suspend(self.run_id, clock.now(), reason)

    def resume(self) -> None:
        transitions.resume(self.run_id, clock.now())


def _outcome(run: Workflow) -> Any:
    error = run.error or {}
    message = f"run {run.run_id} of {run.workflow_id!r}: {error.get('type')}: {error.get('message')}"
    if run.status == RunStatus.COMPLETED:
        return decode(run.result)
    if run.status == RunStatus.FAILED:
        raise WorkflowFailed(message, run_id=run.run_id, error=error)
    if run.status == RunStatus.CANCELLED:
        raise WorkflowCancelled(message, run_id=run.run_id, error=error)
    raise WorkflowTimedOut(message, run_id=run.run_id, error=error)


def _check_id(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{what} must be a non-empty string of at most {MAX_ID_LENGTH} characters, "
                              f"got {value!r}")


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} must be JSON-serialisable: {exc}") from None


def start(
    workflow: str | Callable[..., Any],
    input: Any = None,
    *,
    workflow_id: str | None = None,
    idempotency_key: str | None = None,
    start_at: datetime | None = None,
    start_after: float | timedelta | None = None,
    execution_timeout: float | timedelta | None = None,
    tags: Iterable[str] = (),
    search_attributes: dict[str, Any] | None = None,
    on_terminal_conflict: str = "error",
) -> WorkflowHandle:
    """Start a run of ``workflow`` (the decorated function or its registered name).

    ``workflow_id`` names the run for your business (default: a new UUID); only one run per id can be
    open at a time, and an id whose last run finished is refused unless
    ``on_terminal_conflict="start_new"``. ``idempotency_key`` makes the call safe to repeat: every call
    with the same key returns the same run. All checks happen before anything is written.
    """
    definition = get_workflow(workflow)
    if workflow_id is not None and idempotency_key is not None:
        raise InvalidArgument("pass workflow_id or idempotency_key, not both: an idempotent start picks its own id")
    if workflow_id is not None:
        _check_id(workflow_id, "workflow_id")
    if idempotency_key is not None:
        _check_id(idempotency_key, "idempotency_key")
    if on_terminal_conflict not in TERMINAL_CONFLICT_CHOICES:
        raise InvalidArgument(f"on_terminal_conflict must be one of {TERMINAL_CONFLICT_CHOICES}, "
                              f"got {on_terminal_conflict!r}")
    if on_terminal_conflict == "start_new" and workflow_id is None:
        raise InvalidArgument('on_terminal_conflict="start_new" needs an explicit workflow_id')
    if start_at is not None and start_after is not None:
        raise InvalidArgument("pass start_at or start_after, not both")
    if start_at is not None and (not isinstance(start_at, datetime) or start_at.tzinfo is None):
        raise InvalidArgument(f"start_at must be an aware datetime, got {start_at!r}")
    tags = list(tags) if not isinstance(tags, str) else None  # a bare string is a mistake, not a tag list
    if tags is None or not all(isinstance(t, str) and t for t in tags):
        raise InvalidArgument("tags must be an iterable of non-empty strings")
    if search_attributes is not None:
        if not isinstance(search_attributes, dict) or not all(isinstance(k, str) for k in search_attributes):
            raise InvalidArgument("search_attributes must be a dict with string keys")
        _check_json(search_attributes, "search_attributes")
    timeout_seconds = (None if execution_timeout is None
                       else to_seconds(execution_timeout, "execution_timeout", allow_zero=False))
    delay_seconds = None if start_after is None else to_seconds(start_after, "start_after", allow_zero=True)
    encoded_input = encode(input, what=f"input of workflow {definition.name!r}")

    now = clock.now()
    begins = start_at or (now + timedelta(seconds=delay_seconds) if delay_seconds else now)
    run = Workflow(
        run_id=uuid.uuid4(),
        workflow_type=definition.name,
        input=encoded_input,
        idempotency_key=idempotency_key,
        tags=tags,
        search_attributes=search_attributes or {},
        runnable_at=begins,
        execution_deadline=None if timeout_seconds is None else begins + timedelta(seconds=timeout_seconds),
        created_at=now,
        updated_at=now,
    )
    run.workflow_id = workflow_id or str(run.run_id)
    delayed_until = begins if begins > now else None

    if idempotency_key is not None:
        return _start_idempotent(run, delayed_until)
    # A savepoint keeps a caller's transaction usable after a lost race; on its own, start() needs none.
    in_callers_transaction = transaction.get_connection().in_atomic_block
    with transaction.atomic():
        if workflow_id is not None:
            previous = Workflow.objects.latest_for(workflow_id).first()
            if previous is not None:
                if not previous.is_finished:
                    raise WorkflowAlreadyExists(
                        f"workflow id {workflow_id!r} already has an open run ({previous.run_id}, "
                        f"{previous.status}); signal it, cancel it, or use another id"
                    )
                if on_terminal_conflict == "error":
                    raise WorkflowAlreadyExists(
                        f"workflow id {workflow_id!r} was already used by run {previous.run_id} "
                        f"({previous.status}); pass on_terminal_conflict=\"start_new\" to start it again"
                    )
                run.restarted_from = previous
        try:
            with transaction.atomic(savepoint=in_callers_transaction):
                transitions.insert_run(run, delayed_until=delayed_until)
        except IntegrityError:
            raise WorkflowAlreadyExists(
                f"workflow id {workflow_id!r} was started concurrently by another caller"
            ) from None
    return WorkflowHandle(run.workflow_id, run.run_id)


def _start_idempotent(run: Workflow, delayed_until: datetime | None) -> WorkflowHandle:
    key = run.idempotency_key
    by_key = Workflow.objects.filter(idempotency_key=key).only("workflow_id", "run_id", "workflow_type")
    with transaction.atomic():
        existing = by_key.first()
        if existing is None:
            try:
                with transaction.atomic():
                    transitions.insert_run(run, delayed_until=delayed_until)
                return WorkflowHandle(run.workflow_id, run.run_id)
            except IntegrityError:
                # Another caller inserted the same key first; the unique index made us wait for its
                # commit, so its row is visible now.
                existing = by_key.first()
                if existing is None:
                    raise
        if existing.workflow_type != run.workflow_type:
            raise InvalidArgument(
                f"idempotency key {key!r} already started a {existing.workflow_type!r} run, not "
                f"{run.workflow_type!r}"
            )
        return WorkflowHandle(existing.workflow_id, existing.run_id)


def get_handle(workflow_id: str, run_id: uuid.UUID | str | None = None) -> WorkflowHandle:
    """A handle to the run ``run_id`` of ``workflow_id``, or to its latest run."""
    runs = Workflow.objects.latest_for(workflow_id)
    if run_id is not None:
        try:
            runs = runs.filter(pk=uuid.UUID(str(run_id)))
        except ValueError:
            raise InvalidArgument(f"run_id must be a UUID, got {run_id!r}") from None
    run = runs.only("run_id", "workflow_id").first()
    if run is None:
        raise WorkflowNotFound(f"no run of workflow id {workflow_id!r}"
                               + (f" with run id {run_id}" if run_id else ""))
    return WorkflowHandle(run.workflow_id, run.run_id)


def cancel(workflow_id: str, reason: str = "") -> bool:
    """Cancel the open run of ``workflow_id``. Returns False if its latest run had already finished."""
    return get_handle(workflow_id).cancel(reason)
