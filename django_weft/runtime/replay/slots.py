"""Slots of limited activities in the replay context: an attempt asks for one before it begins and gives it back
when its body returns or raises (store/activity_slots keeps the line). ``ctx.run`` parks the run while it waits;
an activity branch stays due and asks again when it is polled, at most every SLOT_RECHECK_SECONDS."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django_weft.common import clock
from django_weft.runtime.activities import ActivityDefinition
from django_weft.runtime.replay.core import ReplayCore
from django_weft.store import activity_slots
from django_weft.store.starts import check_id

# A branch waiting for a slot while other branches of its run execute asks again this often (the grant also
# wakes a parked run at once).
SLOT_RECHECK_SECONDS = 0.5


class SlotOps(ReplayCore):
    # Slots this execution gave back: a branch of the run waiting for one asks again at once after each.
    _slots_released = 0

    def _slot_key(self, definition: ActivityDefinition, args: tuple, kwargs: dict) -> str | None:
        if definition.key is None:
            return None
        key = definition.key(*args, **kwargs)
        check_id(key, f"the key of activity {definition.name!r}")
        return key

    def _ask_slot(self, definition: ActivityDefinition, seq: int, args: tuple,
                  kwargs: dict) -> tuple[bool, datetime | None]:
        """Ask for step ``seq``'s slot: (granted, when to ask again if a rate holds it back)."""
        limits = definition.limits
        assert limits is not None
        self._claim.slot_seqs.add(seq)  # closing the run while it asks or holds drops the slot
        return activity_slots.acquire(definition.name, limits, self._slot_key(definition, args, kwargs),
                                      self.run_id, seq, clock.now())

    def _wait_for_slot(self, definition: ActivityDefinition, seq: int, args: tuple, kwargs: dict) -> None:
        """``ctx.run`` of a limited activity: return once step ``seq`` holds a slot; park the run until then."""
        granted, retry_at = self._ask_slot(definition, seq, args, kwargs)
        if not granted:
            self._park(wake_at=retry_at, reason=slot_reason(definition, retry_at))

    def _release_slot(self, definition: ActivityDefinition, seq: int) -> None:
        if definition.limits is not None and not self._dry:
            activity_slots.release(definition.name, self.run_id, seq, clock.now())
            self._claim.slot_seqs.discard(seq)
            self._slots_released += 1


def slot_reason(definition: ActivityDefinition, retry_at: datetime | None) -> str:
    limit = [f"concurrency {definition.concurrency}" if definition.concurrency else "",
             f"rate {definition.rate}" if definition.rate else ""]
    why = ", ".join(part for part in limit if part) + (" per key" if definition.key else "")
    when = f", next window at {retry_at.isoformat()}" if retry_at is not None else ""
    return f"waiting for a slot of activity {definition.name} ({why}{when})"


class SlotWait:
    """An activity branch's wait for its slot: when it last asked, and when a rate window lets it in."""

    def __init__(self, ctx: SlotOps) -> None:
        self._ctx = ctx
        self.waiting = False
        self.retry_at: datetime | None = None
        self._asked = 0.0
        self._released = 0

    def due(self) -> bool:
        if not self.waiting or self._ctx._slots_released != self._released:
            return True
        if self.retry_at is not None and self.retry_at <= clock.now():
            return True
        return time.monotonic() - self._asked >= SLOT_RECHECK_SECONDS

    def asked(self, granted: bool, retry_at: Any) -> bool:
        self.waiting, self.retry_at, self._asked = not granted, retry_at, time.monotonic()
        self._released = self._ctx._slots_released
        return granted
