"""Durations as the API accepts them: seconds (int or float) or a timedelta."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .exceptions import InvalidArgument


def to_seconds(value: Any, what: str, *, allow_zero: bool) -> float:
    """``value`` in seconds; InvalidArgument naming ``what`` for anything else or a negative (or zero)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidArgument(f"{what} must be a timedelta or seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidArgument(f"{what} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return seconds
