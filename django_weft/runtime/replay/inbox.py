"""Updates and handled signals, applied between the workflow's operations, and ``ctx.wait_condition``.

Every operation, once it has its journal position P, first re-applies the handler rows the journal holds
right after P (updates and handled signals an earlier execution applied there), then, at the run's frontier,
applies what arrived since (pending updates, and signals that have a handler), in arrival order, each at the
next position. A replay therefore runs each handler at the same point of the code as the first execution:
after the code that led to operation P, before P's outcome reaches the code.

At the frontier every operation looks at the database (one indexed query, only when the code has handlers),
so an update is applied at the run's next durable call. An update whose handler the code has not registered
yet holds back the ones after it (arrival order); if the run parks with it still unhandled, it fails (its
caller is told) and the run wakes at once to apply the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn, cast

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.durations import to_seconds
from django_weft.common.positions import BRANCH_BASE, BRANCH_SPAN, MAX_BRANCH_START
from django_weft.exceptions import InvalidArgument, NonDeterminismError, PayloadError
from django_weft.models import (
    Signal,
    StepKind,
    StepStatus,
    Timer,
    TimerPurpose,
    UpdateStatus,
    WorkflowStep,
    WorkflowUpdate,
)
from django_weft.runtime.errors import HistoryLimitReached, error_category, error_dict
from django_weft.runtime.replay.code_branches import HandlerBranch
from django_weft.runtime.replay.core import durable
from django_weft.runtime.replay.handlers import Handlers
from django_weft.runtime.replay.signals import Signals
from django_weft.store import journal

HANDLER_KINDS = (StepKind.UPDATE, StepKind.SIGNAL_HANDLER)


class _Applied:
    """The update a handler branch answers (its pk, for the reply, and its name)."""

    def __init__(self, pk: int | None, name: str) -> None:
        self.pk, self.name = pk, name


class Inbox(Signals, Handlers):
    """The replay context's updates, handled signals and conditions (mixed into runtime.context.Context)."""

    # Updates applied by this execution whose rows are not committed yet.
    _applied_now: frozenset[int] = frozenset()
    # Updates the code had no handler for when they came up (they hold back the ones after them).
    _unhandled: tuple[WorkflowUpdate, ...] = ()

    @durable
    def wait_condition(self, predicate: Callable[[], Any], timeout: float | timedelta | None = None) -> bool:
        """Wait until ``predicate()`` is true (an update or signal handler changed the state it reads); True
        then, False if ``timeout`` passed first (a durable timer, like ``sleep``). The predicate is evaluated
        now and after each handler the run applies; it must only read the workflow's state."""
        if not callable(predicate):
            raise InvalidArgument(f"wait_condition needs a callable predicate, got {predicate!r}")
        seconds = None if timeout is None else to_seconds(timeout, "wait_condition timeout", allow_zero=True)
        seq, step = self._next(StepKind.CONDITION, "condition")
        if step is not None and step.status != StepStatus.WAITING:
            return bool(decode(step.result))
        self._before_new_work(side_effects=False)
        now = clock.now()
        timer = self._timers.get(seq)
        met = bool(self._call_handler(predicate, None, "wait_condition's predicate"))
        timed_out = (seconds == 0 and step is None) or (timer is not None and timer.fire_at <= now)
        if met or timed_out:
            if timer is not None:
                self._defer(journal.FireTimer(timer.pk, now))
            self._defer(self._record(self._step(seq, StepKind.CONDITION, "condition", StepStatus.COMPLETED,
                                                result=encode(met), started=step.started_at if step else now,
                                                finished=now), step))
            return met
        reason = "waiting for a condition (an update or a handled signal)"
        if step is not None:
            self._park(wake_at=timer.fire_at if timer else None, reason=reason)
        writes: list[journal.JournalWrite] = [self._record(self._step(
            seq, StepKind.CONDITION, "condition", StepStatus.WAITING, started=now, finished=None), None)]
        wake_at = None
        if seconds is not None:
            wake_at = now + timedelta(seconds=seconds)
            writes.append(journal.InsertTimer(Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.WAIT_TIMEOUT,
                                                    fire_at=wake_at)))
            reason += f" until {wake_at.isoformat()}"
        self._park(wake_at=wake_at, reason=reason, writes=writes)

    # --- between operations ---

    def _between_operations(self, step: WorkflowStep | None) -> None:
        row = self._journal.get(self._seq + 1)
        if row is not None and row.kind in HANDLER_KINDS:
            # Code that stayed parked (runtime.sticky_runs) applied these rows itself before it parked: it goes on
            # past them, and replays only what it did not apply.
            while row is not None and row.kind in HANDLER_KINDS and row.seq <= self._live_seq:
                self._seq = row.seq
                row = self._journal.get(self._seq + 1)
            self._replay_handled()
        if self._dry or not (self._update_handlers or self._signal_handlers) or self._seq < self._journal_end:
            return
        if not self._claim.lost:
            self._apply_arrived()

    def _park(self, *, wake_at: datetime | None, reason: str, writes: Sequence[journal.JournalWrite] = (),
              awaiting_signals: Sequence[str] = ()) -> NoReturn:
        """An update still without a handler where the run waits cannot be applied: it fails, and the run
        wakes at once for what it held back."""
        unhandled = [u for u in self._unhandled if u.name not in self._update_handlers]
        if unhandled and not self._dry:
            now = clock.now()
            known = ", ".join(repr(n) for n in sorted(self._update_handlers)) or "none"
            for update in unhandled:
                error = {"type": "UpdateNotHandled", "message": f"the run's code registers no update handler "
                         f"{update.name!r} where it waits (step {self._seq}); it registers: {known}",
                         "registered": sorted(self._update_handlers)}
                self._defer(journal.ApplyUpdate(update.pk, UpdateStatus.FAILED, None, None, error, now))
            wake_at = now
        super()._park(wake_at=wake_at, reason=reason, writes=writes, awaiting_signals=awaiting_signals)

    def _replay_handled(self) -> None:
        """Re-apply the handler rows recorded right after the current position."""
        while (row := self._journal.get(self._seq + 1)) is not None and row.kind in HANDLER_KINDS:
            if row.kind == StepKind.UPDATE:  # its row holds the payload it was applied with, and the reply
                recorded = decode(row.result)
                payload, handler = recorded["payload"], self._update_handlers.get(row.name)
                if handler is not None and (row.status == StepStatus.WAITING or self._has_branch_rows(row.seq)):
                    self._seq = row.seq  # a handler that called durable operations runs again as a branch
                    branch = HandlerBranch(cast(Any, self), row.seq, row, _Applied(recorded.get("update"), row.name),
                                           handler, payload)
                    if not branch.settled:
                        self._open_branches.append(branch)
                    continue
            else:
                payload, handler = decode(row.result), self._signal_handlers.get(row.name)
            signal = row.kind == StepKind.SIGNAL_HANDLER
            if handler is None:
                raise self._mismatch(row, f"the code registers no handler for {row.name!r} here")
            try:
                self._call_handler(handler, payload, f"{row.kind} {row.name!r}", always_pass=signal)
            except Exception as exc:
                if row.status != StepStatus.FAILED:
                    raise self._mismatch(row, f"its handler now raises {type(exc).__name__}: {exc}") from exc
            self._seq = row.seq  # after the call: while it runs the code is still replaying (the logger is silent)

    def _has_branch_rows(self, seq: int) -> bool:
        """Rows sit in the block of the branch started at ``seq`` (its handler called durable operations)."""
        starts = getattr(self, "_branch_starts", None)
        if starts is None:
            starts = self._branch_starts = {(n - BRANCH_BASE) // BRANCH_SPAN for n in self._branch_rows}
        return seq in starts

    def _mismatch(self, row: WorkflowStep, why: str) -> NonDeterminismError:
        label = "update" if row.kind == StepKind.UPDATE else "signal"
        return NonDeterminismError(
            f"step {row.seq} of run {self.run_id}: the journal applied {label} {row.name!r} there, but {why}; "
            "update and signal handlers must be registered, and behave, the same way on every replay",
            seq=row.seq, recorded=f"{row.kind} {row.name!r}", requested=why,
        )

    def _apply_arrived(self) -> None:
        """Apply the updates and handled signals that arrived, in arrival order; an update whose handler the
        code has not registered (yet) stops there, so none overtakes another."""
        arrivals: list[tuple[int, WorkflowUpdate | Signal]] = []
        if self._update_handlers:
            arrivals += [(u.sequence, u) for u in WorkflowUpdate.objects.filter(
                run_id=self.run_id, status=UpdateStatus.PENDING).exclude(pk__in=self._applied_now).order_by("sequence")]
        if self._signal_handlers:
            arrivals += [(s.sequence, s) for s in self._pending_signals(list(self._signal_handlers))]
        self._unhandled = ()
        ordered = [item for _, item in sorted(arrivals, key=lambda pair: pair[0])]
        for index, item in enumerate(ordered):
            if isinstance(item, WorkflowUpdate):
                if item.name not in self._update_handlers:
                    self._unhandled = tuple(u for u in ordered[index:] if isinstance(u, WorkflowUpdate)
                                            and u.name not in self._update_handlers)
                    break
                self._apply_update(item)
            else:
                self._apply_signal(item)

    def _take_position(self) -> int:
        seq = self._seq + 1
        if seq > self._max_history:
            raise HistoryLimitReached(seq, self._max_history)
        self._seq = seq
        return seq

    def _apply_update(self, update: WorkflowUpdate) -> None:
        seq = self._take_position()
        payload = decode(update.payload)
        handler = self._update_handlers[update.name]
        self._applied_now = self._applied_now | {update.pk}
        if self._dry or seq > MAX_BRANCH_START:
            self._update_applied(seq, None, update.pk, update.name, payload, *self._handler_outcome(handler, payload))
            return
        # Its handler runs as a branch at this position: at once to its end if it makes no durable call, else it
        # waits like a branch (the update is running) and its reply is sent when it returns.
        branch = HandlerBranch(cast(Any, self), seq, None, _Applied(update.pk, update.name), handler, payload)
        if not branch.settled:
            self._open_branches.append(branch)

    def _handler_outcome(self, handler: Callable[..., Any], payload: Any) -> tuple[Any, BaseException | None]:
        try:
            return self._call_handler(handler, payload, "an update handler"), None
        except Exception as exc:
            return None, exc

    def _update_applied(self, seq: int, existing: WorkflowStep | None, update_pk: int, name: str, payload: Any,
                        value: Any, exc: BaseException | None) -> None:
        """Record an update's outcome at ``seq`` (its row keeps the payload, so a replay applies it again from the
        journal alone, and the reply) and answer its caller."""
        now = clock.now()
        reply: bytes | None = None
        error = error_dict(exc) if exc is not None else None
        if error is None:
            try:
                reply = encode(value, what=f"the reply of update {name!r}")
            except PayloadError as bad:  # a reply that cannot be stored
                error, value = error_dict(bad), None
        status = StepStatus.FAILED if error else StepStatus.COMPLETED
        row = encode({"payload": payload, "reply": None if reply is None else value})
        self._defer(self._record(self._step(seq, StepKind.UPDATE, name, status, result=row, error=error,
                                            started=existing.started_at if existing else now, finished=now,
                                            failure_category=error_category(error) if error else ""), existing))
        self._defer(journal.ApplyUpdate(update_pk, UpdateStatus.FAILED if error else UpdateStatus.COMPLETED, seq,
                                        reply, error, now))

    def _on_update_running(self, branch: HandlerBranch) -> None:
        """The handler waits: its row waits (with the update's id, for the replay that finishes it) and its caller
        learns the update runs."""
        now = clock.now()
        row = self._step(branch.seq, StepKind.UPDATE, branch.update.name, StepStatus.WAITING,
                         result=encode({"payload": branch.payload, "reply": None, "update": branch.update.pk}),
                         started=now, finished=None)
        self._defer(self._record(row, None))
        branch._row = row
        self._defer(journal.ApplyUpdate(branch.update.pk, UpdateStatus.RUNNING, branch.seq, None, None, now))

    def _on_update_returned(self, branch: HandlerBranch, value: Any, exc: BaseException | None) -> None:
        existing = branch._row
        if existing is not None and existing.status != StepStatus.WAITING:
            return  # replayed: its outcome is recorded
        self._update_applied(branch.seq, existing, branch.update.pk, branch.update.name, branch.payload, value, exc)

    def all_handlers_finished(self) -> bool:
        """True when no update handler is still running (one that calls durable operations waits like a branch):
        ``ctx.wait_condition(ctx.all_handlers_finished)`` before the run returns or continues as new, so that no
        caller is left without its reply."""
        return not any(isinstance(branch, HandlerBranch) and not branch.settled for branch in self._open_branches)

    def _apply_signal(self, signal: Signal) -> None:
        # A signal handler's exception is the workflow's: it propagates (and fails the run) like code's.
        self._call_handler(self._signal_handlers[signal.name], decode(signal.payload), f"signal {signal.name!r}",
                           always_pass=True)
        seq = self._take_position()
        now = clock.now()
        self._consumed(signal)
        self._defer(journal.ConsumeSignal(signal.pk, now, seq, signal.name))
        self._defer(self._record(self._step(seq, StepKind.SIGNAL_HANDLER, signal.name, StepStatus.COMPLETED,
                                            result=signal.payload, started=now, finished=now), None))

    def _call_handler(self, handler: Callable[..., Any], payload: Any, label: str, *, always_pass: bool = False) -> Any:
        """Call a handler, refusing durable calls: with the payload (an update's only when it has one; a signal
        handler's always)."""
        outer, self._in_handler = self._in_handler, label
        try:
            return handler() if payload is None and not always_pass else handler(payload)
        finally:
            self._in_handler = outer

