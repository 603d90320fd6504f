"""Durations as the API accepts them: seconds (int or float) or a timedelta."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from django_weft.exceptions import InvalidArgument

# The longest duration accepted anywhere (about 100 years): any later moment still fits a datetime, and
# a longer wait is a mistake, not a plan.
MAX_SECONDS = 100 * 365.25 * 24 * 3600


def to_seconds(value: Any, what: str, *, allow_zero: bool) -> float:
    """``value`` in seconds; InvalidArgument naming ``what`` for anything else, a negative (or zero), NaN,
    infinity, or more than MAX_SECONDS."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        raise InvalidArgument(f"{what} must be a timedelta or seconds, got {value!r}")
    if math.isnan(seconds) or seconds > MAX_SECONDS:
        raise InvalidArgument(f"{what} must be a finite number of seconds of at most {MAX_SECONDS:.0f} "
                              f"(100 years), got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidArgument(f"{what} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return seconds


# Moments accepted anywhere: far enough from both ends of datetime that adding a duration of at most
# MAX_SECONDS, or converting between zones, cannot overflow.
MIN_YEAR, MAX_YEAR = 1900, 9000


def check_moment(value: Any, what: str) -> datetime:
    """``value`` in UTC if it is an aware datetime between MIN_YEAR and MAX_YEAR; InvalidArgument naming
    ``what`` otherwise. (In UTC because Python allows offsets up to ±24 h and PostgreSQL stores ±15:59.)"""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(f"{what} must be an aware datetime, got {value!r}")
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not MIN_YEAR <= utc.year <= MAX_YEAR:
        raise InvalidArgument(f"{what} must be between the years {MIN_YEAR} and {MAX_YEAR}, got {value!r}")
    return utc
