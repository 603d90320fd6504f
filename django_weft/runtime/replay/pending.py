"""Branches: the operations ``ctx.start_activity``, ``ctx.start_timer``, ``ctx.start_wait_for_signal`` and
``ctx.start_child`` begin without waiting, as a :class:`Pending` each.

A branch takes its journal position when it starts and is one journal row, written when it settles (a
timer's row and an async or retried activity's row exist while they wait, so their deadlines survive a
crash). The executor thread settles branches by polling them (:meth:`Pending.poll`): only it writes
the journal, while activity attempts run in the run's attempt pool.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.tokens import make_task_token
from django_weft.exceptions import (
    ActivityTimeout,
    BranchCancelled,
    CancelledError,
    NonDeterminismError,
    PayloadError,
    WaitTimeout,
)
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    AttemptOutcome,
    FailureCategory,
    StepStatus,
    Timer,
    TimerPurpose,
    WorkflowStep,
)
from django_weft.observability import events
from django_weft.runtime.activities import ActivityDefinition, ActivityInfo, body_of, is_coroutine_body
from django_weft.runtime.attempt_pool import AttemptJob, Outcome
from django_weft.runtime.errors import attempt_outcome, error_category, error_dict
from django_weft.runtime.heartbeats import AttemptControl
from django_weft.runtime.replay.core import durable
from django_weft.runtime.replay.slots import SlotWait, slot_reason
from django_weft.store import journal

if TYPE_CHECKING:
    from concurrent.futures import Future

    from django_weft.runtime.replay.branches import Branches

T = TypeVar("T")


class Pending(Generic[T]):
    """A branch of a run that was started and may not have settled yet.

    ``result()`` waits for it (parking the run if it cannot settle now) and returns its value or raises
    its error; pass several to ``ctx.gather`` or ``ctx.race``. ``done`` says whether it has settled.
    """

    def __init__(self, ctx: Branches, seq: int, kind: str, name: str, row: WorkflowStep | None) -> None:
        self._ctx = ctx
        self.seq = seq
        self._kind = kind
        self._name = name
        self._row = row
        self._started = row.started_at if row is not None else clock.now()
        self._settled = False
        # The code waited for it (result(), gather, race, map): from then on ``done`` tells whether it settled.
        self.awaited = False
        self._value: Any = None
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        state = "settled" if self._settled else "pending"
        return f"<{type(self).__name__} step {self.seq} {self._kind} {self._name!r} {state}>"

    @property
    def done(self) -> bool:
        """True once the code waited for the branch (``result()``, ``gather``, ``race``, ``map``) and it
        settled. Before any wait it is False even if the branch finished meanwhile: when a branch finishes
        is not recorded, so code that branched on it would take another path on replay."""
        return self._settled and self.awaited

    @property
    def cancelled_with_run(self) -> bool:
        """The branch was cancelled because its run's cancel was delivered: waiting for it raises CancelledError."""
        return isinstance(self._error, CancelledError)

    @property
    def settled(self) -> bool:
        """The engine's view: the branch has its outcome (recorded, or decided in this execution)."""
        return self._settled

    @durable
    def result(self) -> T:
        """Wait for this branch and return its value (or raise its error)."""
        self._ctx._wait_for([self], first=False)
        return self.outcome()

    def outcome(self) -> T:
        """The settled branch's value, or its error raised."""
        if not self._settled:
            raise RuntimeError(f"{self!r} has not settled")
        if self._error is not None:
            raise self._error
        return self._value

    # --- what the executor thread calls ---

    def take_position(self) -> None:
        """Take any journal position the branch needs once it is waited for (a child's result)."""

    def poll(self, now: datetime) -> None:
        """Settle the branch if it can settle now, without blocking."""

    @property
    def running(self) -> bool:
        """An attempt of it executes in the attempt pool."""
        return False

    # A branch nobody waits for yet wakes the run when it can move on by itself (an activity's retry backoff, a
    # branch of workflow code): a replay carries it on at once. A timer, signal or child moves on only when the
    # code waits for it, so it wakes nothing (waking for it would replay in a loop).
    wakes_the_run = False

    def futures(self) -> list[Any]:
        """The attempts of it running in the attempt pool (a wait returns when one of them ends)."""
        return []

    def poll_attempt(self) -> None:
        """Record how a running attempt ended, if it did."""

    def advance(self, now: datetime) -> None:
        """Before the run parks: move on as far as it can by itself (a branch of workflow code runs its code)."""

    def wake_at(self) -> datetime | None:
        """When the branch may settle by itself (a timer), if it waits for one."""
        return None

    def awaiting_signals(self) -> list[str]:
        return []

    def park_writes(self) -> list[journal.JournalWrite]:
        """Rows to record when the run parks waiting for this branch."""
        return []

    def reason(self) -> str:
        """What the run waits for while it waits for this branch (its wait reason)."""
        return f"waiting for {self._kind} {self._name}"

    def cancel(self, reason: str, *, with_run: bool = False) -> None:
        """The branch lost a race (``with_run``: its run was cancelled): stop it, record it as cancelled;
        nothing it produces is used."""
        self.abandon(reason)
        error, exc = self._cancellation(reason, with_run)
        self._write_row(StepStatus.CANCELLED, error=error, failure_category=FailureCategory.CANCELLATION)
        self._settle(error=exc)

    def _cancellation(self, reason: str, with_run: bool) -> tuple[dict, BaseException]:
        """The row's error and the exception waiting for the cancelled branch raises."""
        if with_run:
            return {"type": "CancelledError", "message": reason}, CancelledError(reason)
        return ({"type": "BranchCancelled", "message": reason},
                BranchCancelled(f"step {self.seq} ({self._kind} {self._name!r}) was cancelled: {reason}"))

    def abandon(self, reason: str) -> None:
        """The execution ends without waiting for the branch: stop what runs (no row is written)."""

    # --- for subclasses ---

    def _settle(self, *, value: Any = None, error: BaseException | None = None) -> None:
        self._settled, self._value, self._error = True, value, error

    def _settle_from_row(self, row: WorkflowStep) -> bool:
        """Settle from a recorded row that says how the branch ended; False if it is still waiting."""
        if row.status == StepStatus.CANCELLED:
            if (row.error or {}).get("type") == "CancelledError":
                self._settle(error=CancelledError((row.error or {}).get("message", "the run's cancel was requested")))
            else:
                self._settle(error=BranchCancelled(f"step {self.seq} ({self._kind} {self._name!r}) lost a race"))
            return True
        return False

    def _write_row(self, status: str, *, attempt: int = 1, result: bytes | memoryview | None = None,
                   error: dict | None = None, failure_category: str = "",
                   finished: bool = True) -> None:
        """Record the branch's row as it is now. A row whose insert is still deferred (it has no pk) is
        written as it is at commit time, so it is changed in place."""
        now = clock.now()
        row = self._row
        if row is not None and row.pk is None:
            row.status, row.attempt, row.result, row.error = status, attempt, result, error
            row.failure_category = failure_category
            row.finished_at = now if finished else None
            return
        ctx = self._ctx
        new = ctx._step(self.seq, self._kind, self._name, status, attempt=attempt, result=result, error=error,
                        started=self._started, finished=now if finished else None, failure_category=failure_category)
        ctx._defer(ctx._record(new, row))
        self._row = new

    def _fire(self, timer: Timer | None) -> None:
        if timer is None:
            return
        now = clock.now()
        if timer.pk is None:  # its insert is still deferred
            timer.fired_at = now
        else:
            self._ctx._defer(journal.FireTimer(timer.pk, now))


class ActivityBranch(Pending[T]):
    """``ctx.start_activity``: an activity whose attempts run in the run's attempt pool."""

    def __init__(self, ctx: Branches, seq: int, row: WorkflowStep | None, definition: ActivityDefinition,
                 args: tuple, kwargs: dict) -> None:
        super().__init__(ctx, seq, "activity", definition.name, row)
        if row is not None and row.status == StepStatus.WAITING:
            definition = ctx._with_controls(definition, seq)
        self.definition = definition
        self._args, self._kwargs = args, kwargs
        self._attempt = 1
        self._future: Future[Outcome] | None = None
        self._info: ActivityInfo | None = None
        self._retry_timer: Timer | None = None  # waiting out a retry backoff
        self._async_wait = False  # waiting for an async completion
        self._close_timer: Timer | None = None  # an async wait's timeout (schedule_to_close or heartbeat)
        self._async_record: AsyncActivity | None = None  # its record, while its insert is deferred
        self._record_deferred = False  # the async attempt's record rides on the run's next commit
        self._began: datetime | None = None  # when the attempt running now (or that ran last) began
        # An attempt is due but has not begun: it begins when the code waits for the branch or makes its next
        # call with side effects, or when the run parks. A branch that loses a race before then never begins.
        self._due = False
        self._shielded = ctx._cleanup_depth > 0  # started inside ctx.cleanup(): the run's cancel leaves it be
        self._slot = SlotWait(ctx)  # a limited activity's attempt waits for its slot before it begins
        if row is None:
            self._dispatch()
        elif row.status == StepStatus.COMPLETED:
            self._settle(value=decode(row.result))
        elif row.status == StepStatus.FAILED:
            self._settle(error=ctx._activity_error(definition.name, row.error or {}, row.attempt, seq))
        elif not self._settle_from_row(row):
            self._resume_waiting(row)

    def _resume_waiting(self, row: WorkflowStep) -> None:
        timer = self._ctx._timers.get(self.seq)
        if timer is not None and timer.purpose == TimerPurpose.RETRY_BACKOFF:
            self._retry_timer, self._attempt = timer, row.attempt + 1
        elif self._ctx._backoff_over(self.seq, row, timer):
            self._attempt = row.attempt + 1  # its backoff timer fired, then the next attempt was cut short
            self._dispatch()
        else:
            self._async_wait, self._close_timer, self._attempt = True, timer, row.attempt
        self.poll(clock.now())

    def _dispatch(self) -> None:
        """The next attempt is due (see ``_due``); nothing runs yet."""
        self._ctx._check_new_work()
        self._due = True

    @property
    def due(self) -> bool:
        """An attempt of it is due and has not begun yet."""
        return self._due

    def begin(self) -> None:
        """Begin the due attempt in the run's attempt pool, after the rows before it commit."""
        if not self._due:
            return
        ctx = self._ctx
        ctx._check_new_work()
        if ctx._taken_over_from and not self._after_lost():
            return
        if self.definition.limits is not None and not self._slot_held():
            return  # stays due: asked again when polled, or when its run wakes
        ctx._commit_deferred()
        self._due = False
        self._began = clock.now()
        definition = self.definition
        control = AttemptControl(ctx._claim, ctx.run_id, self.seq, self._attempt, timeout=definition.timeout,
                                 heartbeat_timeout=definition.heartbeat_timeout, activity=definition.name)
        control.shielded = self._shielded
        self._info = ActivityInfo(workflow_id=ctx.workflow_id, run_id=ctx.run_id, seq=self.seq,
                                  attempt=self._attempt, activity=definition.name, generation=ctx._claim.run.retries,
                                  control=control)
        body = body_of(definition)
        body = events.attempt(body, self._info, ctx._claim.run, is_async=is_coroutine_body(body))
        self._future = ctx._attempt_pool().submit(AttemptJob(self._info, body, self._args, self._kwargs,
                                                             timeout=definition.timeout))

    def _slot_held(self) -> bool:
        if not self._slot.due():
            return False
        granted, retry_at = self._ctx._ask_slot(self.definition, self.seq, self._args, self._kwargs)
        return self._slot.asked(granted, retry_at)

    def _end_attempt(self) -> None:
        """The running attempt ended (or was given up): a limited activity's slot is free."""
        self._future = None
        self._ctx._release_slot(self.definition, self.seq)

    def _after_lost(self) -> bool:
        """In a run taken over, the attempt about to begin may repeat one the dead executor began (see
        ``_next_after_lost``): answer it from that attempt's token, count it lost, or fail the step; True if
        the next attempt begins."""
        ctx = self._ctx
        early = ctx._early_resolution(self.seq, self._attempt)
        self._due = False
        if early is not None:
            self._apply(early)
            return False
        self._attempt, lost = ctx._next_after_lost(self.seq, self._attempt, self.definition)
        if lost is not None:
            self._failed(lost, False)
            return False
        self._due = True
        return True

    wakes_the_run = True

    @property
    def running(self) -> bool:
        return self._future is not None

    def futures(self) -> list[Any]:
        return [] if self._future is None else [self._future]

    def poll(self, now: datetime) -> None:
        if self._settled:
            return
        if self._due:
            self.begin()
        if self._future is not None:
            self.poll_attempt()
        elif self._retry_timer is not None:
            if self._retry_timer.fire_at <= now and not self._ctx._retries_paused(self.seq):
                if self._retry_timer.pk is None:
                    self._ctx._commit()  # the timer's row is written before it is marked fired
                self._fire(self._retry_timer)
                self._retry_timer = None
                self._dispatch()
                self.begin()
        elif self._async_wait:
            self._poll_async(now)

    def poll_attempt(self) -> None:
        """Record the running attempt's outcome if it has one, or fail it if it overran."""
        if self._future is None:
            return
        if self._future.done():
            outcome = self._future.result()
            self._end_attempt()
            self._handle(outcome)
        else:
            self._check_running()

    def _check_running(self) -> None:
        """The attempt runs on: fail it if it passed its timeout or stopped beating."""
        assert self._info is not None and self._info.control is not None
        control, now = self._info.control, time.monotonic()
        definition = self.definition
        if control.past_deadline(now):
            message = f"ran longer than its {definition.timeout:g}s timeout"
        elif control.silent_too_long(now):
            message = f"sent no heartbeat for longer than its {definition.heartbeat_timeout:g}s heartbeat_timeout"
        else:
            return
        control.cancel(f"the attempt {message}")
        self._end_attempt()
        error = ActivityTimeout(f"activity {definition.name!r} attempt {self._attempt} {message}")
        self._failed(error_dict(error, attempt=self._attempt), definition.retry.should_retry(self._attempt, error),
                     error)

    def _handle(self, outcome: Outcome) -> None:
        ctx, attempt = self._ctx, self._attempt
        info = self._info
        early = None
        if outcome.completes_async or (info is not None and info.token_handed_out):
            early = ctx._early_resolution(self.seq, attempt)
        if early is not None:
            self._apply(early)
        elif outcome.completes_async:
            self._park_async()
        elif outcome.error is not None:
            exc = outcome.error
            retryable = not isinstance(exc, PayloadError) and isinstance(exc, Exception) and \
                self.definition.retry.should_retry(attempt, exc)
            self._failed(error_dict(exc, attempt=attempt), retryable, exc)
        else:
            self._history(AttemptOutcome.COMPLETED)
            self._write_row(StepStatus.COMPLETED, attempt=attempt, result=outcome.data)
            self._settle(value=outcome.value)

    def _history(self, outcome: str, error: dict | None = None, *, always: bool = False,
                 began: datetime | None = None) -> None:
        """Record how the attempt that ran ended, where the step has an attempt history (it took more than
        one attempt; ``always``: it will)."""
        if always or self._attempt > 1:
            self._ctx._defer(self._ctx._attempt_row(self.seq, self._attempt, outcome, began or self._began, error))

    def _park_async(self) -> None:
        ctx = self._ctx
        self._write_row(StepStatus.WAITING, attempt=self._attempt, finished=False)
        self._async_record = AsyncActivity(
            run_id=ctx.run_id, seq=self.seq, attempt=self._attempt, activity=self.definition.name,
            token=make_task_token(ctx.run_id, self.seq, self._attempt, ctx._claim.run.retries), created_at=clock.now(),
        )
        ctx._defer(journal.InsertAsync(self._async_record))
        self._record_deferred = True
        deadline = ctx._async_deadline(self.definition, self._started, alive_at=clock.now())
        if deadline is not None:
            self._close_timer = Timer(run_id=ctx.run_id, seq=self.seq, fire_at=deadline,
                                      purpose=TimerPurpose.ACTIVITY_TIMEOUT)
            ctx._defer(journal.InsertTimer(self._close_timer))
        self._async_wait = True

    def _poll_async(self, now: datetime) -> None:
        ctx = self._ctx
        if self._record_deferred:
            ctx._commit()  # the record (and an answer the token got meanwhile) is read from the database
            self._record_deferred = False
        record = AsyncActivity.objects.filter(run_id=ctx.run_id, seq=self.seq, attempt=self._attempt).first()
        if record is None:
            raise NonDeterminismError(f"step {self.seq} of run {ctx.run_id} waits for an async activity attempt "
                                      f"{self._attempt} that has no record")
        if record.status == AsyncStatus.PENDING:
            timer = self._close_timer
            if timer is None or timer.fire_at > now:
                return
            later = ctx._timed_out_unless_beating(record, self.definition, self._started, now)
            if later is not None:  # heartbeats kept it alive: wait on a new timer at the deadline they earned
                self._fire(timer)
                self._close_timer = Timer(run_id=ctx.run_id, seq=self.seq, fire_at=later,
                                          purpose=TimerPurpose.ACTIVITY_TIMEOUT)
                ctx._defer(journal.InsertTimer(self._close_timer))
                return
        self._fire(self._close_timer)
        self._close_timer, self._async_wait = None, False
        self._apply(record)

    def _apply(self, record: AsyncActivity) -> None:
        """Continue with an async attempt's resolution."""
        self._began = self._began or record.created_at
        if record.status == AsyncStatus.COMPLETED:
            self._history(AttemptOutcome.COMPLETED)
            self._write_row(StepStatus.COMPLETED, attempt=self._attempt, result=record.result)
            self._settle(value=decode(record.result))
            return
        error = record.error or {"type": "AsyncActivityFailed", "message": f"async activity {record.status}"}
        self._failed(error, self._ctx._async_retryable(self.definition, self._attempt, record))

    def _failed(self, error: dict, retryable: bool, cause: BaseException | None = None) -> None:
        ctx, definition, attempt = self._ctx, self.definition, self._attempt
        now = clock.now()
        wake_at, error = ctx._retry_at(definition, attempt, self._started, error, retryable, now)
        if wake_at is None:
            ctx._log_attempt_failed(definition, attempt, error, "giving up: ActivityError is raised in the workflow")
            if self._began is not None:  # not for a lost attempt: its row is written
                self._history(attempt_outcome(error), error)
            self._write_row(StepStatus.FAILED, attempt=attempt, error=error, failure_category=error_category(error))
            failure = ctx._activity_error(definition.name, error, attempt, self.seq)
            failure.__cause__ = cause
            self._settle(error=failure)
            return
        ctx._log_attempt_failed(definition, attempt, error, f"retrying at {wake_at.isoformat(timespec='seconds')}")
        self._history(attempt_outcome(error), error, always=True)
        self._began = None
        self._write_row(StepStatus.WAITING, attempt=attempt, error=error, finished=False)
        self._retry_timer = Timer(run_id=ctx.run_id, seq=self.seq, purpose=TimerPurpose.RETRY_BACKOFF, fire_at=wake_at)
        ctx._defer(journal.InsertTimer(self._retry_timer))
        self._attempt = attempt + 1

    def wake_at(self) -> datetime | None:
        if self._retry_timer is not None:
            return None if self._ctx._retries_paused(self.seq) else self._retry_timer.fire_at
        if self._due and self._slot.waiting:
            return self._slot.retry_at
        return self._close_timer.fire_at if self._close_timer is not None else None

    def reason(self) -> str:
        if self._due and self._slot.waiting:
            return slot_reason(self.definition, self._slot.retry_at)
        if self._retry_timer is not None and self._ctx._retries_paused(self.seq):
            return f"retries of {self._name} (step {self.seq}) paused by an operator"
        if self._retry_timer is not None:
            return f"retrying {self._name} (attempt {self._attempt}) at {self._retry_timer.fire_at.isoformat()}"
        return f"waiting for async activity {self._name} (attempt {self._attempt}) to be completed"

    def abandon(self, reason: str) -> None:
        self._due = False  # never begins
        if self._future is not None and self._info is not None and self._info.control is not None:
            self._info.control.cancel(reason)  # the pool waits for it to end before the execution does
            self._end_attempt()
        self._future = None

    def cancel(self, reason: str, *, with_run: bool = False) -> None:
        self._fire(self._retry_timer)
        self._fire(self._close_timer)
        self._retry_timer = self._close_timer = None
        if self._async_wait:
            self._drop_token()
        self._async_wait = False
        error, exc = self._cancellation(reason, with_run)
        if self._future is not None:
            self._history(AttemptOutcome.CANCELLED, error)
        self.abandon(reason)
        self._write_row(StepStatus.CANCELLED, attempt=self._attempt, error=error,
                        failure_category=FailureCategory.CANCELLATION)
        self._settle(error=exc)

    def _drop_token(self) -> None:
        """The token of a cancelled async wait dies with it, as where the run's cancel is delivered: completions
        are refused, and a heartbeat answers that the attempt was cancelled."""
        now = clock.now()
        record = self._async_record
        if record is not None and record.pk is None:  # its insert is still deferred
            record.status, record.resolved_at = AsyncStatus.CANCELLED, now
            return
        for pk in AsyncActivity.objects.filter(run_id=self._ctx.run_id, seq=self.seq, attempt=self._attempt,
                                               status=AsyncStatus.PENDING).values_list("pk", flat=True):
            self._ctx._defer(journal.ResolveAsync(pk, AsyncStatus.CANCELLED, now))


class TimerBranch(Pending[None]):
    """``ctx.start_timer``: its row and timer are recorded at once, so its deadline survives a crash."""

    def __init__(self, ctx: Branches, seq: int, row: WorkflowStep | None, fire_at: datetime) -> None:
        super().__init__(ctx, seq, "sleep", "sleep", row)
        self._timer: Timer | None = None
        self._fire_at = fire_at
        if row is not None:
            if row.status == StepStatus.COMPLETED:
                self._settle()
            elif not self._settle_from_row(row):
                self._timer = ctx._timers.get(seq)
                self._fire_at = self._timer.fire_at if self._timer is not None else clock.now()
            return
        if fire_at <= clock.now():
            self._write_row(StepStatus.COMPLETED)
            self._settle()
            return
        self._write_row(StepStatus.WAITING, finished=False)
        self._timer = Timer(run_id=ctx.run_id, seq=seq, purpose=TimerPurpose.SLEEP, fire_at=fire_at)
        ctx._defer(journal.InsertTimer(self._timer))

    def poll(self, now: datetime) -> None:
        if not self._settled and self._fire_at <= now:
            self._fire(self._timer)
            self._write_row(StepStatus.COMPLETED)
            self._settle()

    def wake_at(self) -> datetime | None:
        return None if self._settled else self._fire_at

    def reason(self) -> str:
        return f"sleeping until {self._fire_at.isoformat()}"

    def cancel(self, reason: str, *, with_run: bool = False) -> None:
        self._fire(self._timer)  # dropped: it wakes nothing any more
        super().cancel(reason, with_run=with_run)


class SignalBranch(Pending[Any]):
    """``ctx.start_wait_for_signal``: consumes a signal only when it settles, so a loser consumes nothing."""

    def __init__(self, ctx: Branches, seq: int, row: WorkflowStep | None, names: list[str], several: bool) -> None:
        super().__init__(ctx, seq, "signal", "|".join(names), row)
        self._names, self._several = names, several
        if row is not None and row.status == StepStatus.COMPLETED:
            value = decode(row.result)
            self._settle(value=tuple(value) if several else value)
        elif row is not None and row.status == StepStatus.FAILED:
            self._settle(error=WaitTimeout((row.error or {}).get("message", "timed out")))
        elif row is not None:
            self._settle_from_row(row)

    def poll(self, now: datetime) -> None:
        if self._settled:
            return
        ctx = self._ctx
        arrived = ctx._next_signal(self._names)
        if arrived is None:
            return
        payload = decode(arrived.payload)
        value = [arrived.name, payload] if self._several else payload
        ctx._consumed(arrived)
        ctx._defer(journal.ConsumeSignal(arrived.pk, now, self.seq, arrived.name))
        self._write_row(StepStatus.COMPLETED, result=encode(value, what="signal payload"))
        self._settle(value=tuple(value) if self._several else value)

    def awaiting_signals(self) -> list[str]:
        return [] if self._settled else list(self._names)

    def park_writes(self) -> list[journal.JournalWrite]:
        if self._row is not None or self._settled:
            return []
        self._write_row(StepStatus.WAITING, finished=False)
        return []  # the row rides on the deferred writes the park commits

    def reason(self) -> str:
        return f"waiting for signal {self._name}"
