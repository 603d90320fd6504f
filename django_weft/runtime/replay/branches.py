"""Parallel branches: ``ctx.start_activity``, ``ctx.start_timer`` and ``ctx.start_wait_for_signal`` begin a
branch and return a :class:`~.pending.Pending`; ``ctx.gather``, ``ctx.race`` and ``ctx.map`` wait for several.

Waiting polls the branches on the executor thread: a settled branch's row is committed at once (a crash
keeps it), running attempts are waited for, and when nothing runs and nothing can settle the run parks
until the earliest branch can (a timer, a signal, an async completion, a child finishing).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn, ParamSpec, TypeVar, overload

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.durations import to_seconds
from django_weft.exceptions import InvalidArgument
from django_weft.models import StepKind, StepStatus
from django_weft.runtime.activities import definition_of
from django_weft.runtime.attempt_pool import AttemptPool, in_callers_transaction
from django_weft.runtime.errors import StopExecution
from django_weft.runtime.replay.async_activities import AsyncActivityOps
from django_weft.runtime.replay.core import durable
from django_weft.runtime.replay.pending import ActivityBranch, Pending, SignalBranch, TimerBranch
from django_weft.runtime.replay.signals import Signals
from django_weft.runtime.replay.slots import SlotOps
from django_weft.runtime.replay.transactions import TransactionOps
from django_weft.store import journal

P = ParamSpec("P")
R = TypeVar("R")

# How often a wait with attempts running looks at branches that settle from outside (signals, async
# completions, children) and at the attempts' timeouts.
POLL_SECONDS = 0.2


class Branches(AsyncActivityOps, Signals, SlotOps, TransactionOps):
    """The replay context's parallel branches (mixed into runtime.context.Context)."""

    @overload
    def start_activity(self, fn: str, *args: Any, **kwargs: Any) -> Pending[Any]: ...
    @overload
    def start_activity(self, fn: Callable[P, Coroutine[Any, Any, R]], *args: P.args,
                       **kwargs: P.kwargs) -> Pending[R]: ...
    @overload
    def start_activity(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Pending[R]: ...

    @durable
    def start_activity(self, fn: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Pending[Any]:
        """Start an activity without waiting for it; it runs beside the workflow code in the run's attempt
        pool (WEFT_MAX_PARALLEL_ACTIVITIES at once). Retries, timeouts and async completion work as for
        ``ctx.run``; ``pending.result()`` (or ``ctx.gather``) waits for it."""
        definition = definition_of(fn)
        if definition.transactional:
            raise InvalidArgument(
                f"@weft.transaction {definition.name!r} runs inside the run's own transaction, so it cannot run "
                "beside other work: call ctx.run on it (in a branch of code, ctx.start_branch, to overlap it)")
        seq, step = self._next(StepKind.ACTIVITY, definition.name, branch=True)
        return self._started(ActivityBranch(self, seq, step, definition, args, kwargs))

    @durable
    def start_timer(self, duration: float | int | timedelta) -> Pending[None]:
        """A durable timer as a branch: it settles (with None) once ``duration`` has passed."""
        seconds = to_seconds(duration, "ctx.start_timer duration", allow_zero=True)
        seq, step = self._next(StepKind.SLEEP, "sleep", branch=True)
        if step is None:
            self._before_new_work(side_effects=False)
        return self._started(TimerBranch(self, seq, step, clock.now() + timedelta(seconds=seconds)))

    @durable
    def start_wait_for_signal(self, name_or_names: str | Sequence[str]) -> Pending[Any]:
        """A wait for a signal as a branch: it consumes the signal only when it settles (a branch that lost
        a race consumes nothing). For a list of names it settles with ``(name, payload)``."""
        names, several = self._signal_names(name_or_names, "start_wait_for_signal")
        seq, step = self._next(StepKind.SIGNAL, "|".join(names), branch=True)
        return self._started(SignalBranch(self, seq, step, names, several))

    @durable
    def gather(self, *pendings: Pending[Any], return_exceptions: bool = False) -> list[Any]:
        """Wait for every branch; return their values in the order given.

        If some fail, the others still settle (all are recorded); then the first failure in argument order
        is raised, or, with ``return_exceptions=True``, failures are returned in place of values.
        """
        branches = self._checked(pendings, "gather")
        for branch in branches:
            branch.take_position()
        self._wait_for(branches, first=False)
        values = []
        for branch in branches:
            try:
                values.append(branch.outcome())
            except Exception as exc:
                if not return_exceptions:
                    raise
                values.append(exc)
        return values

    @durable
    def race(self, *pendings: Pending[Any]) -> tuple[int, Any]:
        """Wait for the first branch to settle; return ``(index, value)`` (or raise its error).

        The winner is recorded, so a replay returns the same one. The others are cancelled: a timer is
        dropped, a signal wait consumes nothing, an activity is asked to stop (its ``weft.heartbeat()``
        raises ActivityCancelled) and its result is discarded, a child is cancelled unless it was started
        with ``parent_close_policy="abandon"``.
        """
        branches = self._checked(pendings, "race")
        for branch in branches:
            branch.take_position()
        seq, step = self._next(StepKind.RACE, "race")
        if step is not None:
            index = int(decode(step.result))
            if not branches[index].settled:  # recorded with the race; only a hand-edited journal lacks it
                self._wait_for([branches[index]], first=False)
        else:
            self._wait_for(branches, first=True)
            index = next(i for i, branch in enumerate(branches) if branch.settled)
            self._defer(self._record(self._step(seq, StepKind.RACE, "race", StepStatus.COMPLETED,
                                                result=encode(index), started=clock.now(), finished=clock.now()),
                                     None))
        for i, branch in enumerate(branches):
            if i != index and not branch.settled:
                branch.cancel(f"lost the race of step {seq} to step {branches[index].seq}")
        self._commit_deferred()
        return index, branches[index].outcome()

    @durable
    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], max_parallel: int | None = None) -> list[Any]:
        """Run ``fn`` as an activity for each item, at most ``max_parallel`` at once (and at most
        WEFT_MAX_PARALLEL_ACTIVITIES); return the results in item order, like ``gather``."""
        if max_parallel is not None and (not isinstance(max_parallel, int) or isinstance(max_parallel, bool)
                                         or max_parallel < 1):
            raise InvalidArgument(f"map's max_parallel must be an int >= 1 or None, got {max_parallel!r}")
        queue = list(items)
        if not queue:
            return []
        limit = max_parallel or max(1, len(queue))
        started: list[Pending[Any]] = []
        window: list[Pending[Any]] = []  # started and not settled yet
        while len(started) < len(queue) or window:
            while len(started) < len(queue) and len(window) < limit:
                branch = self.start_activity(fn, queue[len(started)])
                started.append(branch)
                window.append(branch)
            window = [branch for branch in window if not branch.settled]
            if window:
                self._wait_for(window, first=True)
                self._commit_deferred()
                window = [branch for branch in window if not branch.settled]
        return self.gather(*started)

    # --- waiting ---

    def _checked(self, pendings: Sequence[Pending[Any]], what: str) -> list[Pending[Any]]:
        if not pendings:
            raise InvalidArgument(f"ctx.{what} needs at least one branch")
        for pending in pendings:
            if not isinstance(pending, Pending) or pending._ctx is not self:
                raise InvalidArgument(f"ctx.{what} takes branches this run started (ctx.start_activity, "
                                      f"ctx.start_timer, ctx.start_wait_for_signal, ctx.start_child), got {pending!r}")
        return list(pendings)

    def _started(self, branch: Pending[R]) -> Pending[R]:
        if not branch.settled:
            self._open_branches.append(branch)
        return branch

    def _wait_for(self, branches: list[Pending[Any]], *, first: bool) -> None:
        """Return once every branch (``first``: one) settled, committing settled rows as they come; park
        when nothing runs and nothing can settle yet."""
        self._refuse_in_handler("a wait for branches")
        for branch in branches:
            branch.awaited = True  # ``done`` may say it settled from now on (replay-stable: waits replay too)
        if any(branch.cancelled_with_run for branch in branches):
            self._cancel_delivered = True  # the cancel was delivered in this wait
            raise self._cancelled()
        remaining = [branch for branch in branches if not branch.settled]
        if first and len(remaining) < len(branches):
            return
        while remaining:
            if self._cancel_due():
                exc = self._cancelled()
                self._cancel_branches()
                self._commit_deferred()
                self._cancel_delivered = True
                raise exc
            now = clock.now()
            unsettled = []
            for branch in remaining:
                branch.poll(now)
                if not branch.settled:
                    unsettled.append(branch)
                elif first:
                    return  # a race's winner is committed with the race's record
            remaining = unsettled
            # Settled rows are kept whatever happens next (with ``first``, nothing settled yet: what commits
            # here are retries scheduled and async attempts recorded).
            self._commit_deferred()
            running = [branch for branch in remaining if branch.running]
            if running:
                self._wait_running(running, remaining)
            elif remaining:
                self._park_on(remaining)

    def _wait_running(self, running: list[Pending[Any]], unsettled: list[Pending[Any]]) -> None:
        futures = [future for branch in running for future in branch.futures()]
        timeout = POLL_SECONDS
        wake = min((at for at in (b.wake_at() for b in unsettled) if at is not None), default=None)
        if wake is not None:
            timeout = max(0.0, min(timeout, (wake - clock.now()).total_seconds()))
        concurrent.futures.wait([f for f in futures if f is not None], timeout=timeout,
                                return_when=concurrent.futures.FIRST_COMPLETED)
        if self._claim.lost:
            raise StopExecution(release=False)

    def _park_on(self, branches: list[Pending[Any]]) -> NoReturn:
        unsettled = [branch for branch in branches if not branch.settled]
        for branch in unsettled:
            branch.park_writes()
        wakes = [at for at in (branch.wake_at() for branch in unsettled) if at is not None]
        names = sorted({name for branch in unsettled for name in branch.awaiting_signals()})
        if len(unsettled) == 1:
            reason = unsettled[0].reason()
        else:
            reason = f"waiting for {len(unsettled)} branches: " + "; ".join(b.reason() for b in unsettled)
        self._park(wake_at=min(wakes, default=None), reason=reason, awaiting_signals=names)

    def _cancel_branches(self) -> None:
        """The run's cancel is delivered: every branch still open is cancelled (attempts asked to stop, timers
        dropped, children's cancel requested) and waiting for it raises weft.CancelledError."""
        reason = self._cancel_reason()
        for branch in self._open_branches:
            if not branch.settled:
                branch.cancel(f"the run's cancel was requested: {reason}" if reason else
                              "the run's cancel was requested", with_run=True)
        self._open_branches = [branch for branch in self._open_branches if not branch.settled]

    def _attempt_pool(self) -> AttemptPool:
        if self._pool is None:
            self._pool = AttemptPool(inline=in_callers_transaction())
        return self._pool

    def _before_new_work(self, *, side_effects: bool) -> None:
        """Branches that settled meanwhile are recorded first, so their rows commit before the new work; with
        side effects, branches started before this call begin before it."""
        if self._open_branches:
            for branch in self._open_branches:
                if branch.running:
                    branch.poll_attempt()
            self._open_branches = [branch for branch in self._open_branches if not branch.settled]
        super()._before_new_work(side_effects=side_effects)
        if side_effects:
            self._begin_due()

    def _check_new_work(self) -> None:
        """A worker that is stopping (or a Celery task out of time) lets running attempts finish and records them
        before it hands the run back, as it lets a plain activity finish: they would run again otherwise. Due
        attempts do not begin."""
        if self._open_branches and not self._claim.lost and self._should_stop():
            self._settle_running()
            self._commit_deferred()
        super()._check_new_work()

    def _begin_due(self) -> None:
        for branch in self._open_branches:
            if isinstance(branch, ActivityBranch) and branch.due:
                branch.begin()

    def _settle_running(self) -> None:
        """Wait for the attempts running in the pool and record how they ended."""
        running = [branch for branch in self._open_branches if branch.running]
        while running:
            self._wait_running(running, [])
            for branch in running:
                branch.poll_attempt()
            running = [branch for branch in running if branch.running]

    def _drain_running(self) -> None:
        """Before the run parks: begin the attempts that are due, wait for every running attempt and record how
        it ended, and wait for the attempts that lost a race (their outcome is not used) to end."""
        self._begin_due()
        self._settle_running()
        while True:  # branches of workflow code go on as far as they can (a step done lets the next one begin)
            now = clock.now()
            for branch in list(self._open_branches):
                branch.advance(now)
            if not any(branch.running for branch in self._open_branches):
                break
            self._settle_running()
        if self._pool is not None:
            self._pool.wait_for_abandoned()

    def _park(self, *, wake_at: datetime | None, reason: str, writes: Sequence[journal.JournalWrite] = (),
              awaiting_signals: Sequence[str] = ()) -> NoReturn:
        """Before any park, running attempts finish and are recorded: a branch the code does not wait for
        yet would otherwise run again after the wake."""
        unsettled = [b for b in self._open_branches if not b.settled]
        self._drain_running()
        if any(b.settled for b in unsettled) and not self._dry:
            wake_at = clock.now()  # a branch ended meanwhile (an update's handler returned): the code looks again
        # Branches the code does not wait for yet that move on by themselves wake the run (Pending.wakes_the_run).
        open_branches = [b for b in self._open_branches if b.wakes_the_run and not b.settled]
        wakes = [at for at in (b.wake_at() for b in open_branches) if at is not None]
        awaiting_signals = [*awaiting_signals, *(name for b in open_branches for name in b.awaiting_signals()
                                                 if name not in awaiting_signals)]
        if wakes:
            wake_at = min([*wakes, *([wake_at] if wake_at is not None else [])])
        super()._park(wake_at=wake_at, reason=reason, writes=writes, awaiting_signals=awaiting_signals)

    def close_branches(self) -> None:
        """The execution ends: attempts still running are asked to stop and waited for (each at most until its
        timeout), and nothing more starts."""
        for branch in self._open_branches:
            if not branch.settled:
                branch.abandon("the run's execution ended without waiting for this branch")
        if self._pool is not None:
            self._pool.close()
