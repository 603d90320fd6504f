"""Branches of workflow code: ``ctx.start_branch(fn, *args)`` runs ``fn(ctx, *args)`` (several steps, waits, branches
of single operations) concurrently with its caller, and returns a :class:`~.pending.Pending` for its result.

A branch's code runs once per execution of the run, like the run's own code, on a thread of its own that takes turns
with the executor thread (:class:`Turns`: only one of them runs workflow code at any moment, on the executor's
database connection). Where the branch must wait it hands the turn back; its caller gives it a turn whenever it polls
it (while it waits, before the run parks), and it looks again. Its own positions are a block of the run's journal
(``BRANCH_BASE + start position * BRANCH_SPAN + n``), so the interleaving of branches never changes a position: replay,
crash recovery, the replay check, queries and fork see its rows like any others. The branch's row at its start
position is written (waiting) when it starts and settled when its code returns or raises.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from django.db import connections

from django_weft.common import clock
from django_weft.common.codec import encode
from django_weft.common.positions import BRANCH_SPAN, MAX_BRANCH_START, branch_block
from django_weft.exceptions import BranchCancelled, CancelledError, InvalidArgument
from django_weft.models import FailureCategory, StepKind, StepStatus, WorkflowStep
from django_weft.runtime.activities import definition_of
from django_weft.runtime.errors import EngineExit, ReplayFrontier, StopExecution, error_dict
from django_weft.runtime.replay.branches import Branches
from django_weft.runtime.replay.core import ResumeOperation, durable, running_branch
from django_weft.runtime.replay.pending import Pending
from django_weft.store import journal

T = TypeVar("T")

class BranchWaits:
    """What a branch waits for while it does not have the turn."""

    def __init__(self, wake_at: datetime | None, awaiting_signals: Sequence[str], reason: str) -> None:
        self.wake_at, self.awaiting_signals, self.reason = wake_at, list(awaiting_signals), reason


class Turns:
    """The executor thread and one branch's thread take turns: ``give()`` (executor) runs the branch until it
    ``hand_back()``s (it waits) or ends; only one of them runs at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._branch_turn = False

    def give(self) -> None:
        with self._cond:
            self._branch_turn = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._branch_turn)

    def hand_back(self, *, wait: bool = True) -> None:
        with self._cond:
            self._branch_turn = False
            self._cond.notify_all()
            if wait:
                self._cond.wait_for(lambda: self._branch_turn)

    def wait_for_turn(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._branch_turn)


class BranchOfCode(Pending[T]):
    """``ctx.start_branch``: a branch whose value is what its code returns."""

    wakes_the_run = True

    def __init__(self, ctx: Branches, seq: int, row: WorkflowStep | None, fn: Callable[..., Any], args: tuple,
                 kwargs: dict) -> None:
        super().__init__(ctx, seq, StepKind.BRANCH, _name_of(fn), row)
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self._cancel_reason: str | None = None
        self._cancelled_with_run = False
        self.code = _branch_context(ctx, seq)
        self.code._owner = self
        self._turns = Turns()
        self._thread: threading.Thread | None = None
        self._shared: list[Any] = []  # the executor's connections its thread borrows while it lives
        self._ended: tuple[str, Any] | None = None  # ("value" | "error" | "exit", what)
        self.poll(clock.now())
        if not self._settled and (row is None or row.status != StepStatus.WAITING):
            self._record_start()

    def _record_start(self) -> None:
        """Its start is recorded (a waiting row) with the run's next commit: a replay rebuilds it there."""
        self._write_row(StepStatus.WAITING, finished=False)

    # --- the branch's thread ---

    def _main(self, shared: dict[str, Any]) -> None:
        for alias, connection in shared.items():  # the executor's connections: one of the two threads runs at a time
            connections[alias] = connection
        running_branch.set(self.code)
        self._turns.wait_for_turn()
        code = self.code
        try:
            value = self._call()
            if code._exiting is not None:
                raise code._exiting
            self._ended = ("value", value)
        except BaseException as exc:
            self._ended = ("exit" if isinstance(exc, EngineExit) else "error", exc)
        finally:
            self._turns.hand_back(wait=False)

    def _call(self) -> Any:
        return self._fn(self.code, *self._args, **self._kwargs)

    def wait(self, waits: BranchWaits) -> None:
        """Called on the branch's thread where it must wait: hand the turn back until the caller polls it again; then
        raise what the execution ends with, if it ends."""
        self.code._waiting = waits
        self._turns.hand_back()
        self.code._waiting = None
        if self.code._stop is not None:
            raise self.code._stop

    # --- what the caller's code and the executor thread call ---

    def poll(self, now: datetime) -> None:
        """Give the branch a turn: it runs until it must wait again, or to its end."""
        if self._settled or (self._thread is not None and not self._thread.is_alive()):
            return  # settled, or a dry replay stopped inside it
        if self._thread is None:
            shared = {alias: connections[alias] for alias in connections if connections[alias].connection is not None}
            for connection in shared.values():
                connection.inc_thread_sharing()
            self._shared = list(shared.values())
            context = contextvars.copy_context()  # the fake clock of a test, the run's trace
            self._thread = threading.Thread(target=context.run, args=(self._main, shared), daemon=True,
                                            name=f"weft-branch-{self.seq}")
            self._thread.start()
        self._turns.give()
        if self._ended is not None:
            self._finish()

    def _finish(self) -> None:
        assert self._ended is not None and self._thread is not None
        self._thread.join()
        for connection in self._shared:
            connection.dec_thread_sharing()
        self._shared = []
        kind, what = self._ended
        if kind == "exit":
            if isinstance(what, ReplayFrontier):  # a dry replay reached new work inside it: it waits there
                self.code._waiting = BranchWaits(None, [], "a dry replay stops where new work begins")
                return
            raise what  # stop, lost, history limit: the whole execution unwinds
        if kind == "value":
            self._end(StepStatus.COMPLETED, result=encode(what, what=f"result of branch {self._name!r}"), value=what)
        elif isinstance(what, CancelledError):
            if self._cancel_reason is not None and not self._cancelled_with_run:  # it lost a race
                error, seen = self._cancellation(self._cancel_reason, False)
            else:
                error, seen = {"type": "CancelledError", "message": str(what)}, what
            self._end(StepStatus.CANCELLED, error=error, exc=seen, failure_category=FailureCategory.CANCELLATION)
        else:
            self._end(StepStatus.FAILED, error=error_dict(what), exc=what, failure_category=FailureCategory.APPLICATION)

    def _end(self, status: str, *, result: bytes | None = None, error: dict | None = None,
             exc: BaseException | None = None, value: Any = None, failure_category: str = "") -> None:
        if self._row is None or self._row.status != status:
            self._write_row(status, result=result, error=error, failure_category=failure_category)
        self._settle(value=value, error=exc)

    @property
    def running(self) -> bool:
        return any(branch.running for branch in self.code._open_branches)

    def futures(self) -> list[Any]:
        return [future for branch in self.code._open_branches for future in branch.futures()]

    def poll_attempt(self) -> None:
        for branch in self.code._open_branches:
            if branch.running:
                branch.poll_attempt()

    def wake_at(self) -> datetime | None:
        waits = self.code._waiting
        return None if self._settled or waits is None else waits.wake_at

    def awaiting_signals(self) -> list[str]:
        waits = self.code._waiting
        return [] if self._settled or waits is None else waits.awaiting_signals

    def reason(self) -> str:
        waits = self.code._waiting
        return f"branch {self._name} (step {self.seq}): {waits.reason if waits is not None else 'running'}"

    def cancel(self, reason: str, *, with_run: bool = False) -> None:
        """Cancelled (its run's cancel, or a race it lost): its code sees weft.CancelledError where it waits and may
        clean up in ``ctx.cleanup()``; it settles when its code ends."""
        if self._settled or self._cancel_reason is not None:
            return
        self._cancel_reason, self._cancelled_with_run = reason, with_run
        self.code._race_cancel = None if with_run else reason
        self.poll(clock.now())

    def advance(self, now: datetime) -> None:
        self.poll(now)

    def abandon(self, reason: str) -> None:
        """The execution ends: the branch's code unwinds where it waits (its ``finally:`` blocks make no durable
        call) and its thread ends."""
        for branch in self.code._open_branches:
            if not branch.settled:
                branch.abandon(reason)
        if self._thread is None or self._ended is not None or self._settled:
            return
        self.code._stop = self.code._stop or StopExecution(release=False)
        self._turns.give()
        if self._thread is not None:
            self._thread.join(5)
        for connection in self._shared:
            connection.dec_thread_sharing()
        self._shared = []
        self._settle(error=BranchCancelled(f"branch {self._name} (step {self.seq}) ended with its execution"))

    def _settle_from_row(self, row: WorkflowStep) -> bool:
        return False  # its code runs again (its rows answer), so it settles with what the code does


class HandlerBranch(BranchOfCode[Any]):
    """An update's handler, run as a branch at the update's position: if it calls durable operations it waits like a
    branch (the update is ``running``) and its reply is sent when it returns; if it does not, it is applied at once,
    exactly as a handler applied between operations."""

    def __init__(self, ctx: Branches, seq: int, row: WorkflowStep | None, update: Any, handler: Callable[..., Any],
                 payload: Any) -> None:
        self._update, self._handler, self._payload = update, handler, payload
        super().__init__(ctx, seq, row, handler, (), {})

    def _call(self) -> Any:
        return self._handler() if self._payload is None else self._handler(self._payload)

    def _record_start(self) -> None:
        """Its row waits (payload kept, no reply) and its caller learns the update runs."""
        self._ctx._on_update_running(self)  # type: ignore[attr-defined]

    def _end(self, status: str, *, result: bytes | None = None, error: dict | None = None,
             exc: BaseException | None = None, value: Any = None, failure_category: str = "") -> None:
        self._ctx._on_update_returned(self, value, exc)  # type: ignore[attr-defined]
        self._settle(value=value, error=exc)

    @property
    def update(self) -> Any:
        return self._update

    @property
    def payload(self) -> Any:
        return self._payload


def _name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class BranchContext(Branches):
    """Mixed in before the run's own context class: a branch's context, with the positions of its block and the
    run's claim, timers, attempt pool and cancel."""

    _root: Branches
    _block: int
    _race_cancel: str | None
    _owner: BranchOfCode[Any]
    _waiting: BranchWaits | None
    _stop: EngineExit | None

    def _attempt_pool(self) -> Any:
        return self._root._attempt_pool()

    @property
    def cancel_requested(self) -> bool:
        return self._race_cancel is not None or self._root.cancel_requested

    def _cancel_reason(self) -> str:
        return self._race_cancel if self._race_cancel is not None else self._root._cancel_reason()

    def _park(self, *, wake_at: datetime | None, reason: str, writes: Sequence[journal.JournalWrite] = (),
              awaiting_signals: Sequence[str] = ()) -> NoReturn:
        """A branch does not park the run: its writes join the run's next commit, and its code unwinds until the
        caller polls it again."""
        if self._dry:
            raise ReplayFrontier()
        for write in writes:
            self._defer(write)
            if isinstance(write, journal.InsertTimer) and write.timer.seq is not None:
                self._timers[int(write.timer.seq)] = write.timer
        self._owner.wait(BranchWaits(wake_at, awaiting_signals, reason))
        raise ResumeOperation()

    def _wait_for(self, branches: list[Pending[Any]], *, first: bool) -> None:
        """Poll the branches it waits for; unwind to wait if they have not settled."""
        self._refuse_in_handler("a wait for branches")
        for branch in branches:
            branch.awaited = True
        if any(branch.cancelled_with_run for branch in branches):
            self._cancel_delivered = True
            raise self._cancelled()
        if self._cancel_due() and not all(branch.settled for branch in branches):
            exc = self._cancelled()
            self._cancel_branches()
            self._cancel_delivered = True
            raise exc
        while True:
            now = clock.now()
            for branch in branches:
                branch.poll(now)
            self._commit_deferred()
            settled = [branch for branch in branches if branch.settled]
            if settled and (first or len(settled) == len(branches)):
                return
            waiting = [branch for branch in branches if not branch.settled]
            for branch in waiting:
                branch.park_writes()
            wakes = [at for at in (branch.wake_at() for branch in waiting) if at is not None]
            names = sorted({name for branch in waiting for name in branch.awaiting_signals()})
            self._owner.wait(BranchWaits(min(wakes, default=None), names,
                                         "; ".join(branch.reason() for branch in waiting)))
            if self._cancel_due() and not all(branch.settled for branch in branches):
                exc = self._cancelled()
                self._cancel_branches()
                self._cancel_delivered = True
                raise exc

    @durable
    def run(self, fn: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """In a branch an activity runs in the run's attempt pool, so the branch waits without holding the thread; a
        transaction step runs at once, on the run's connection, while the branch has the turn."""
        definition = definition_of(fn)
        if definition.transactional:
            return self._run_transaction(definition, args, kwargs)
        return self.start_activity(fn, *args, **kwargs).result()

    def start_branch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
        raise InvalidArgument("a branch cannot start branches of its own yet: start them from the workflow's code")

    def continue_as_new(self, input: Any = None) -> NoReturn:
        raise InvalidArgument("a branch cannot continue the run as new: return from it, then continue in the "
                              "workflow's code")

    def _refuse_handler(self, what: str) -> NoReturn:
        raise InvalidArgument(f"a branch cannot register {what}: register it in the workflow's code")

    def set_query_handler(self, name: str, handler: Callable[..., Any]) -> None:
        self._refuse_handler(f"query handler {name!r}")

    def set_update_handler(self, name: str, handler: Callable[..., Any], **kwargs: Any) -> None:
        self._refuse_handler(f"update handler {name!r}")

    def set_signal_handler(self, name: str, handler: Callable[[Any], Any]) -> None:
        self._refuse_handler(f"signal handler {name!r}")

    @property
    def info(self) -> Any:
        return self._root.info  # type: ignore[attr-defined]


_classes: dict[type, type] = {}


def _branch_context(root: Branches, seq: int) -> Any:
    """A context for the branch started at ``seq``: the run's own context class with BranchContext before it,
    sharing the run's claim, timers and consumed signals; its journal is the branch's block of rows."""
    kind = _classes.get(type(root))
    if kind is None:
        kind = _classes.setdefault(type(root), type(f"Branch{type(root).__name__}", (BranchContext, type(root)), {}))
    block = branch_block(seq)
    root._ran_branch_code = True  # its rows live in the branch's context, not in the run's journal
    rows = {n: row for n, row in root._branch_rows.items() if block < n < block + BRANCH_SPAN}
    code = kind(root._claim, {}, root._timers, root._should_stop, dry=root._dry)
    code._journal, code._branch_rows = rows, {}
    code._root, code._block, code._race_cancel = root, block, None
    code._waiting, code._stop = None, None
    code._seq = block
    code._journal_end = max(rows, default=block)
    code._max_history = block + min(BRANCH_SPAN - 1, code._max_history)
    code._consumed_up_to = root._consumed_up_to  # one run, one inbox
    code._closed_streams = root._closed_streams  # and one set of streams
    return code


class CodeBranches(Branches):
    """``ctx.start_branch`` (mixed into runtime.context.Context)."""

    def whole_journal(self) -> dict[int, WorkflowStep] | None:
        """The run's whole journal as this execution leaves it (what it loaded and what it wrote), or None where
        branches of code keep rows of their own."""
        if self._branch_rows or self._ran_branch_code:
            return None
        return self._journal

    @durable
    def start_branch(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Pending[T]:
        """Run ``fn(ctx, *args, **kwargs)``, workflow code with steps, waits and branches of its own, concurrently
        with this code; a Pending for what it returns (``result()``, ``ctx.gather``, ``ctx.race`` take it). A
        branch that loses a race, or whose run is cancelled, sees weft.CancelledError where it waits and may clean
        up in ``ctx.cleanup()``."""
        if not callable(fn):
            raise InvalidArgument(f"ctx.start_branch needs a function taking (ctx, ...), got {fn!r}")
        seq, step = self._next(StepKind.BRANCH, _name_of(fn), branch=True)
        if seq > MAX_BRANCH_START:
            raise InvalidArgument(f"ctx.start_branch at step {seq}: branches start within the first "
                                  f"{MAX_BRANCH_START} steps of a run; continue as new before")
        branch: BranchOfCode[T] = BranchOfCode(self, seq, step, fn, args, kwargs)
        return self._started(branch)
