"""Events and streams (design 9.4): ``ctx.set_event(key, value)`` publishes the latest value of a key and
``ctx.write_stream(key, value)`` / ``ctx.close_stream(key)`` an ordered stream, for callers to read while the run
goes on (``handle.get_event``, ``handle.read_stream``, the HTTP API). Each call is a journaled step whose value is
written in the commit that records it, so a replay publishes nothing twice.
"""

from __future__ import annotations

from typing import Any

from django_weft.common import clock
from django_weft.common.codec import encode
from django_weft.exceptions import InvalidArgument
from django_weft.models import StepKind, StepStatus
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.store import journal
from django_weft.store.starts import check_id

# The longest event or stream key (the column's length).
MAX_KEY_LENGTH = 200


class Published(ReplayCore):
    """``ctx.set_event``, ``ctx.write_stream``, ``ctx.close_stream`` (mixed into runtime.context.Context)."""

    @durable
    def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` as the latest value of event ``key`` (``handle.get_event(key)`` returns it; setting
        the key again replaces it). Written with the run's next commit: before its next activity or wait."""
        check_id(key, "an event key", max_length=MAX_KEY_LENGTH)
        data = encode(value, what=f"value of event {key!r}")
        seq, step = self._next(StepKind.EVENT, key)
        if step is not None:
            return
        self._check_new_work()
        now = clock.now()
        self._defer(self._record(self._step(seq, StepKind.EVENT, key, StepStatus.COMPLETED, started=now,
                                            finished=now), None))
        self._defer(journal.SetEvent(self.run_id, key, data, seq, now))

    @durable
    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` to stream ``key`` (``handle.read_stream(key)`` yields the values in order)."""
        check_id(key, "a stream key", max_length=MAX_KEY_LENGTH)
        self._stream_call(key, encode(value, what=f"value written to stream {key!r}"), closed=False)

    @durable
    def close_stream(self, key: str) -> None:
        """End stream ``key``: readers stop once they have read its values. Writing to it again is refused."""
        check_id(key, "a stream key", max_length=MAX_KEY_LENGTH)
        self._stream_call(key, None, closed=True)

    def _stream_call(self, key: str, data: bytes | None, *, closed: bool) -> None:
        if key in self._closed_streams:
            raise InvalidArgument(f"stream {key!r} was closed by this run: nothing more can be written to it")
        name = f"{key} (closed)" if closed else key
        seq, step = self._next(StepKind.STREAM, name)
        if closed:
            self._closed_streams.add(key)  # replayed calls close it too, so a write after them is refused the same way
        if step is not None:
            return
        self._check_new_work()
        now = clock.now()
        self._defer(self._record(self._step(seq, StepKind.STREAM, name, StepStatus.COMPLETED, started=now,
                                            finished=now), None))
        self._defer(journal.AppendStream(self.run_id, key, data, seq, now, closed=closed))
