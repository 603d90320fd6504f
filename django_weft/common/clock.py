"""The engine's clock.

Every timestamp the engine writes comes from :func:`now`, never from the database, so tests can move a
fake clock (:mod:`django_weft.testing`) and ``run_maintenance(now=...)`` can act as of a given time.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.utils import timezone

from django_weft.common.durations import check_moment

_pass_time: contextvars.ContextVar[datetime | None] = contextvars.ContextVar("weft_pass_time", default=None)
# Set by the testing helpers; seen by every thread.
_frozen: datetime | None = None


def now() -> datetime:
    value = _pass_time.get()
    if value is not None:
        return value
    if _frozen is not None:
        return _frozen
    return timezone.now()


def sleep_until(moment: datetime | None, *, within: timedelta) -> bool:
    """Sleep until ``moment`` if it is still ahead, but no more than ``within`` ahead; True if it slept.

    For messages delivered a moment before what they were sent for (the clocks of hosts differ a little).
    """
    if moment is None:
        return False
    ahead = moment - now()
    if not timedelta(0) < ahead <= within:
        return False
    time.sleep(ahead.total_seconds())
    return True


def set_frozen(value: datetime | None) -> None:
    global _frozen
    _frozen = value


@contextmanager
def acting_at(value: datetime | None) -> Iterator[None]:
    """Make :func:`now` return ``value`` in this thread (and its context) while the block runs."""
    if value is None:
        yield
        return
    token = _pass_time.set(check_moment(value, "run_maintenance(now=...)"))
    try:
        yield
    finally:
        _pass_time.reset(token)
