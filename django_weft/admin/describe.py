"""Plain-English descriptions of common cron expressions and intervals, for the schedule admin.

Only the common shapes are described (every N minutes/hours, hourly at a minute, daily, weekly on some
weekdays, monthly on a day, yearly on a date); anything else returns None and the expression is shown
as it is.
"""

from __future__ import annotations

import re
from datetime import timedelta

WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
WEEKDAY_NAMES = {name[:3].lower(): i for i, name in enumerate(WEEKDAYS)}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
MONTH_NAMES = {name[:3].lower(): i + 1 for i, name in enumerate(MONTHS)}

_NUMBER = re.compile(r"^\d+$")
_STEP = re.compile(r"^\*/(\d+)$")


def _plural(n: int, unit: str) -> str:
    return f"{unit}" if n == 1 else f"{n} {unit}s"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _weekday(token: str) -> int | None:
    token = token.lower()
    if token in WEEKDAY_NAMES:
        return WEEKDAY_NAMES[token]
    if _NUMBER.match(token) and int(token) <= 7:
        return int(token) % 7
    return None


def _weekdays(field: str) -> str | None:
    """'1-5' -> 'Monday to Friday', '0,6' -> 'Sunday and Saturday', 'mon' -> 'Monday'."""
    if field.lower() in ("1-5", "mon-fri"):
        return "weekdays (Monday to Friday)"
    names = []
    for part in field.split(","):
        if "-" in part:
            low, _, high = part.partition("-")
            first, last = _weekday(low), _weekday(high)
            if first is None or last is None:
                return None
            names.append(f"{WEEKDAYS[first]} to {WEEKDAYS[last]}")
        else:
            day = _weekday(part)
            if day is None:
                return None
            names.append(WEEKDAYS[day])
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _month(token: str) -> int | None:
    token = token.lower()
    if token in MONTH_NAMES:
        return MONTH_NAMES[token]
    if _NUMBER.match(token) and 1 <= int(token) <= 12:
        return int(token)
    return None


def describe_cron(expression: str) -> str | None:
    fields = expression.split()
    seconds = "0"
    if len(fields) == 6:
        seconds, fields = fields[0], fields[1:]
    if len(fields) != 5:
        return None
    minute, hour, day, month, weekday = fields
    if seconds != "0":
        step = _STEP.match(seconds)
        if seconds == "*" and fields == ["*"] * 5:
            return "every second"
        if step and fields == ["*"] * 5:
            return f"every {_plural(int(step.group(1)), 'second')}"
        return None
    any_day = day == "*" and month == "*" and weekday == "*"
    if any_day and hour == "*":
        if minute == "*":
            return "every minute"
        step = _STEP.match(minute)
        if step:
            return f"every {_plural(int(step.group(1)), 'minute')}"
        if _NUMBER.match(minute):
            return f"every hour at minute {int(minute)}"
        return None
    if not (_NUMBER.match(minute) and (_NUMBER.match(hour) or _STEP.match(hour))):
        return None
    step = _STEP.match(hour)
    if step:
        if not any_day:
            return None
        return f"every {_plural(int(step.group(1)), 'hour')} at minute {int(minute)}"
    at = f"at {int(hour):02d}:{int(minute):02d}"
    if any_day:
        return f"every day {at}"
    if day == "*" and month == "*":
        days = _weekdays(weekday)
        return f"every {days} {at}" if days else None
    if weekday == "*" and _NUMBER.match(day):
        if month == "*":
            return f"on the {_ordinal(int(day))} of every month {at}"
        number = _month(month)
        if number is not None:
            return f"every year on {MONTHS[number - 1]} {int(day)} {at}"
    return None


def describe_interval(every: timedelta) -> str:
    seconds = int(every.total_seconds())
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds % size == 0:
            return f"every {_plural(seconds // size, unit)}"
    return f"every {_plural(seconds, 'second')}"
