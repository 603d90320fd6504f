"""Queue limits as WEFT_QUEUES and operators give them: parsed and checked, with one error per bad value.

A queue's limits are its setting's, with the keys an operator set at run time (``QueueState.overrides``) over
them. ``concurrency`` bounds the runs it has admitted and that are still open; ``concurrency_per_key`` those of
one ``concurrency_key``; ``rate`` and ``rate_per_key`` ("N/s", "N/m", "N/h") the admissions in any window of
that period. Absent or None: no such limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django_weft.exceptions import InvalidArgument

LIMIT_KEYS = ("concurrency", "concurrency_per_key", "rate", "rate_per_key")
# WEFT_QUEUES takes one more key, not a limit an operator changes at run time: the Celery queue its runs'
# django_weft.drive tasks are sent to (WEFT_EXECUTOR = "celery"; default WEFT_CELERY_QUEUE).
SETTING_KEYS = (*LIMIT_KEYS, "celery_queue")
# The name --queues gives runs started without a queue; no queue of WEFT_QUEUES may take it.
NO_QUEUE = "default"
MAX_QUEUE_NAME = 100
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
# The most runs one admission pass of a queue admits (a pass that admits this many runs again at once).
MAX_PER_PASS = 500


@dataclass(frozen=True)
class Rate:
    count: int
    period: float  # seconds

    def __str__(self) -> str:
        unit = {v: k for k, v in PERIODS.items()}[self.period]
        return f"{self.count}/{unit}"


@dataclass(frozen=True)
class Limits:
    concurrency: int | None = None
    concurrency_per_key: int | None = None
    rate: Rate | None = None
    rate_per_key: Rate | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "concurrency_per_key": self.concurrency_per_key,
                "rate": None if self.rate is None else str(self.rate),
                "rate_per_key": None if self.rate_per_key is None else str(self.rate_per_key)}


@dataclass(frozen=True)
class ActivityLimits:
    """``@weft.activity(concurrency=, rate=, key=)``: per key when ``keyed`` (the activity has a key function)."""

    concurrency: int | None = None
    rate: Rate | None = None
    keyed: bool = False


def parse_rate(value: Any, what: str) -> Rate | None:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N >= 1); None for None."""
    if value is None:
        return None
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) < 1:
        raise InvalidArgument(f'{what} must be a rate such as "50/s", "100/m" or "1000/h" (a positive count per '
                              f"second, minute or hour), got {value!r}")
    return Rate(int(match.group(1)), PERIODS[match.group(2)])


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{what} must be a positive int (or None for no limit), got {value!r}")
    return value


def check_limits(values: Any, what: str, *, keys: tuple[str, ...] = LIMIT_KEYS) -> dict[str, Any]:
    """The limit keys of ``values``, each checked; InvalidArgument for an unknown key or a bad value."""
    if not isinstance(values, dict):
        raise InvalidArgument(f"{what} must be a dict of limits ({', '.join(keys)}), got {values!r}")
    unknown = sorted(set(values) - set(keys), key=str)
    if unknown:
        raise InvalidArgument(f"{what} has unknown keys {unknown}; a queue takes {', '.join(keys)}")
    celery_queue = values.get("celery_queue")
    if celery_queue is not None and (not isinstance(celery_queue, str) or not celery_queue):
        raise InvalidArgument(f"{what}['celery_queue'] must be the name of a Celery queue, got {celery_queue!r}")
    for key in ("concurrency", "concurrency_per_key"):
        _count(values.get(key), f"{what}[{key!r}]")
    for key in ("rate", "rate_per_key"):
        parse_rate(values.get(key), f"{what}[{key!r}]")
    return dict(values)


def celery_routes() -> dict[str, str]:
    """Queue name -> the Celery queue of its runs' drive tasks, for the queues that name one."""
    return {name: values["celery_queue"] for name, values in configured().items()
            if isinstance(values, dict) and values.get("celery_queue")}


def limits_from(values: dict[str, Any]) -> Limits:
    return Limits(concurrency=values.get("concurrency"), concurrency_per_key=values.get("concurrency_per_key"),
                  rate=parse_rate(values.get("rate"), "rate"),
                  rate_per_key=parse_rate(values.get("rate_per_key"), "rate_per_key"))


def configured() -> dict[str, dict[str, Any]]:
    """WEFT_QUEUES (checked by the system check weft.E008; a bad entry raises here too)."""
    from django_weft.conf import weft_settings

    queues = weft_settings.QUEUES
    if not isinstance(queues, dict):
        raise InvalidArgument(f"WEFT_QUEUES must be a dict of queue name -> limits, got {queues!r}")
    return queues


def check_queue_name(name: Any, what: str = "queue") -> str:
    """A queue of WEFT_QUEUES; InvalidArgument naming the known ones otherwise."""
    queues = configured()
    if not isinstance(name, str) or name not in queues:
        known = ", ".join(map(repr, sorted(queues))) or "none: WEFT_QUEUES is empty"
        raise InvalidArgument(f"{what} {name!r} is not a queue of WEFT_QUEUES (known: {known})")
    return name


def configuration_errors() -> list[str]:
    """What is wrong with WEFT_QUEUES, one message per problem (for the system check)."""
    from django_weft.conf import weft_settings

    queues = weft_settings.QUEUES
    if not isinstance(queues, dict):
        return [f"WEFT_QUEUES must be a dict of queue name -> limits, got {type(queues).__name__}"]
    errors = []
    for name, values in queues.items():
        if not isinstance(name, str) or not name or len(name) > MAX_QUEUE_NAME or name == NO_QUEUE:
            errors.append(f"WEFT_QUEUES has a bad queue name {name!r}: a non-empty string of at most "
                          f"{MAX_QUEUE_NAME} characters, not {NO_QUEUE!r} (that names runs without a queue)")
            continue
        try:
            check_limits(values, f"WEFT_QUEUES[{name!r}]", keys=SETTING_KEYS)
        except InvalidArgument as exc:
            errors.append(str(exc))
    return errors
