"""The state of recently replayed runs, kept in this process so that queries and update admissions on a run whose
journal has not moved answer without replaying it again.

A run's journal only grows or changes while an executor holds it (status ``running``), and every claim, repair,
suspension and finish moves its fence: a run seen not running, at a given fence and ``updated_at``, has exactly
the journal it had the last time it was seen so. That triple (with the run's primary key) is the key; a run seen
running is never cached, and an entry whose key the run has left is never looked up again (fences only grow), so
it ages out. Nothing here writes: a stale entry could at worst answer a query, and none can be found.

Only replays of long journals are kept (short ones replay in about the time a lookup saves), up to
``WEFT_REPLAY_CACHE_ROWS`` journal rows in all, the least recently used dropped first; 0 turns it off. A query
handler must not change the run's state (as in Temporal): with the cache, what it changes is seen by the next
query until the run moves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_weft.common.row_bounded_cache import RowBoundedCache
from django_weft.conf import weft_settings
from django_weft.models import RunStatus, Workflow
from django_weft.runtime.context import Context

# Journals shorter than this are replayed each time: their replay costs about what a lookup saves.
MIN_ROWS = 200


@dataclass
class Replayed:
    """A dry replay's context (its handlers close over the state the code rebuilt) and what stopped it early.
    ``lock``: one handler call at a time on it (a handler runs with the context marked as in a handler)."""

    ctx: Context
    stopped: BaseException | None
    rows: int
    lock: threading.Lock = field(default_factory=threading.Lock)


_entries: RowBoundedCache[tuple[Any, ...], Replayed] = RowBoundedCache()


def key_of(run: Workflow) -> tuple[Any, ...] | None:
    """The run's cache key as this row shows it, or None when the row says its journal may be moving."""
    if run.status == RunStatus.RUNNING:
        return None
    return (run.pk, run.fence, run.status, run.updated_at)


def replayed(run: Workflow, replay: Callable[[], tuple[Context, BaseException | None]]) -> Replayed:
    """``run``'s replayed state: kept from an earlier replay at the same key, or ``replay()``'d now (and kept if
    its journal is long enough)."""
    key = key_of(run)
    limit = int(weft_settings.REPLAY_CACHE_ROWS or 0)
    if key is None or limit <= 0:
        return Replayed(*replay(), rows=0)
    entry = _entries.get(key)
    if entry is not None:
        return entry
    ctx, stopped = replay()
    entry = Replayed(ctx, stopped, rows=len(ctx._journal))
    if MIN_ROWS <= entry.rows <= limit:
        # replace=False: another thread may have kept the same state meanwhile. An older key of the same run is
        # of a journal that has since moved: never looked up again, so it goes now.
        _entries.put(key, entry, rows=entry.rows, limit=limit, replace=False, drop=lambda k: k[0] == key[0])
    return entry


def clear() -> None:
    """Forget every kept replay (a deploy of new code in this process, tests)."""
    _entries.clear()
