"""Payload values as JSON (the HTTP API's answers, the admin's pages and weft_runs show the same text): the Python
types msgpack payloads may hold and JSON lacks, made JSON."""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

from django_weft.common.codec import CONTAINERS, MAX_DEPTH

TOO_DEEP = f"(nested deeper than {MAX_DEPTH} levels: not shown)"


def as_json(value: Any, depth: int = 0) -> Any:
    """``value`` with the Python types msgpack payloads may hold and JSON lacks made JSON: tuples and sets as
    lists, bytes as base64, dates and times as ISO 8601, timedeltas as seconds, decimals, UUIDs, inf and nan as
    strings; a container more than MAX_DEPTH levels down as :data:`TOO_DEEP`, so that any value renders."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf or nan (Python's parser accepts them, so a client may send them)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, CONTAINERS) and depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {str(key): as_json(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [as_json(item, depth + 1) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    return str(value)


