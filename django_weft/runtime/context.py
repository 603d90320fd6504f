"""The replay context handed to workflow functions.

Each durable operation takes the next position (``seq``) in the run's journal. If the journal has an
entry there, the operation returns what was recorded (after checking that the code still asks for the
same kind and name); the first operation without an entry does the work and records its entry (committed
with the run's next write, and always before the next side effect), and an operation that must wait
commits the run as parked and raises :class:`Suspend`.
"""

from __future__ import annotations

import contextvars
import logging
import random as _random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn, ParamSpec, TypeVar

from django.db import DatabaseError, connections

from .. import clock, journal, transitions
from ..activities import (
    ActivityDefinition,
    ActivityInfo,
    CompleteAsync,
    body_of,
    current_activity,
    definition_of,
)
from ..codec import decode, encode
from ..durations import check_moment, to_seconds
from ..exceptions import (
    ActivityError,
    ActivityTimeout,
    ChildWorkflowFailed,
    FencingError,
    InvalidArgument,
    NonDeterminismError,
    PayloadError,
    WaitTimeout,
    WorkflowAlreadyExists,
)
from ..models import (
    AsyncActivity,
    AsyncStatus,
    ParentClosePolicy,
    RunStatus,
    Signal,
    StepKind,
    StepStatus,
    Timer,
    TimerPurpose,
    Workflow,
    WorkflowStep,
)
from ..storable import check_text
from ..tokens import make_task_token
from .errors import StopExecution, Suspend, error_dict, is_transient

logger = logging.getLogger("django_weft.executor")

P = ParamSpec("P")
R = TypeVar("R")

# Error messages in log lines are cut to this many characters (the journal keeps the whole message).
LOGGED_MESSAGE_CHARS = 500


def _in_callers_transaction() -> bool:
    """True when the run executes inside a transaction someone else opened (the executor opens none
    around user code): what an activity writes or reads then belongs to that transaction."""
    return any(conn.in_atomic_block for conn in connections.all(initialized_only=True))


@dataclass(frozen=True)
class ChildHandle:
    """A child run started by ``ctx.start_child``; pass it to ``ctx.wait_child``."""

    workflow_id: str
    run_id: uuid.UUID


class Context:
    """What a workflow function receives as ``ctx``."""

    def __init__(
        self,
        claim: transitions.Claim,
        steps: dict[int, WorkflowStep],
        timers: dict[int, Timer],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self._claim = claim
        self._journal = steps
        self._timers = timers
        self._should_stop = should_stop
        self._seq = 0
        # Signals consumed by this execution whose consumption is not committed yet.
        self._consumed_signals: set[int] = set()
        # The identity of the activity attempt run last (did its body hand its task token out?).
        self._last_info: ActivityInfo | None = None

    # --- identity ------------------------------------------------------------------------------------

    @property
    def workflow_id(self) -> str:
        return self._claim.run.workflow_id

    @property
    def run_id(self) -> uuid.UUID:
        return self._claim.run.run_id

    @property
    def is_replaying(self) -> bool:
        """True while the code is re-walking operations already in the journal."""
        return self._seq < len(self._journal)

    # --- journal plumbing ----------------------------------------------------------------------------

    def _next(self, kind: str, name: str) -> tuple[int, WorkflowStep | None]:
        self._seq += 1
        seq = self._seq
        step = self._journal.get(seq)
        if step is not None and (step.kind != kind or step.name != name):
            raise NonDeterminismError(
                f"step {seq} of run {self.run_id}: the journal recorded {step.kind} {step.name!r} but the "
                f"workflow code now asks for {kind} {name!r}; workflow code must make the same durable "
                "calls in the same order on every replay (deploy changes as a new workflow name)"
            )
        return seq, step

    def _before_new_work(self, *, side_effects: bool) -> None:
        """Check before doing anything not yet recorded.

        Stops if the worker is stopping or lost the run. Before work with side effects (an activity, a
        side effect function) the deferred writes commit, so nothing touches the world while an earlier
        step's result could still be lost.
        """
        if self._claim.lost:
            raise StopExecution(release=False)
        if self._should_stop():
            raise StopExecution(release=True)
        if side_effects and self._claim.deferred:
            self._commit()

    def _commit(self, writes: Sequence[journal.JournalWrite] = ()) -> None:
        try:
            transitions.commit(self._claim, clock.now(), writes)
        except FencingError:
            raise StopExecution(release=False) from None
        except DatabaseError as exc:
            raise self._commit_failed(exc) from exc

    def _commit_failed(self, exc: DatabaseError) -> StopExecution:
        if is_transient(exc):
            # Not the workflow's fault (lost connection, lock timeout, ...): leave the run to its lease,
            # after which any executor retries from the journal, instead of failing it.
            logger.warning("run %s: committing a step failed (%s); it is retried when its lease expires",
                           self.run_id, exc)
            return StopExecution(release=False)
        # The database refused what the step would store: every retry would be refused the same way, so
        # the run fails once, with the database's reason, instead of looping on its lease.
        logger.error("run %s: the database refused to store step %s (%s: %s); the run fails",
                     self.run_id, self._seq, type(exc).__name__, exc)
        error = error_dict(exc, step=self._seq)
        error["message"] = f"the database refused to store step {self._seq}: {error['message']}"
        return StopExecution(release=False, fail_with=error)

    def _park(self, *, wake_at: datetime | None, reason: str, writes: Sequence[journal.JournalWrite] = (),
              awaiting_signals: Sequence[str] = ()) -> NoReturn:
        try:
            transitions.park(self._claim, clock.now(), wake_at=wake_at, reason=reason, writes=writes,
                             awaiting_signals=awaiting_signals)
        except FencingError:
            raise StopExecution(release=False) from None
        except DatabaseError as exc:
            raise self._commit_failed(exc) from exc
        raise Suspend()

    def _defer(self, write: journal.JournalWrite) -> None:
        """Fold a write into the run's next commit (made before the next side effect, at the latest when
        the run parks, finishes or is handed back). Only deterministic workflow code runs in between, so
        a crash in that window only repeats what at-least-once already allows."""
        self._claim.deferred.append(write)

    def _step(self, seq: int, kind: str, name: str, status: str, *, attempt: int = 1,
              result: bytes | None = None, error: dict | None = None, started: datetime,
              finished: datetime | None) -> WorkflowStep:
        return WorkflowStep(
            run_id=self.run_id, seq=seq, kind=kind, name=name[:255], status=status, attempt=attempt,
            result=result, error=error, started_at=started, finished_at=finished,
        )

    def _record(self, step: WorkflowStep, existing: WorkflowStep | None) -> journal.JournalWrite:
        """The write that stores ``step`` (new, or replacing ``existing``); the journal sees it at once."""
        self._journal[step.seq] = step
        if existing is None:
            return journal.InsertStep(step)
        step.pk = existing.pk
        return journal.UpdateStep(step)

    def _recorded_value(self, kind: str, name: str, produce: Callable[[], Any], *, side_effects: bool) -> Any:
        """Run ``produce`` once per run and journal its value; replays return the recorded value."""
        seq, step = self._next(kind, name)
        if step is not None:
            return decode(step.result)
        self._before_new_work(side_effects=side_effects)
        value = produce()
        data = encode(value, what=f"value of {kind} {name!r}")
        now = clock.now()
        self._defer(self._record(
            self._step(seq, kind, name, StepStatus.COMPLETED, result=data, started=now, finished=now), None,
        ))
        return value

    # --- deterministic values ------------------------------------------------------------------------

    def now(self) -> datetime:
        """The current time, recorded on first execution so replays see the same value."""
        return self._recorded_value(StepKind.NOW, "now", clock.now, side_effects=False)

    def uuid4(self) -> uuid.UUID:
        return self._recorded_value(StepKind.UUID, "uuid4", uuid.uuid4, side_effects=False)

    def random(self) -> float:
        return self._recorded_value(StepKind.RANDOM, "random", _random.random, side_effects=False)

    def side_effect(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` once for this run and record its (encodable) return value."""
        name = getattr(fn, "__qualname__", "side_effect")
        return self._recorded_value(StepKind.SIDE_EFFECT, name, fn, side_effects=True)

    # --- timers --------------------------------------------------------------------------------------

    def sleep(self, duration: float | int | timedelta) -> None:
        """Wait durably: the run parks and a timer wakes it, across restarts and deploys."""
        seconds = to_seconds(duration, "ctx.sleep duration", allow_zero=True)
        self._sleep(lambda now: now + timedelta(seconds=seconds))

    def sleep_until(self, moment: datetime) -> None:
        check_moment(moment, "ctx.sleep_until's moment")
        self._sleep(lambda now: moment)

    def _sleep(self, wake_at_from: Callable[[datetime], datetime]) -> None:
        seq, step = self._next(StepKind.SLEEP, "sleep")
        if step is not None and step.status == StepStatus.COMPLETED:
            return
        now = clock.now()
        if step is not None:
            timer = self._timers.get(seq)
            if timer is None or timer.fire_at <= now:
                # The timer fired: the step's completion rides on the run's next commit.
                step.status, step.finished_at = StepStatus.COMPLETED, now
                self._defer(self._record(step, step))
                if timer is not None:
                    self._defer(journal.FireTimer(timer.pk, now))
                return
            self._park(wake_at=timer.fire_at, reason=f"sleeping until {timer.fire_at.isoformat()}")
        self._before_new_work(side_effects=False)
        wake_at = wake_at_from(now)
        new_step = self._step(seq, StepKind.SLEEP, "sleep", StepStatus.WAITING, started=now, finished=None)
        if wake_at <= now:
            new_step.status, new_step.finished_at = StepStatus.COMPLETED, now
            self._defer(self._record(new_step, None))
            return
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.SLEEP, fire_at=wake_at)
        self._park(wake_at=wake_at, reason=f"sleeping until {wake_at.isoformat()}",
                   writes=[self._record(new_step, None), journal.InsertTimer(timer)])

    # --- signals -------------------------------------------------------------------------------------

    def wait_for_signal(self, name_or_names: str | Sequence[str],
                        timeout: float | timedelta | None = None) -> Any:
        """Wait for a signal and return its payload (for a list of names: ``(name, payload)``).

        Signals are buffered until consumed and consumed in arrival order, so one sent before the wait
        is returned at once. With ``timeout``, :class:`~django_weft.WaitTimeout` is raised if no
        signal arrives first (a durable timer, like ``sleep``).
        """
        several = not isinstance(name_or_names, str)
        names = list(name_or_names) if several else [name_or_names]
        if not names or not all(isinstance(n, str) and n and len(n) <= 255 for n in names):
            raise InvalidArgument(f"wait_for_signal needs a signal name or a list of names (each at most 255 "
                                  f"characters), got {name_or_names!r}")
        for name in names:
            check_text(name, "a signal name")
        seconds = None if timeout is None else to_seconds(timeout, "wait_for_signal timeout", allow_zero=True)
        label = "|".join(names)
        seq, step = self._next(StepKind.SIGNAL, label)
        if step is not None and step.status == StepStatus.COMPLETED:
            value = decode(step.result)
            return tuple(value) if several else value
        if step is not None and step.status == StepStatus.FAILED:
            raise WaitTimeout((step.error or {}).get("message", "timed out"))
        self._before_new_work(side_effects=False)
        now = clock.now()
        arrived = self._next_signal(names)
        timer = self._timers.get(seq)
        if arrived is not None:
            payload = decode(arrived.payload)
            value = [arrived.name, payload] if several else payload
            self._consumed_signals.add(arrived.pk)
            self._defer(journal.ConsumeSignal(arrived.pk, now, seq))
            if timer is not None:
                self._defer(journal.FireTimer(timer.pk, now))
            self._defer(self._record(self._step(
                seq, StepKind.SIGNAL, label, StepStatus.COMPLETED, result=encode(value, what="signal payload"),
                started=step.started_at if step else now, finished=now,
            ), step))
            return tuple(value) if several else value
        reason = f"waiting for signal {label}"
        if step is not None:  # parked before and still no signal: did the timeout fire?
            if timer is None or timer.fire_at > now:
                self._park(wake_at=timer.fire_at if timer else None, reason=reason, awaiting_signals=names)
            return self._signal_timed_out(seq, step, label, step.started_at, timer, now)
        waiting = self._step(seq, StepKind.SIGNAL, label, StepStatus.WAITING, started=now, finished=None)
        if seconds is None:
            self._park(wake_at=None, reason=reason, awaiting_signals=names, writes=[self._record(waiting, None)])
        if seconds == 0:
            return self._signal_timed_out(seq, None, label, now, None, now)
        wake_at = now + timedelta(seconds=seconds)
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.WAIT_TIMEOUT, fire_at=wake_at)
        self._park(wake_at=wake_at, reason=f"{reason} until {wake_at.isoformat()}", awaiting_signals=names,
                   writes=[self._record(waiting, None), journal.InsertTimer(timer)])

    def _next_signal(self, names: list[str]) -> Signal | None:
        pending = Signal.objects.filter(run_id=self.run_id, name__in=names, consumed_at__isnull=True)
        if self._consumed_signals:  # consumed in this execution, not committed yet
            pending = pending.exclude(pk__in=self._consumed_signals)
        return pending.order_by("sequence").first()

    def _signal_timed_out(self, seq: int, step: WorkflowStep | None, label: str, started: datetime,
                          timer: Timer | None, now: datetime) -> NoReturn:
        message = f"no signal {label} arrived before the timeout"
        if timer is not None:
            self._defer(journal.FireTimer(timer.pk, now))
        self._defer(self._record(self._step(
            seq, StepKind.SIGNAL, label, StepStatus.FAILED, error={"type": "WaitTimeout", "message": message},
            started=started, finished=now,
        ), step))
        raise WaitTimeout(message)

    # --- child workflows -----------------------------------------------------------------------------

    def start_child(self, workflow: str | Callable[..., Any], input: Any = None, *,
                    workflow_id: str | None = None, parent_close_policy: str = "terminate") -> ChildHandle:
        """Start a child run and return a handle to it without waiting.

        The child's id defaults to one derived from this run and step, so a replay re-attaches to the
        child instead of starting another. ``parent_close_policy`` says what happens to the child if
        this run closes first: ``terminate`` (cancel it at once), ``request_cancel`` (cancel it once it
        is not executing), ``abandon`` (leave it running).
        """
        from ..registry import get_workflow
        from ..starts import prepare_run

        definition = get_workflow(workflow)
        seq, step = self._next(StepKind.CHILD, definition.name)
        self._claim.has_dependents = True
        if step is not None:
            child_workflow_id, child_run_id = decode(step.result)
            return ChildHandle(child_workflow_id, uuid.UUID(child_run_id))
        if parent_close_policy not in ParentClosePolicy.values:
            raise InvalidArgument(f"parent_close_policy must be one of {ParentClosePolicy.values}, "
                                  f"got {parent_close_policy!r}")
        child = prepare_run(definition, input,
                            workflow_id=workflow_id if workflow_id is not None else f"{self.run_id}:{seq}")
        child.parent_id = self.run_id
        child.parent_close_policy = parent_close_policy
        if workflow_id is not None and Workflow.objects.open().filter(workflow_id=workflow_id).exists():
            raise WorkflowAlreadyExists(f"child workflow id {workflow_id!r} already has an open run")
        self._before_new_work(side_effects=True)
        now = clock.now()
        record = self._step(seq, StepKind.CHILD, definition.name, StepStatus.COMPLETED,
                            result=encode([child.workflow_id, str(child.run_id)]), started=now, finished=now)
        self._commit([journal.InsertChild(child), self._record(record, None)])
        return ChildHandle(child.workflow_id, child.run_id)

    def wait_child(self, child: ChildHandle) -> Any:
        """Wait for a child run to finish; return its result or raise :class:`ChildWorkflowFailed`."""
        seq, step = self._next(StepKind.CHILD_RESULT, child.workflow_id)
        if step is not None and step.status == StepStatus.COMPLETED:
            return decode(step.result)
        if step is not None and step.status == StepStatus.FAILED:
            raise self._child_failed(child, step.error or {})
        self._before_new_work(side_effects=False)
        now = clock.now()
        run = Workflow.objects.filter(pk=child.run_id).only("status", "result", "error").first()
        if run is None or not run.is_finished:
            waiting = self._step(seq, StepKind.CHILD_RESULT, child.workflow_id, StepStatus.WAITING,
                                 started=now, finished=None)
            self._park(wake_at=None, reason=f"waiting for child {child.workflow_id}",
                       writes=[] if step is not None else [self._record(waiting, None)])
        started = step.started_at if step is not None else now
        if run.status == RunStatus.COMPLETED:
            self._defer(self._record(self._step(seq, StepKind.CHILD_RESULT, child.workflow_id,
                                                StepStatus.COMPLETED, result=run.result, started=started,
                                                finished=now), step))
            return decode(run.result)
        error = {**(run.error or {}), "status": run.status}
        self._defer(self._record(self._step(seq, StepKind.CHILD_RESULT, child.workflow_id, StepStatus.FAILED,
                                            error=error, started=started, finished=now), step))
        raise self._child_failed(child, error)

    def run_child(self, workflow: str | Callable[..., Any], input: Any = None, *,
                  workflow_id: str | None = None, parent_close_policy: str = "terminate") -> Any:
        """Start a child run and wait for it: ``start_child`` then ``wait_child``."""
        child = self.start_child(workflow, input, workflow_id=workflow_id, parent_close_policy=parent_close_policy)
        return self.wait_child(child)

    @staticmethod
    def _child_failed(child: ChildHandle, error: dict) -> ChildWorkflowFailed:
        status = error.get("status", "failed")
        return ChildWorkflowFailed(
            f"child workflow {child.workflow_id!r} {status}: {error.get('type')}: {error.get('message')}",
            workflow_id=child.workflow_id, run_id=child.run_id, status=status, error=error,
        )

    # --- activities ----------------------------------------------------------------------------------

    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run an activity as a journaled step and return its result.

        A recorded result is returned without calling ``fn`` again. Failures are retried by the
        activity's :class:`RetryPolicy` with durable backoff; when it gives up, :class:`ActivityError`
        is raised here (catch it to compensate, or let it fail the run). An activity that calls
        ``weft.complete_async()`` parks the run until its task token is completed or failed (annotate
        its return type as the type of the result it is completed with).

        Typed like a call of ``fn``: a type checker reports arguments ``fn`` does not take, and the
        result has ``fn``'s return type.
        """
        definition = definition_of(fn)
        seq, step = self._next(StepKind.ACTIVITY, definition.name)
        if step is not None and step.status == StepStatus.COMPLETED:
            return decode(step.result)
        if step is not None and step.status == StepStatus.FAILED:
            raise self._activity_error(definition.name, step.error or {}, step.attempt)
        attempt = 1
        started = clock.now()
        if step is not None:  # waiting: out a retry backoff, or for an async completion
            timer = self._timers.get(seq)
            if timer is None or timer.purpose != TimerPurpose.RETRY_BACKOFF:
                return self._resume_async(seq, step, definition, timer)
            if timer.fire_at > clock.now():
                self._park(wake_at=timer.fire_at,
                           reason=f"retrying {definition.name} (attempt {step.attempt + 1}) at "
                                  f"{timer.fire_at.isoformat()}")
            self._defer(journal.FireTimer(timer.pk, clock.now()))
            attempt = step.attempt + 1
            started = step.started_at
        self._before_new_work(side_effects=True)
        try:
            value = self._invoke(definition, seq, attempt, args, kwargs)
            data = encode(value, what=f"result of activity {definition.name!r}")
        except CompleteAsync:
            return self._park_async(seq, step, definition, attempt, started)
        except Exception as exc:
            early = self._token_used_first(seq, attempt)
            if early is not None:
                return self._apply_resolution(seq, step, definition, attempt, started, early)
            retryable = not isinstance(exc, PayloadError) and definition.retry.should_retry(attempt, exc)
            return self._attempt_failed(seq, step, definition, attempt, started, error_dict(exc, attempt=attempt),
                                        retryable=retryable, cause=exc)
        early = self._token_used_first(seq, attempt)
        if early is not None:
            return self._apply_resolution(seq, step, definition, attempt, started, early)
        self._defer(self._record(self._step(
            seq, StepKind.ACTIVITY, definition.name, StepStatus.COMPLETED, attempt=attempt, result=data,
            started=started, finished=clock.now(),
        ), step))
        return value

    def _invoke(self, definition: ActivityDefinition, seq: int, attempt: int, args: tuple, kwargs: dict) -> Any:
        info = ActivityInfo(workflow_id=self.workflow_id, run_id=self.run_id, seq=seq, attempt=attempt,
                            activity=definition.name, generation=self._claim.run.retries)
        self._last_info = info
        token = current_activity.set(info)
        body = body_of(definition)  # the activity's function, or a test's replacement of it
        try:
            if definition.timeout is None:
                return body(*args, **kwargs)
            if _in_callers_transaction():
                return self._invoke_inline_with_timeout(definition, body, attempt, args, kwargs)
            return self._invoke_with_timeout(definition, body, attempt, args, kwargs)
        finally:
            current_activity.reset(token)

    @staticmethod
    def _timed_out(definition: ActivityDefinition, attempt: int) -> ActivityTimeout:
        return ActivityTimeout(
            f"activity {definition.name!r} attempt {attempt} ran longer than its {definition.timeout:g}s timeout"
        )

    def _invoke_inline_with_timeout(self, definition: ActivityDefinition, body: Callable[..., Any],
                                    attempt: int, args: tuple, kwargs: dict) -> Any:
        """An attempt executed inside the caller's transaction (``run_maintenance()`` called in
        ``transaction.atomic()``, a test database wrapped in one transaction): it runs in this thread, on
        this connection, like an activity without a timeout, because a thread on a connection of its own
        would not see the transaction's uncommitted rows (and on SQLite would wait for its write lock).
        The timeout is checked when the body returns: an attempt that took longer fails with
        ActivityTimeout and its result is dropped, as when the engine stops waiting for it."""
        assert definition.timeout is not None
        began = time.monotonic()
        try:
            value = body(*args, **kwargs)
        except (Exception, CompleteAsync) as exc:
            if time.monotonic() - began > definition.timeout:
                raise self._timed_out(definition, attempt) from exc
            raise
        if time.monotonic() - began > definition.timeout:
            raise self._timed_out(definition, attempt)
        return value

    def _invoke_with_timeout(self, definition: ActivityDefinition, body: Callable[..., Any], attempt: int,
                             args: tuple, kwargs: dict) -> Any:
        assert definition.timeout is not None
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = body(*args, **kwargs)
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                connections.close_all()
                done.set()

        # The activity cannot be interrupted; on timeout we stop waiting and let it finish on its own.
        context = contextvars.copy_context()  # activity_info() works in the thread too
        worker = threading.Thread(target=context.run, args=(target,), name=f"weft-activity-{definition.name}",
                                  daemon=True)
        worker.start()
        if not done.wait(definition.timeout):
            raise self._timed_out(definition, attempt)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _attempt_failed(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition,
                        attempt: int, started: datetime, error: dict, *, retryable: bool,
                        cause: BaseException | None = None) -> Any:
        now = clock.now()
        wake_at = now + timedelta(seconds=definition.retry.backoff(attempt))
        deadline = self._close_deadline(definition, started)
        if retryable and deadline is not None and wake_at >= deadline:
            retryable = False
            error = {**error, "message": f"{error.get('message')} (no retry: schedule_to_close_timeout of "
                                         f"{definition.schedule_to_close_timeout:g}s would pass first)"}
        if not retryable:
            self._log_attempt_failed(definition, attempt, error, "giving up: ActivityError is raised in the workflow")
            failed = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.FAILED, attempt=attempt,
                                error=error, started=started, finished=now)
            self._defer(self._record(failed, step))
            raise self._activity_error(definition.name, error, attempt) from cause
        self._log_attempt_failed(definition, attempt, error, f"retrying at {wake_at.isoformat(timespec='seconds')}")
        waiting = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.WAITING, attempt=attempt,
                             error=error, started=started, finished=None)
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.RETRY_BACKOFF, fire_at=wake_at)
        self._park(wake_at=wake_at, writes=[self._record(waiting, step), journal.InsertTimer(timer)],
                   reason=f"retrying {definition.name} (attempt {attempt + 1}) at {wake_at.isoformat()}")
        raise AssertionError("unreachable")  # _park always raises

    def _log_attempt_failed(self, definition: ActivityDefinition, attempt: int, error: dict, then: str) -> None:
        """One WARNING per failed attempt (a Celery user expects to see retries in the worker's output)."""
        message = str(error.get("message"))
        if len(message) > LOGGED_MESSAGE_CHARS:
            message = message[:LOGGED_MESSAGE_CHARS] + "..."
        logger.warning("run %s of %s: activity %s attempt %d of %d failed: %s: %s; %s", self.run_id,
                       self._claim.run.workflow_type, definition.name, attempt, definition.retry.max_attempts,
                       error.get("type"), message, then)

    @staticmethod
    def _close_deadline(definition: ActivityDefinition, started: datetime) -> datetime | None:
        if definition.schedule_to_close_timeout is None:
            return None
        return started + timedelta(seconds=definition.schedule_to_close_timeout)

    # --- async activities ----------------------------------------------------------------------------

    def _park_async(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition, attempt: int,
                    started: datetime) -> Any:
        """The attempt called complete_async(): its pending record commits with the parked step, so a
        replay never needs to run the body again to learn the token.

        The token may have been used already: while the body still ran, or before an executor that died
        ahead of its park, whose attempt this one repeats. Then the answer is applied now; one that comes
        after this check finds the run's inbox moved and wakes the run as soon as it parks.
        """
        early = self._early_resolution(seq, attempt)
        if early is not None:
            return self._apply_resolution(seq, step, definition, attempt, started, early)
        now = clock.now()
        record = AsyncActivity(run_id=self.run_id, seq=seq, attempt=attempt, activity=definition.name,
                               token=make_task_token(self.run_id, seq, attempt, self._claim.run.retries),
                               created_at=now)
        waiting = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.WAITING, attempt=attempt,
                             started=started, finished=None)
        writes: list[journal.JournalWrite] = [self._record(waiting, step), journal.InsertAsync(record)]
        deadline = self._close_deadline(definition, started)
        if deadline is not None:
            writes.append(journal.InsertTimer(Timer(run_id=self.run_id, seq=seq, fire_at=deadline,
                                                    purpose=TimerPurpose.ACTIVITY_TIMEOUT)))
        self._park(wake_at=deadline, writes=writes,
                   reason=f"waiting for async activity {definition.name} (attempt {attempt}) to be completed")

    def _resume_async(self, seq: int, step: WorkflowStep, definition: ActivityDefinition,
                      timer: Timer | None) -> Any:
        record = AsyncActivity.objects.filter(run_id=self.run_id, seq=seq, attempt=step.attempt).first()
        if record is None:
            raise NonDeterminismError(
                f"step {seq} of run {self.run_id} waits for an async activity attempt {step.attempt} that has "
                "no record"
            )
        now = clock.now()
        if record.status == AsyncStatus.PENDING:
            if timer is None or timer.fire_at > now:
                self._park(wake_at=timer.fire_at if timer else None,
                           reason=f"waiting for async activity {definition.name} (attempt {step.attempt}) "
                                  "to be completed")
            error = {"type": "django_weft.exceptions.ActivityTimeout", "attempt": step.attempt,
                     "message": f"async activity {definition.name!r} was not completed within its "
                                f"{definition.schedule_to_close_timeout or 0:g}s schedule_to_close_timeout"}
            self._defer(journal.ResolveAsync(record.pk, AsyncStatus.TIMED_OUT, now, error))
            record.status, record.error = AsyncStatus.TIMED_OUT, error
        if timer is not None:
            self._defer(journal.FireTimer(timer.pk, now))
        return self._apply_resolution(seq, step, definition, step.attempt, step.started_at, record)

    def _token_used_first(self, seq: int, attempt: int) -> AsyncActivity | None:
        """A body that handed its token out and then returned or raised may have been resolved by its token
        meanwhile: a token resolves its attempt once, and the first resolution wins."""
        if self._last_info is None or not self._last_info.token_handed_out:
            return None
        return self._early_resolution(seq, attempt)

    def _early_resolution(self, seq: int, attempt: int) -> AsyncActivity | None:
        """The resolution an outside system gave this attempt's token before the attempt parked."""
        record = AsyncActivity.objects.filter(run_id=self.run_id, seq=seq, attempt=attempt).first()
        return record if record is not None and record.status != AsyncStatus.PENDING else None

    def _apply_resolution(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition,
                          attempt: int, started: datetime, record: AsyncActivity) -> Any:
        """Continue with an async attempt's resolution: its result, or a failed attempt for the retry policy."""
        if not record.activity:  # kept before the park named it
            self._defer(journal.InsertAsync(AsyncActivity(
                run_id=self.run_id, seq=seq, attempt=attempt, activity=definition.name, token=record.token)))
        if record.status == AsyncStatus.COMPLETED:
            self._defer(self._record(self._step(
                seq, StepKind.ACTIVITY, definition.name, StepStatus.COMPLETED, attempt=attempt,
                result=record.result, started=started, finished=record.resolved_at or clock.now(),
            ), step))
            return decode(record.result)
        error = record.error or {"type": "AsyncActivityFailed", "message": f"async activity {record.status}"}
        return self._attempt_failed(seq, step, definition, attempt, started, error,
                                    retryable=record.status == AsyncStatus.FAILED
                                    and attempt < definition.retry.max_attempts)

    @staticmethod
    def _activity_error(name: str, error: dict, attempts: int) -> ActivityError:
        return ActivityError(
            f"activity {name!r} failed after {attempts} attempt(s): {error.get('type')}: {error.get('message')}",
            activity=name, error_type=str(error.get("type")), attempts=attempts,
        )

    def assert_journal_consumed(self) -> None:
        """The code finished; a longer journal means it skipped operations it made before."""
        if self._seq < len(self._journal):
            extra = self._journal[self._seq + 1]
            raise NonDeterminismError(
                f"run {self.run_id}: the workflow returned after {self._seq} step(s), but the journal "
                f"recorded {len(self._journal)}; step {extra.seq} was {extra.kind} {extra.name!r}"
            )
