"""A process-wide map of replayed journals, bounded by the journal rows its entries hold in all.

Both caches of replayed state (services.replay_cache, runtime.kept_journals) keep entries whose cost in memory
is their journal's length, not their number, so the bound is a total of rows: the least recently used entry is
dropped first once a new one takes the total over the limit. Entries hold rows decoded with the payload codec's
keys, so a change of ``WEFT_PAYLOAD_CODEC`` (tests; in production a new key ring comes with a restart) empties
every cache made here.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from django.core.signals import setting_changed

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RowBoundedCache(Generic[K, V]):
    """A thread-safe LRU map whose bound is the sum of its entries' row counts."""

    def __init__(self, *, emptied_by_codec_change: bool = True) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._rows = 0
        self._guard = threading.Lock()
        if emptied_by_codec_change:
            _caches.add(self)

    def get(self, key: K) -> V | None:
        """The value kept at ``key`` (now the most recently used), or None."""
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def pop(self, key: K) -> V | None:
        """Remove and return the value kept at ``key``, or None."""
        with self._guard:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self._rows -= entry[1]
            return entry[0]

    def put(
        self,
        key: K,
        value: V,
        *,
        rows: int,
        limit: int,
        replace: bool = True,
        drop: Callable[[K], bool] | None = None,
    ) -> list[V]:
        """Keep ``value`` (``rows`` journal rows) at ``key``, then drop the least recently used entries until
        at most ``limit`` rows are kept. ``replace=False`` leaves a value already kept at ``key`` in place (and
        ``value`` is not kept); ``drop`` names other keys to remove first (older keys of the same run). The
        values no longer kept, ``value`` among them if it was not kept (a cache whose values hold more than
        memory disposes of them)."""
        dropped: list[V] = []
        with self._guard:
            if key in self._entries:
                if not replace:
                    return [value]
                old, old_rows = self._entries.pop(key)
                self._rows -= old_rows
                dropped.append(old)
            if drop is not None:
                for stale in [k for k in self._entries if drop(k)]:
                    old, old_rows = self._entries.pop(stale)
                    self._rows -= old_rows
                    dropped.append(old)
            self._entries[key] = (value, rows)
            self._rows += rows
            while self._rows > limit:
                _, (old, old_rows) = self._entries.popitem(last=False)
                self._rows -= old_rows
                dropped.append(old)
        return dropped

    def drain(self) -> list[V]:
        """Remove every entry; the values."""
        with self._guard:
            values = [value for value, _ in self._entries.values()]
            self._entries.clear()
            self._rows = 0
        return values

    def clear(self) -> None:
        with self._guard:
            self._entries.clear()
            self._rows = 0


_caches: weakref.WeakSet[RowBoundedCache[Any, Any]] = weakref.WeakSet()


def _codec_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "WEFT_PAYLOAD_CODEC":
        for cache in list(_caches):
            cache.clear()


setting_changed.connect(_codec_changed, dispatch_uid="django_weft.row_bounded_cache")
