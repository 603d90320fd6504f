"""When a schedule fires: cron or interval occurrences in a time zone, bounded by start/end, plus jitter.

Pure functions over aware datetimes (no database). Cron expressions are evaluated on local wall-clock
time in the schedule's IANA zone, then converted to UTC:

* a local time that does not exist (spring forward) fires once, at the shifted time (02:30 in a gap that
  jumps 02:00 -> 03:00 fires at 03:30);
* a local time that exists twice (fall back) fires once, at its first occurrence;
* occurrences are strictly increasing in UTC, so a shifted time never fires twice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from django_weft.exceptions import InvalidArgument

# A cron expression that matches nothing for this long is treated as matching never.
MAX_YEARS_BETWEEN_MATCHES = 5


def parse_zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidArgument(f"timezone must be an IANA zone name such as 'Europe/Berlin', got {name[:80]!r}"
                              if isinstance(name, str) else f"timezone must be an IANA zone name, got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Berlin'") from None


def check_cron(expression: str) -> None:
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidArgument(f"cron must be a cron expression string, got {expression!r}")
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise InvalidArgument(
            f"cron {expression!r} has {len(fields)} fields; use five (minute hour day month weekday) or six "
            "(second first)"
        )
    try:
        # Parsing alone accepts dates that never come (``0 0 30 2 *``): find one real occurrence too.
        croniter(expression, datetime(2000, 1, 1), second_at_beginning=len(fields) == 6).get_next(datetime)
    except CroniterBadDateError:
        raise InvalidArgument(f"cron {expression!r} never fires (no such date in any year)") from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgument(f"invalid cron expression {expression!r}: {exc}") from None


@dataclass(frozen=True)
class Cadence:
    """A schedule's occurrence rule: exactly one of ``cron`` and ``every``."""

    cron: str | None
    every: timedelta | None
    zone: ZoneInfo
    anchor: datetime  # interval occurrences are anchor + k * every
    start_at: datetime | None = None
    end_at: datetime | None = None

    def next_after(self, moment: datetime) -> datetime | None:
        """The first occurrence strictly after ``moment`` (aware), or None when the schedule has ended."""
        if self.start_at is not None and moment < self.start_at:
            # The start itself may be an occurrence: look from just before it.
            moment = self.start_at - timedelta(microseconds=1)
        found = self._interval_after(moment) if self.every is not None else self._cron_after(moment)
        if found is None or (self.end_at is not None and found > self.end_at):
            return None
        return found

    def _interval_after(self, moment: datetime) -> datetime:
        assert self.every is not None
        steps = (moment - self.anchor) // self.every + 1
        return self.anchor + max(steps, 1 if self.start_at is None else 0) * self.every

    def _cron_after(self, moment: datetime) -> datetime | None:
        assert self.cron is not None
        # Walk local wall-clock times; convert each to UTC and keep the first strictly after ``moment``.
        local = moment.astimezone(self.zone).replace(tzinfo=None)
        # A wall time in a DST gap just before ``moment`` maps to an instant after it. Such a gap exists
        # only if the UTC offset changed within the last hour: then look back an hour, else start at
        # ``moment`` (looking back always would cost 1,800 steps per call for a cron every 2 seconds).
        hour_ago = (moment - timedelta(hours=1)).astimezone(self.zone).utcoffset()
        start = local - timedelta(hours=1) if hour_ago != moment.astimezone(self.zone).utcoffset() else local
        it = croniter(self.cron, start, ret_type=datetime,
                      second_at_beginning=len(self.cron.split()) == 6,
                      max_years_between_matches=MAX_YEARS_BETWEEN_MATCHES)
        for _ in range(100_000):
            try:
                wall = it.get_next(datetime)
            except CroniterError:
                return None
            instant = _to_utc(wall, self.zone)
            if instant > moment:
                return instant
        return None


def count_between(cadence: Cadence, after: datetime, until: datetime, cap: int = 1_000_000) -> int:
    """How many occurrences fall in (after, until]; exact for intervals, counted up to ``cap`` for cron."""
    if cadence.every is not None:
        first = cadence.next_after(after)
        if first is None or first > until:
            return 0
        last = min(until, cadence.end_at) if cadence.end_at else until
        return (last - first) // cadence.every + 1
    count, moment = 0, after
    while count < cap:
        following = cadence.next_after(moment)
        if following is None or following > until:
            break
        count, moment = count + 1, following
    return count


def _to_utc(wall: datetime, zone: ZoneInfo) -> datetime:
    # fold=0: an ambiguous time means its first occurrence; a non-existent time takes the offset from
    # before the gap, which lands it after the gap (the shifted time).
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


def jitter_offset(schedule_id: str, occurrence: datetime, jitter: timedelta | None,
                  following: datetime | None) -> timedelta:
    """A deterministic delay in [0, jitter) for this (schedule, occurrence), never reaching ``following``."""
    if not jitter:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule_id}|{occurrence.astimezone(UTC).isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    delay = timedelta(microseconds=int(jitter / timedelta(microseconds=1) * fraction))
    if following is not None and occurrence + delay >= following:
        delay = max(timedelta(0), (following - occurrence) - timedelta(microseconds=1))
    return delay
