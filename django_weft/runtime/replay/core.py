"""The core of the replay context: positions in the journal, the check that the code still matches it,
and the fenced writes (commit, park, fold into the next commit) every operation family uses.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, NoReturn, ParamSpec, TypeVar

from django.db import DatabaseError

from django_weft.common import clock
from django_weft.common.codec import decode
from django_weft.common.positions import BRANCH_BASE
from django_weft.common.registry import WorkflowDefinition
from django_weft.conf import weft_settings
from django_weft.exceptions import CancelledError, FencingError, InvalidArgument, NonDeterminismError
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    FailureCategory,
    RunStatus,
    StepControl,
    StepKind,
    StepStatus,
    Timer,
    Workflow,
    WorkflowStep,
)
from django_weft.models.instances import new_instance
from django_weft.runtime.activities import ActivityDefinition, ActivityInfo, ResetRetryPolicy, RetryPolicy
from django_weft.runtime.attempt_pool import AttemptPool
from django_weft.runtime.errors import (
    EngineExit,
    HistoryLimitReached,
    ReplayFrontier,
    StopExecution,
    Suspend,
    is_transient,
    refused_by_database,
)
from django_weft.store import journal, transitions

logger = logging.getLogger("django_weft.executor")

P = ParamSpec("P")
R = TypeVar("R")


# Read on every step of a replay: plain values, not the enum's class attribute lookups.
_CANCELLED, _WAITING = str(StepStatus.CANCELLED.value), str(StepStatus.WAITING.value)

# The branch context whose code this thread runs (runtime.replay.code_branches), if any.
running_branch: contextvars.ContextVar[Any] = contextvars.ContextVar("weft_running_branch", default=None)


class ResumeOperation(BaseException):
    """Raised where a branch of workflow code would park: it waited for its caller to resume it, and the durable
    operation runs again from its position (runtime.replay.code_branches)."""


def durable(operation: Callable[P, R]) -> Callable[P, R]:
    """Mark a method workflow code calls as a durable operation (of the context, or of a branch it started).

    A run parks, stops or is handed back by unwinding the workflow's code with an :class:`EngineExit`, so its
    ``finally:`` and ``except BaseException:`` blocks run then too, although the workflow has not ended. From
    the first exit until the code has unwound, every durable call re-raises that exit at once: nothing
    executes and nothing is recorded, and the cleanup runs for real only when the workflow really ends."""

    @functools.wraps(operation)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        owner = args[0]
        here = running_branch.get()
        if here is not None and owner is not here and owner is getattr(here, "_root", None):
            # Code running as a branch (an update handler, a closure in ctx.start_branch's function) called the
            # run's own ctx: the call is the branch's, at the branch's positions.
            return getattr(here, operation.__name__)(*args[1:], **kwargs)
        core: ReplayCore = owner if isinstance(owner, ReplayCore) else owner._ctx  # type: ignore[attr-defined]
        if core._exiting is not None:
            raise core._exiting
        if core._cancel_delivered and not core._cleanup_depth:
            raise core._cancelled()  # once delivered, every durable call outside ctx.cleanup() raises it again
        while True:
            mark = core._seq
            try:
                return operation(*args, **kwargs)
            except ResumeOperation:
                core._seq = mark  # a branch waited where the run would park: the operation runs again
            except EngineExit as exit:
                core._exiting = exit
                raise

    return guarded


class ReplayCore:
    """Positions, journal checks and fenced writes (the base of every operation family)."""

    def __init__(
        self,
        claim: transitions.Claim,
        steps: dict[int, WorkflowStep],
        timers: dict[int, Timer],
        should_stop: Callable[[], bool] = lambda: False,
        *,
        dry: bool = False,
    ) -> None:
        self._claim = claim
        # The run's own positions; rows of branches of workflow code (runtime.replay.code_branches) sit in blocks
        # above BRANCH_BASE, read by the branch that owns them.
        if steps and max(steps) >= BRANCH_BASE:
            self._branch_rows = {seq: row for seq, row in steps.items() if seq >= BRANCH_BASE}
            steps = {seq: row for seq, row in steps.items() if seq < BRANCH_BASE}
        else:
            self._branch_rows = {}
        self._journal = steps
        self._timers = timers
        self._should_stop = should_stop
        # A dry replay (the replay check) executes and writes nothing: it stops where new work would begin.
        self._dry = dry
        self._max_history = int(weft_settings.MAX_HISTORY)
        self._seq = 0
        # Signals consumed by this execution whose consumption is not committed yet.
        # Per signal name, the highest sequence consumed (every wait takes the lowest unconsumed signal of
        # its names, so what one execution consumed of a name is a prefix: one bound per name, not a NOT IN
        # list that grows with every signal of a long execution).
        self._consumed_up_to: dict[str, int] = {}
        # The identity of the activity attempt run last (did its body hand its task token out?).
        self._last_info: ActivityInfo | None = None
        # The last position the journal holds (branches leave gaps: a row is written when it settles).
        self._journal_end = max(steps, default=0)
        # Branches started by this execution (runtime.replay.branches), and the pool their attempts run in.
        self._open_branches: list = []
        # Handlers the code registered (runtime.replay.handlers), by name: queries, updates (with their
        # validators) and signals.
        self._query_handlers: dict[str, Callable[..., Any]] = {}
        self._update_handlers: dict[str, Callable[..., Any]] = {}
        self._update_validators: dict[str, Callable[..., Any]] = {}
        self._signal_handlers: dict[str, Callable[..., Any]] = {}
        # The name of the update or signal handler running now (it may not make durable calls).
        self._in_handler = ""
        self._pool: AttemptPool | None = None
        # The exit unwinding the code now, if the engine is taking it off the executor (see ``durable``).
        self._exiting: EngineExit | None = None
        # The executor this execution took the run over from: it held the run running and stopped (died, or
        # its lease ran out). Every attempt begins right after a commit of all that came before it, so until
        # this execution records something new, an attempt it begins may repeat one that executor had begun:
        # that one counts as lost (runtime.replay.attempts). Cleared by the first new write.
        self._taken_over_from = claim.previous_owner if claim.previous_status == RunStatus.RUNNING else ""
        # Cancellation (design 9.2): delivered once, at the first durable call that would wait or do new work
        # after the request; from then on durable calls raise it again, except inside ``with ctx.cleanup():``.
        self._cancel_delivered = False
        self._cleanup_depth = 0
        # Streams this execution closed (or replayed the close of): writing to one again is refused.
        self._closed_streams: set[str] = set()

    @property
    def workflow_id(self) -> str:
        return self._claim.run.workflow_id

    @property
    def run_id(self) -> uuid.UUID:
        return self._claim.run.run_id

    @property
    def is_replaying(self) -> bool:
        """True while the code is re-walking operations already in the journal."""
        return self._seq < self._journal_end

    @property
    def is_parking(self) -> bool:
        """True while the code unwinds because the engine takes the run off this executor (it parks to wait,
        the worker stops or hands it back, it was taken away, it continues as new) rather than because the
        workflow ends: a ``finally:`` block can tell its two cases apart. Durable calls made now re-raise at
        once and ``ctx.logger`` is silent; the same block runs for real when the workflow really ends."""
        return self._exiting is not None

    @property
    def cancel_requested(self) -> bool:
        """True once the run's cancel was requested (its code sees, or has seen, weft.CancelledError)."""
        return self._claim.cancel_requested or self._claim.run.cancel_requested_at is not None

    @contextlib.contextmanager
    def cleanup(self) -> Iterator[None]:
        """``with ctx.cleanup():`` durable calls run again in a cancelled run (to compensate, release, notify),
        bounded by the workflow's ``cleanup_timeout`` counted from the cancel request, after which the run is
        terminated. Outside a cancelled run it changes nothing."""
        here = running_branch.get()
        owner = here if here is not None and getattr(here, "_root", None) is self else self  # a branch's code
        owner._cleanup_depth += 1
        try:
            yield
        finally:
            owner._cleanup_depth -= 1

    def _cancel_reason(self) -> str:
        run = self._claim.run
        if run.cancel_requested_at is None and self._claim.cancel_requested:  # requested while this execution ran
            run.cancel_reason = Workflow.objects.filter(pk=run.pk).values_list("cancel_reason", flat=True).first() or ""
            run.cancel_requested_at = clock.now()
        return run.cancel_reason

    def _cancelled(self) -> CancelledError:
        reason = self._cancel_reason()
        return CancelledError(f"the run's cancel was requested: {reason}" if reason else
                              "the run's cancel was requested", reason=reason)

    def _cancel_due(self) -> bool:
        """The cancel must be delivered at the call being made (a dry replay only follows the journal)."""
        return not self._cleanup_depth and not self._dry and self.cancel_requested

    def _deliver_cancel(self, seq: int, kind: str, name: str, step: WorkflowStep | None) -> CancelledError:
        """The call at ``seq`` raises the cancel: its row says so (replays raise it there again), a timer it waited
        on is dropped, the branches still open are cancelled."""
        exc = self._cancelled()
        now = clock.now()
        self._cancel_branches()
        timer = self._timers.pop(seq, None)
        if timer is not None:
            self._defer(journal.FireTimer(timer.pk, now))
        if step is not None and kind == StepKind.ACTIVITY:  # an async attempt's token dies with the wait
            for pk in AsyncActivity.objects.filter(run_id=self.run_id, seq=seq, status=AsyncStatus.PENDING
                                                   ).values_list("pk", flat=True):
                self._defer(journal.ResolveAsync(pk, AsyncStatus.CANCELLED, now))
        self._defer(self._record(self._step(
            seq, kind, name, StepStatus.CANCELLED, attempt=step.attempt if step else 1,
            error={"type": "CancelledError", "message": str(exc), "delivered": True},
            started=step.started_at if step else now, finished=now, failure_category=FailureCategory.CANCELLATION,
        ), step))
        self._cancel_delivered = True
        return exc

    def _cancel_branches(self) -> None:
        """Overridden where branches live (runtime.replay.branches)."""

    def _next(self, kind: str, name: str, *, branch: bool = False) -> tuple[int, WorkflowStep | None]:
        """The next position and its journal row. A cancel not delivered yet is delivered here if the call would
        wait or do new work (a ``branch`` started before the cancel is rebuilt: the wait for it raises)."""
        if self._in_handler or self._in_transaction:  # (the check, not its message, is on every step's path)
            self._refuse_in_handler(f"{kind} {name!r}")
        self._seq += 1
        seq = self._seq
        step = self._journal.get(seq)
        if step is not None and (step.kind != kind or step.name != name):
            hint = (f"; the code no longer asks for the patch {step.name!r}: keep ctx.deprecate_patch({step.name!r}) "
                    "there until no open run has its marker") if step.kind == StepKind.PATCH else (
                "; guard a change with ctx.patched(change_id), or run manage.py weft_replay_check before a deploy")
            raise NonDeterminismError(
                f"step {seq} of run {self.run_id}: the journal recorded {step.kind} {step.name!r} but the "
                f"workflow code now asks for {kind} {name!r}; workflow code must make the same durable "
                f"calls in the same order on every replay{hint}",
                seq=seq, recorded=f"{step.kind} {step.name!r}", requested=f"{kind} {name!r}",
            )
        if step is not None and step.status == _CANCELLED and (step.error or {}).get("delivered"):
            self._cancel_delivered = True  # the cancel was delivered here
            raise self._cancelled()
        if step is None and seq > self._max_history:
            raise HistoryLimitReached(seq, self._max_history)
        if (step is None or (step.status == _WAITING and not branch)) and self._cancel_due():
            raise self._deliver_cancel(seq, kind, name, step)
        self._between_operations(step)
        return seq, step

    # Set once a branch of workflow code (ctx.start_branch, an update handler making durable calls) has a context of
    # its own, which holds the branch's rows (runtime.replay.code_branches).
    _ran_branch_code = False
    # The @weft.transaction function running now, if any (runtime.replay.transactions): it may make no durable call.
    _in_transaction = ""
    # An operator's controls of the run's steps (models.StepControl), loaded once if the run has any.
    _controls: dict[int, StepControl] | None = None

    def _step_control(self, seq: int) -> StepControl | None:
        if not self._claim.run.has_step_controls:
            return None
        if self._controls is None:
            self._controls = {c.seq: c for c in StepControl.objects.filter(run_id=self.run_id)}
        return self._controls.get(seq)

    def _retries_paused(self, seq: int) -> bool:
        control = self._step_control(seq)
        return control is not None and control.retries_paused

    def _with_controls(self, definition: ActivityDefinition, seq: int) -> ActivityDefinition:
        """``definition`` as an operator changed it for step ``seq`` (its retry policy, timeouts, attempt count)."""
        control = self._step_control(seq)
        if control is None:
            return definition
        retry = dataclasses.replace(definition.retry, **control.retry) if control.retry else definition.retry
        if control.attempts_reset_after:
            retry = ResetRetryPolicy(**{f.name: getattr(retry, f.name) for f in dataclasses.fields(RetryPolicy)},
                                     counted_after=control.attempts_reset_after)
        return dataclasses.replace(
            definition, retry=retry,
            timeout=definition.timeout if control.timeout is None else control.timeout,
            schedule_to_close_timeout=(definition.schedule_to_close_timeout if control.schedule_to_close_timeout
                                       is None else control.schedule_to_close_timeout))

    def _refuse_in_handler(self, what: str) -> None:
        if self._in_transaction:
            raise InvalidArgument(
                f"@weft.transaction {self._in_transaction!r} asked for {what}: a transaction step runs inside a "
                "database transaction and may not call activities, sleep or wait; make those calls in the workflow "
                "before or after it")
        if self._in_handler:
            raise InvalidArgument(
                f"the handler {self._in_handler} asked for {what}: update and signal handlers run between the "
                "workflow's operations and may only change its state; make durable calls in the workflow (for "
                "example after ctx.wait_condition)")

    def _between_operations(self, step: WorkflowStep | None) -> None:
        """Called by every operation once it has its position (runtime.replay.inbox applies updates and
        handled signals here)."""

    def _before_new_work(self, *, side_effects: bool) -> None:
        """Check before doing anything not yet recorded.

        Stops if the worker is stopping or lost the run. Before work with side effects (an activity, a
        side effect function) the deferred writes commit, so nothing touches the world while an earlier
        step's result could still be lost.
        """
        self._check_new_work()
        if side_effects:
            self._commit_deferred()

    def _check_new_work(self) -> None:
        """Refuse new work where there may be none: in a handler, in a dry replay, in a run this executor lost
        or must hand back."""
        self._refuse_in_handler("new work")
        if self._dry:
            raise ReplayFrontier()
        if self._claim.lost:
            raise StopExecution(release=False)
        if self._should_stop():
            raise StopExecution(release=True)

    def _commit_deferred(self) -> None:
        if self._claim.deferred:
            self._commit()

    def _commit(self, writes: Sequence[journal.JournalWrite] = ()) -> None:
        if self._dry:
            raise ReplayFrontier()
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
        return StopExecution(release=False, fail_with=refused_by_database(exc, f"step {self._seq}", step=self._seq))

    def _park(self, *, wake_at: datetime | None, reason: str, writes: Sequence[journal.JournalWrite] = (),
              awaiting_signals: Sequence[str] = ()) -> NoReturn:
        if self._dry:
            raise ReplayFrontier()
        # A signal with a handler wakes any wait: its handler may be what the run waits for.
        awaiting_signals = [*awaiting_signals, *(n for n in self._signal_handlers if n not in awaiting_signals)]
        try:
            transitions.park(self._claim, clock.now(), wake_at=wake_at, reason=reason, writes=writes,
                             awaiting_signals=awaiting_signals)
        except FencingError:
            raise StopExecution(release=False) from None
        except DatabaseError as exc:
            raise self._commit_failed(exc) from exc
        if self._sticky is not None and self._sticky.park_here():
            raise ResumeOperation()  # the run's next claim, here: the call runs again from its position
        raise Suspend()

    # The last position code that stayed parked had reached (see ``resume``).
    _live_seq = 0
    # The greenlet this execution's code runs in, where it may stay parked (runtime.sticky_runs).
    _sticky: Any = None

    def resume(self, claim: transitions.Claim, timers: dict[int, Timer], should_stop: Callable[[], bool]) -> None:
        """Take the run's next claim, for code that stayed parked (runtime.sticky_runs): what an execution
        starts afresh is reset as a new context would have it; what the journal holds stays."""
        claim.has_dependents = claim.has_dependents or self._claim.has_dependents
        claim.slot_seqs |= self._claim.slot_seqs
        self._claim = claim
        self._timers = timers
        self._should_stop = should_stop
        self._consumed_up_to = {}
        self._last_info = None
        self._taken_over_from = ""  # the claim right after this code's own park: nobody held the run between
        # The call that parked runs again from its position; the handler rows it applied after that position
        # before parking are applied already (runtime.replay.inbox), not replayed.
        self._live_seq = self._seq
        for name in ("_controls", "_unhandled", "_applied_now", "_owners"):
            self.__dict__.pop(name, None)  # back to the class's default: loaded again when needed

    def _defer(self, write: journal.JournalWrite) -> None:
        """Fold a write into the run's next commit (made before the next side effect, at the latest when
        the run parks, finishes or is handed back). Only deterministic workflow code runs in between, so
        a crash in that window only repeats what at-least-once already allows."""
        if not self._dry:
            self._claim.deferred.append(write)
            if not isinstance(write, journal.InsertAttempt):
                self._taken_over_from = ""

    def _step(self, seq: int, kind: str, name: str, status: str, *, attempt: int = 1,
              result: bytes | memoryview | None = None, error: dict | None = None, started: datetime,
              finished: datetime | None, failure_category: str = "") -> WorkflowStep:
        return new_instance(WorkflowStep, dict(
            run_id=self.run_id, seq=seq, kind=kind, name=name[:255], status=status, attempt=attempt,
            result=result, error=error, started_at=started, finished_at=finished, failure_category=failure_category,
        ))

    def _record(self, step: WorkflowStep, existing: WorkflowStep | None) -> journal.JournalWrite:
        """The write that stores ``step`` (new, or replacing ``existing``); the journal sees it at once."""
        self._journal[step.seq] = step
        self._journal_end = max(self._journal_end, step.seq)
        if existing is None:
            return journal.InsertStep(step)
        step.pk = existing.pk
        return journal.UpdateStep(step)

    def assert_journal_consumed(self) -> None:
        """The code finished; a longer journal means it skipped operations it made before."""
        if self._seq < self._journal_end:
            extra = self._journal[min(seq for seq in self._journal if seq > self._seq)]
            raise NonDeterminismError(
                f"run {self.run_id}: the workflow returned after {self._seq} step(s), but the journal "
                f"recorded steps up to {self._journal_end}; step {extra.seq} was {extra.kind} {extra.name!r}",
                seq=extra.seq, recorded=f"{extra.kind} {extra.name!r}", requested="the workflow's return",
            )


def run_workflow_code(ctx: ReplayCore, definition: WorkflowDefinition, data: bytes | memoryview | None) -> Any:
    """Call the workflow's function on ``ctx`` with its decoded input; what it returns.

    Code that swallows the engine's exit while it unwinds (``except BaseException: return ...``) cannot keep
    the run: the exit is raised again, whatever the code returned or raised instead."""
    try:
        value = definition.fn(ctx, decode(data)) if definition.takes_input else definition.fn(ctx)
    except BaseException as exc:
        exiting = ctx._exiting
        if exiting is None or exc is exiting:
            raise
        logger.warning("run %s: the workflow's code raised %s while the engine took it off the executor (%s); "
                       "the run goes on where it was", ctx.run_id, type(exc).__name__, type(exiting).__name__)
        raise exiting from None
    if ctx._exiting is not None:
        logger.warning("run %s: the workflow's code swallowed the engine's %s and returned; the run goes on where it "
                       "was (let BaseException through: catch Exception instead)", ctx.run_id,
                       type(ctx._exiting).__name__)
        raise ctx._exiting
    return value
