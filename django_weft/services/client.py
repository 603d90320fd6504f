"""The client API: start runs, find them, wait for them, cancel them.

Everything here works inside the caller's ``transaction.atomic()``: a start in a transaction that rolls
back leaves nothing behind, and nothing runs before the caller commits.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, transaction

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.durations import to_seconds
from django_weft.common.registry import get_workflow
from django_weft.exceptions import (
    InvalidArgument,
    WorkflowAlreadyExists,
    WorkflowCancelled,
    WorkflowClosed,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowTimedOut,
)
from django_weft.models import RunStatus, Workflow
from django_weft.runtime.activities import RetryPolicy
from django_weft.services import (
    flow_starts,
    liveness,
    pending_activities,
    published,
    queries,
    result_waiters,
    step_controls,
)
from django_weft.services.pending_activities import PendingActivity
from django_weft.store import (
    forks,
    inbox,
    lock_retries,
    repairs,
    signal_statement,
    spent_keys,
    terminations,
    transitions,
)
from django_weft.store.starts import check_id as _check_id
from django_weft.store.starts import check_opaque_id, prepare_run
from django_weft.store.starts import check_reason as _check_reason

if TYPE_CHECKING:
    from django_weft.services.updates import UpdateHandle

TERMINAL_CONFLICT_CHOICES = ("error", "start_new")

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
    def version(self) -> int:
        """The version of the workflow's code the run started on (and executes with)."""
        return self.run.version

    @property
    def failure_category(self) -> str:
        """Why a failed, timed-out or cancelled run ended: application, timeout, cancellation, resource,
        system; empty where it does not apply."""
        return self.refresh().failure_category

    @property
    def status(self) -> str:
        """The run's current status (read from the database on every access)."""
        return self.refresh().status

    @property
    def cancel_requested(self) -> bool:
        """True once the run's cancel was requested (it stays true after it ended); while the run is still open,
        its code is seeing weft.CancelledError and cleaning up (read from the database on every access)."""
        return self.refresh().cancel_requested_at is not None

    def result(self, timeout: float | timedelta | None = None, poll_interval: float = 0.05) -> Any:
        """Wait for the run to finish and return its result.

        Raises WorkflowFailed, WorkflowCancelled or WorkflowTimedOut for runs that did not complete,
        and TimeoutError if ``timeout`` seconds pass first. Something (a ``weft_maintenance`` process,
        or ``run_maintenance``) must be executing the run. Inside ``django_weft.testing.WeftTestEnv``,
        without a timeout, the test environment drives the run itself and raises at once, naming what
        the run waits for, if it cannot finish without more time passing or an outside event.
        """
        if timeout is not None:
            timeout = to_seconds(timeout, "timeout", allow_zero=True)
        poll_interval = to_seconds(poll_interval, "poll_interval", allow_zero=False)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = poll_interval
        waiter = result_waiters.waiter_here() if timeout is None else None
        while True:
            run = Workflow.objects.end_of_chain(self.refresh())  # a run that continued as new: its successor
            if run.is_finished:
                return _outcome(run)
            if waiter is not None:
                waiter(self)  # moves the run on; raises if it cannot finish
                run = Workflow.objects.end_of_chain(self.refresh())
                if run.is_finished:
                    return _outcome(run)
                raise TimeoutError(_still_open(self, run))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(_still_open(self, run))
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)

    def signal(self, name: str, payload: Any = None, *, signal_id: str | None = None) -> bool:
        """Send a signal to this run; see :func:`signal`."""
        data = check_signal(name, payload, signal_id)
        return lock_retries.retried("signal", lambda: self._deliver(name, data, signal_id))

    def _deliver(self, name: str, data: bytes, signal_id: str | None) -> bool:
        with transaction.atomic():
            run = Workflow.objects.select_for_update().filter(pk=self.run_id).first()
            if run is None:
                raise WorkflowNotFound(f"run {self.run_id} of workflow {self.workflow_id!r} does not exist")
            for _ in range(3):  # the chain's open run takes it (it may continue meanwhile: follow again)
                if run.status != RunStatus.CONTINUED:
                    break
                tail = Workflow.objects.end_of_chain(run)
                run = Workflow.objects.select_for_update().filter(pk=tail.pk).first() or run
            if run.is_finished:
                raise _closed(run, name)
            return inbox.deliver_signal(run, name, data, signal_id, clock.now())

    def _current_run_id(self) -> uuid.UUID:
        """This run, or, if it continued as new, the run its chain has reached."""
        return Workflow.objects.end_of_chain(self.refresh()).pk

    def query(self, name: str, *args: Any) -> Any:
        """Ask the run's query handler ``name`` (``ctx.set_query_handler``) with ``args``: the run's state is
        rebuilt by replaying its journal, executing and writing nothing. Works on waiting, running and
        finished runs (of a chain that continued as new: its current run). Raises QueryNotFound (naming the
        handlers its code registers) or QueryFailed."""
        _check_id(name, "a query name")
        return queries.query(Workflow.objects.end_of_chain(self.refresh()), name, args)

    def pending_activities(self) -> list[PendingActivity]:
        """The run's activity attempts in flight (of a chain that continued as new: its current run's): executing
        for over a second, waiting for an async completion, for a retry backoff or for a slot, each with its
        attempt, start, executor, timeout, next retry, last error and last heartbeat (time and details)."""
        return pending_activities.pending_activities(Workflow.objects.end_of_chain(self.refresh()))

    # --- step controls (services.step_controls): each refused with TransitionNotAllowed when it no longer applies

    def fire_timer_now(self, seq: int, *, requested_by: str = "") -> None:
        """Fire the sleep, retry backoff or wait timeout step ``seq`` waits on now."""
        step_controls.fire_timer_now(self._chain_run(), seq, requested_by=requested_by)

    def reset_activity_attempts(self, seq: int, *, requested_by: str = "") -> None:
        """The activity waiting at step ``seq`` starts over with its retry policy (its next attempt counts as 1)."""
        step_controls.reset_attempts(self._chain_run(), seq, requested_by=requested_by)

    def pause_activity_retries(self, seq: int, *, requested_by: str = "") -> None:
        """Hold the next retry of the activity at step ``seq`` until unpaused."""
        step_controls.pause_retries(self._chain_run(), seq, requested_by=requested_by)

    def unpause_activity_retries(self, seq: int, *, requested_by: str = "") -> None:
        step_controls.unpause_retries(self._chain_run(), seq, requested_by=requested_by)

    def set_activity_options(self, seq: int, *, retry: RetryPolicy | dict | None = None,
                             timeout: float | timedelta | None = None,
                             schedule_to_close_timeout: float | timedelta | None = None,
                             requested_by: str = "") -> None:
        """Replace the retry policy or timeouts of the activity waiting at step ``seq`` (from its next attempt)."""
        step_controls.set_activity_options(self._chain_run(), seq, retry=retry, timeout=timeout,
                                           schedule_to_close_timeout=schedule_to_close_timeout,
                                           requested_by=requested_by)

    def _chain_run(self) -> Workflow:
        return Workflow.objects.end_of_chain(self.refresh())

    def get_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """The latest value the run (or its continue-as-new chain) set for event ``key`` with ``ctx.set_event``,
        waiting until it is set: None if ``timeout`` seconds pass first, or the run ends without setting it. Woken
        by NOTIFY on PostgreSQL; elsewhere it polls."""
        seconds = None if timeout is None else to_seconds(timeout, "timeout", allow_zero=True)
        return published.get_event(self.run_id, key, seconds)

    def events(self) -> dict[str, Any]:
        """Every event key the run (or its chain) set, with its latest value (waits for nothing)."""
        return published.events(self.run_id)

    def read_stream(self, key: str, start: int = 0, *, timeout: float | timedelta | None = None) -> Iterator[Any]:
        """The values the run writes to stream ``key`` (``ctx.write_stream``), in order from the ``start``-th,
        waiting for each, until the run closes the stream (``ctx.close_stream``) or its chain ends. With
        ``timeout``, TimeoutError when that many seconds pass without a new value."""
        seconds = None if timeout is None else to_seconds(timeout, "timeout", allow_zero=True)
        return published.read_stream(self.run_id, key, start, timeout=seconds)

    def update(self, name: str, payload: Any = None, *, timeout: float | timedelta | None = None,
               update_id: str | None = None) -> Any:
        """Send update ``name`` (``ctx.set_update_handler``) and wait for the handler's reply.

        Validated in this call against the run's replayed state (UpdateRejected: no such handler, or its
        validator refused; nothing is written), then applied by the run in arrival order. Raises UpdateFailed
        if the handler raised (the run goes on), WorkflowClosed if the run finished, TimeoutError after
        ``timeout`` seconds (the update still applies). ``update_id`` makes a repeat the same update (its
        reply is returned again) for the life of the run."""
        from django_weft.services.updates import check_timeout

        check_timeout(timeout)  # before anything is stored
        return self.start_update(name, payload, update_id=update_id, _waiting=True).result(timeout)

    def start_update(self, name: str, payload: Any = None, *, update_id: str | None = None,
                     _waiting: bool = False) -> UpdateHandle:
        """Send update ``name`` without waiting for its reply: an UpdateHandle (``update_id``, ``result()``)."""
        from django_weft.services.updates import send

        return send(self.run_id, name, payload, update_id, waiting=_waiting)

    def cancel(self, reason: str = "") -> bool:
        """Request the cancel of this run (the chain's run, if it continued as new): the durable call its code
        waits in (or its next one) raises weft.CancelledError and running activities are asked to stop; its code
        may clean up in ``with ctx.cleanup():`` for its ``cleanup_timeout``, then it is terminated. Uncaught, the
        run ends ``cancelled``. A run that has not started, or is suspended, is cancelled at once. Returns False if
        nothing changed: the run had finished, or its cancel was requested before (the first reason stands).
        ``terminate()`` is the hard stop."""
        return transitions.cancel(self._current_run_id(), clock.now(), _check_reason(reason))

    def terminate(self, reason: str = "") -> bool:
        """End this run (the chain's run, if it continued as new) at once, wherever it is: ``timed_out`` with
        ``termination_reason="terminated"``. Returns False if it had finished."""
        return terminations.terminate(self.run_id, clock.now(), _check_reason(reason))

    def fork(self, from_step: int, *, workflow_id: str | None = None) -> WorkflowHandle:
        """Start a new run of this run's type and version, with its input, that keeps a copy of its journal
        before step ``from_step`` and executes from there; see :func:`django_weft.store.forks.fork`."""
        run = forks.fork(self.run_id, from_step, clock.now(), workflow_id=workflow_id)
        return WorkflowHandle(run.workflow_id, run.run_id)

    def suspend(self, reason: str = "") -> None:
        """Pause this run until :meth:`resume`."""
        repairs.suspend(self._current_run_id(), clock.now(), _check_reason(reason))

    def resume(self) -> None:
        repairs.resume(self._current_run_id(), clock.now())


def _still_open(handle: WorkflowHandle, run: Workflow) -> str:
    message = f"run {handle.run_id} of {handle.workflow_id!r} is still {run.status}"
    if run.wait_reason:
        message += f" ({run.wait_reason})"
    try:
        hint = liveness.stalled_hint()
    except DatabaseError:  # a hint is not worth a second error (a broken connection, a missing table)
        hint = ""
    return f"{message}; {hint}" if hint else message


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


def delayed_until(run: Workflow) -> datetime | None:
    """When a delayed start begins (a queued run has none: its admit_at holds its start time)."""
    return run.runnable_at if run.runnable_at is not None and run.runnable_at > run.created_at else None


def check_terminal_conflict(on_terminal_conflict: str, workflow_id: str | None) -> None:
    if on_terminal_conflict not in TERMINAL_CONFLICT_CHOICES:
        raise InvalidArgument(f"on_terminal_conflict must be one of {TERMINAL_CONFLICT_CHOICES}, "
                              f"got {on_terminal_conflict!r}")
    if on_terminal_conflict == "start_new" and workflow_id is None:
        raise InvalidArgument('on_terminal_conflict="start_new" needs an explicit workflow_id')


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
    queue: str | None = None,
    concurrency_key: str | None = None,
    priority: int = 0,
    debounce: float | timedelta | None = None,
    on_conflict: str = "queue",
) -> WorkflowHandle:
    """Start a run of ``workflow`` (the decorated function or its registered name).

    ``workflow_id`` names the run for your business (default: a new UUID); only one run per id can be
    open at a time, and an id whose last run finished is refused unless
    ``on_terminal_conflict="start_new"``. ``idempotency_key`` makes the call safe to repeat: every call
    with the same key returns the same run (IdempotencyKeyPurged once that run was purged). All checks happen
    before anything is written.

    Flow control: on ``queue`` (of WEFT_QUEUES; default: the type's ``@weft.workflow(queue=)``) the run is
    ``queued`` until its queue admits it, lower ``priority`` first, its ``concurrency_key`` counted by the queue's
    ``concurrency_per_key``. ``debounce`` (with an idempotency_key or a concurrency_key): a start within the
    window of a run still waiting it out gives that run this input and starts its window again.
    ``on_conflict`` for a start whose concurrency_key has open runs: "queue" behind them, "skip" (return the
    oldest), "replace" (cancel them, then queue).
    """
    definition = get_workflow(workflow)
    check_terminal_conflict(on_terminal_conflict, workflow_id)
    window = flow_starts.check_flow_options(debounce=debounce, on_conflict=on_conflict, workflow_id=workflow_id,
                                            idempotency_key=idempotency_key, concurrency_key=concurrency_key)
    run = prepare_run(definition, input, workflow_id=workflow_id, idempotency_key=idempotency_key,
                      start_at=start_at, start_after=start_after, execution_timeout=execution_timeout,
                      tags=tags, search_attributes=search_attributes, queue=queue,
                      concurrency_key=concurrency_key, priority=priority)

    def insert() -> bool:
        return insert_new(run, workflow_id, on_terminal_conflict,
                          lambda: transitions.insert_run(run, delayed_until=delayed_until(run)))

    if window is None and on_conflict == "queue":
        insert()
        return WorkflowHandle(run.workflow_id, run.run_id)
    workflow_id_got, run_id, _ = flow_starts.start_with_flow_options(run, debounce=window, on_conflict=on_conflict,
                                                                     insert=insert)
    return WorkflowHandle(workflow_id_got, run_id)


def insert_new(run: Workflow, workflow_id: str | None, on_terminal_conflict: str, insert: Callable[[], Any]) -> bool:
    """Write a prepared run with ``insert`` as start() does: after the checks of its workflow id, or its
    idempotency key. Returns False when the key had already started a run (``run`` then takes that run's ids
    and nothing was written)."""
    if run.idempotency_key is not None:
        return lock_retries.retried("start", lambda: _insert_idempotent(run, insert))
    in_callers_transaction = transaction.get_connection().in_atomic_block
    if workflow_id is None and not in_callers_transaction and _one_statement(run):
        # A new id and nothing but the run row to write: its INSERT is atomic on its own, and a BEGIN and a
        # COMMIT would be two more round trips.
        insert()
        return True
    # A savepoint keeps a caller's transaction usable after a lost race; on its own, start() needs none.
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
        concurrently = WorkflowAlreadyExists(f"workflow id {workflow_id!r} was started concurrently by another caller")
        try:
            with transaction.atomic(savepoint=in_callers_transaction):
                insert()
        except IntegrityError:
            raise concurrently from None
        # The check above reads without a lock, and the unique index only keeps two runs of an id from being
        # open together: a run of the id that another caller started, and that finished, after that read is
        # visible now (each statement reads what is committed) and makes this start a conflict too.
        if workflow_id is not None and run.restarted_from is None and (
                Workflow.objects.filter(workflow_id=workflow_id).exclude(pk=run.pk).exists()):
            raise concurrently
    return True


def _one_statement(run: Workflow) -> bool:
    """Does inserting ``run`` write its row and nothing else (no attribute rows, no delayed-start timer)?"""
    return not run.search_attributes and delayed_until(run) is None


def _insert_idempotent(run: Workflow, insert: Callable[[], Any]) -> bool:
    key = run.idempotency_key
    assert key is not None  # called for starts with a key only
    by_key = Workflow.objects.filter(idempotency_key=key).only("workflow_id", "run_id", "workflow_type")
    with transaction.atomic():
        existing = by_key.first()
        if existing is None:
            spent_keys.refuse_if_spent(key)
            try:
                with transaction.atomic():
                    insert()
                return True
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
        run.workflow_id, run.run_id = existing.workflow_id, existing.run_id
        return False


# --- signals -----------------------------------------------------------------------------------------

MAX_SIGNAL_ID_BYTES = 128
START_SIGNAL_PREFIX = "start-idem:"


def check_signal(name: Any, payload: Any, signal_id: Any) -> bytes:
    _check_id(name, "a signal name")
    if signal_id is not None:
        check_opaque_id(signal_id, "signal_id", max_bytes=MAX_SIGNAL_ID_BYTES)
    return encode(payload, what=f"payload of signal {name!r}")


def _closed(run: Workflow, name: str) -> WorkflowClosed:
    return WorkflowClosed(
        f"workflow {run.workflow_id!r} is {run.status} (run {run.run_id}); it cannot receive signal {name!r}"
    )


def signal(workflow_id: str, name: str, payload: Any = None, *, signal_id: str | None = None) -> bool:
    """Send signal ``name`` to the open run of ``workflow_id``; durable when this returns (or, inside a
    transaction, when it commits).

    Signals wait until the workflow consumes them, in arrival order. With ``signal_id``, a repeat of the
    same (run, name, signal_id) is accepted but stored once, for the life of the run: returns False for
    such a duplicate. Raises WorkflowNotFound for an unknown id, WorkflowClosed if its run finished.
    """
    _check_id(workflow_id, "workflow_id")
    data = check_signal(name, payload, signal_id)
    return lock_retries.retried("signal", lambda: _deliver_signal(workflow_id, name, data, signal_id))


def _deliver_signal(workflow_id: str, name: str, data: bytes, signal_id: str | None) -> bool:
    if signal_id is None and signal_statement.deliver_in_one_statement(workflow_id, name, data, clock.now()):
        return True
    with transaction.atomic():
        run = inbox.lock_open_run(workflow_id)
        if run is None:
            latest = Workflow.objects.latest_for(workflow_id).first()
            if latest is None:
                raise WorkflowNotFound(f"no workflow with id {workflow_id!r}; nothing to signal")
            raise _closed(latest, name)
        return inbox.deliver_signal(run, name, data, signal_id, clock.now())


def get_handle(workflow_id: str, run_id: uuid.UUID | str | None = None) -> WorkflowHandle:
    """A handle to the run ``run_id`` of ``workflow_id``, or to its latest run."""
    _check_id(workflow_id, "workflow_id")
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
    """Request the cancel of the open run of ``workflow_id`` (see :meth:`WorkflowHandle.cancel`). Returns False if
    nothing changed: its latest run had finished, or its cancel was requested before."""
    _check_reason(reason)
    return get_handle(workflow_id).cancel(reason)


def terminate(workflow_id: str, reason: str = "") -> bool:
    """Terminate the open run of ``workflow_id`` (see :meth:`WorkflowHandle.terminate`). Returns False if its
    latest run had already finished."""
    _check_reason(reason)
    return get_handle(workflow_id).terminate(reason)
