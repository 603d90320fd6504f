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
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from django.core.signals import setting_changed

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


_entries: OrderedDict[Hashable, Replayed] = OrderedDict()
_rows = 0
_guard = threading.Lock()


def key_of(run: Workflow) -> Hashable | None:
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
    with _guard:
        entry = _entries.get(key)
        if entry is not None:
            _entries.move_to_end(key)
            return entry
    ctx, stopped = replay()
    entry = Replayed(ctx, stopped, rows=len(ctx._journal))
    if MIN_ROWS <= entry.rows <= limit:
        _keep(key, entry, limit)
    return entry


def _keep(key: Hashable, entry: Replayed, limit: int) -> None:
    global _rows
    with _guard:
        if key in _entries:
            return  # another thread replayed the same state meanwhile
        # An older key of the same run is of a journal that has since moved: never looked up again.
        for stale in [k for k in _entries if k[0] == key[0]]:  # type: ignore[index]
            _rows -= _entries.pop(stale).rows
        _entries[key] = entry
        _rows += entry.rows
        while _rows > limit:
            _, dropped = _entries.popitem(last=False)
            _rows -= dropped.rows


def clear() -> None:
    """Forget every kept replay (a deploy of new code in this process, tests)."""
    global _rows
    with _guard:
        _entries.clear()
        _rows = 0


def _codec_changed(*, setting: str, **kwargs: Any) -> None:
    # Rows kept sealed with a key the new ring may not hold (in production a ring changes with a restart).
    if setting == "WEFT_PAYLOAD_CODEC":
        clear()


setting_changed.connect(_codec_changed, dispatch_uid="django_weft.replay_cache")
