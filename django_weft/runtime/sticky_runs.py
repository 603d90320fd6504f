"""Workflow code kept suspended where its run parked, so the run's next wake on the same thread goes on from there
instead of replaying its journal (design 9.7; Temporal's sticky execution).

The code of each execution runs in a greenlet of the executor's thread. When the run parks (its state committed,
runtime.replay.core.ReplayCore._park) and nothing but the code itself holds the execution (no branches, no pool of
attempts, no transaction it opened), the greenlet switches back to the executor instead of unwinding, and stays here
with its context. The run's next claim takes it back only under the rule the kept journals follow
(runtime.kept_journals): the claim's fence is the parked fence + 1, so no other executor held the run in between,
and the database holds as many journal rows as the context; and only while the same workflow definition is
registered. The context then takes the new claim's per-execution state, and the durable call that parked runs
again from its position, as the same call does at the frontier of a replay. Otherwise the code is let go.

Letting code go unwinds it exactly as a park did before: the call it waits in raises the engine's ``Suspend``,
``finally:`` blocks see ``ctx.is_parking`` and every durable call made while it unwinds raises again. Nothing it
does can commit: every write is fenced, and the fence has moved. Code is let go in the thread that runs it (a
greenlet runs only there), so each thread keeps its own, up to ``WEFT_STICKY_ROWS`` journal rows, the least
recently parked let go first (each run's code counts as CODE_ROWS more); 0 keeps none.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import greenlet
from django.db import connection

from django_weft.common.registry import WorkflowDefinition
from django_weft.common.row_bounded_cache import RowBoundedCache
from django_weft.conf import weft_settings
from django_weft.runtime.errors import EngineExit

logger = logging.getLogger("django_weft.executor")

# What one run's suspended code weighs against WEFT_STICKY_ROWS besides its journal: its frames and greenlet take
# about as much memory as this many journal rows (about 6 KB a greenlet measured, more for a deep call stack), so
# thousands of short parked runs cannot hold memory that their rows alone would not count.
CODE_ROWS = 20

_PARKED = object()  # what the code's greenlet hands the executor when it stays parked
_RESUME = object()  # what the executor hands it back to go on


class StickyCode:
    """One execution's workflow code in a greenlet of its own, started, resumed and let go by the executor."""

    def __init__(self, ctx: Any, definition: WorkflowDefinition, body: Callable[[], Any]) -> None:
        self.ctx = ctx
        self.definition = definition
        self.parked_at = 0
        self._thread = threading.get_ident()
        self._greenlet = greenlet.greenlet(lambda *_: self._run(body))
        self._let_go = False
        self._atomic_depth = 0
        ctx._sticky = self

    def _run(self, body: Callable[[], Any]) -> Any:
        try:
            return body()
        except EngineExit:
            if self._let_go:
                return None  # unwound as a park does: nothing to report
            raise

    def switch_in(self) -> tuple[bool, Any]:
        """Run the code (first call) or go on where it parked: (True, None) when it parks again and stays, else
        (False, what the workflow returned); raises what the code raises (the engine's exits among it)."""
        value = self._switch(_RESUME)
        return (True, None) if value is _PARKED else (False, value)

    def park_here(self) -> bool:
        """Called by the code once its park is committed: stay suspended here if this execution may. True when
        the run's next claim resumed it (the durable call runs again); False: unwind as a park does."""
        if not self._may_stay():
            return False
        try:
            signal = self._greenlet.parent.switch(_PARKED)
        except greenlet.GreenletExit:  # collected without being let go (its thread or process is ending)
            signal = None
        if signal is _RESUME:
            return True
        self._let_go = True
        return False

    def let_go(self) -> None:
        """Unwind the suspended code as a park does (in the thread that runs it)."""
        if self._greenlet.dead or not self._greenlet:
            return
        try:
            self._switch(None)
        except EngineExit:
            pass
        except Exception:
            logger.exception("run %s: its workflow code raised while it was let go", self.ctx.run_id)

    def _switch(self, signal: Any) -> Any:
        # Back to the caller each time, and with the caller's context (the pass's time, a tracing span).
        self._atomic_depth = len(connection.atomic_blocks)
        self._greenlet.parent = greenlet.getcurrent()
        self._greenlet.gr_context = contextvars.copy_context()
        return self._greenlet.switch(signal)

    def _may_stay(self) -> bool:
        ctx = self.ctx
        limit = int(weft_settings.STICKY_ROWS or 0)
        return (
            0 < len(ctx._journal) + CODE_ROWS <= limit
            and greenlet.getcurrent() is self._greenlet
            and threading.get_ident() == self._thread
            and not ctx._open_branches
            and ctx._pool is None
            and ctx.whole_journal() is not None  # no branches of workflow code
            # The code opened no transaction it would leave open while other code uses the connection.
            and len(connection.atomic_blocks) == self._atomic_depth
        )


_local = threading.local()


def _kept() -> RowBoundedCache[Any, StickyCode]:
    kept = getattr(_local, "kept", None)
    if kept is None:
        # Live code, not rows decoded with the codec's keys: a codec change does not empty it.
        kept = _local.kept = RowBoundedCache(emptied_by_codec_change=False)
    return kept


def take(run_id: Any, fence: int, definition: WorkflowDefinition) -> StickyCode | None:
    """The code this thread keeps parked for run ``run_id``, if the claim at ``fence`` is the very next one and
    ``definition`` is still what runs it; None otherwise (and code kept for an earlier state is let go)."""
    code = _kept().pop(run_id)
    if code is None:
        return None
    if fence == code.parked_at + 1 and definition is code.definition:
        return code
    code.let_go()
    return None


def keep(run_id: Any, fence: int, code: StickyCode) -> None:
    """Keep ``code``, parked at ``fence``; let go of what no longer fits."""
    code.parked_at = fence
    rows, limit = len(code.ctx._journal) + CODE_ROWS, int(weft_settings.STICKY_ROWS or 0)
    for dropped in _kept().put(run_id, code, rows=rows, limit=limit):
        dropped.let_go()


def let_go_all() -> None:
    """Let go of every run's code this thread keeps (tests; a worker thread that stops)."""
    for code in _kept().drain():
        code.let_go()


_abandoned: list[Any] = []


def _after_fork() -> None:
    # Greenlets of the parent's threads cannot run here; collecting them would unwind code the parent owns. Keep
    # them unreachable but alive.
    kept = getattr(_local, "kept", None)
    if kept is not None:
        _abandoned.extend(kept.drain())


os.register_at_fork(after_in_child=_after_fork)
