"""Text and JSON every supported database can store.

PostgreSQL refuses NUL (``\\x00``) in ``text`` and ``jsonb``, and no database driver can encode a lone
surrogate (``\\ud800``) as UTF-8. Input the caller gives is refused with :class:`InvalidArgument` naming the
field; text the engine writes about an error (an exception's message, a traceback) is escaped instead, so
recording a failure can never fail for the text it records.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django_weft.exceptions import InvalidArgument

# NUL and the surrogate range: what no database here stores as text.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# JSON documents the client API accepts (search attributes) nest at most this deep.
MAX_JSON_DEPTH = 32
MAX_EXACT_FLOAT = float(2**53)


def unstorable_reason(text: str) -> str | None:
    """Why ``text`` cannot be stored as database text, or None if it can."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return f"contains a NUL character (\\x00) at index {found.start()}"
    return f"contains a lone surrogate (\\u{ord(char):04x}) at index {found.start()}"


def check_text(value: str, what: str) -> None:
    """Refuse text a database cannot store, naming the field."""
    reason = unstorable_reason(value)
    if reason is not None:
        raise InvalidArgument(f"{what} {reason}; databases cannot store it")


def storable_text(text: str) -> str:
    """``text`` with NUL and lone surrogates written as escapes (``\\x00``, ``\\ud800``)."""
    if _UNSTORABLE.search(text) is None:
        return text
    return _UNSTORABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if m.group() == "\x00"
                           else f"\\u{ord(m.group()):04x}", text)


def storable_json(value: Any, _depth: int = 0) -> Any:
    """A copy of an engine-made JSON value (an error's details) that every database stores: strings
    escaped, non-finite floats and anything not JSON written as text, depth bounded."""
    if _depth > MAX_JSON_DEPTH:
        return "…"
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {storable_text(str(k)): storable_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v, _depth + 1) for v in value]
    return storable_text(repr(value))


def check_json(value: Any, what: str, *, max_bytes: int | None = None) -> None:
    """Refuse a caller's JSON value that a database cannot store exactly: not JSON, NaN or infinity,
    unstorable text in a key or a string, nested deeper than MAX_JSON_DEPTH, or over ``max_bytes``."""
    _check_json_value(value, what, 0)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} must be JSON-serialisable: {exc}") from None
    if max_bytes is not None and len(text.encode()) > max_bytes:
        raise InvalidArgument(f"{what} is {len(text.encode())} bytes as JSON, over the limit of {max_bytes}")


def _check_json_value(value: Any, what: str, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise InvalidArgument(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        check_text(value, what)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{what} holds {value!r}; JSON has no NaN or infinity")
    elif isinstance(value, float) and abs(value) >= MAX_EXACT_FLOAT:
        # PostgreSQL's jsonb keeps numbers as decimals and hands 1.8e16 back as the integer
        # 18014398509481984: past 2**53 a float is no longer read back as the same value and type.
        raise InvalidArgument(f"{what} holds {value!r}; floats must be smaller than 2**53 in magnitude")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                check_text(key, f"{what} key {key[:40]!r}")
            _check_json_value(item, f"{what}[{str(key)[:40]!r}]", depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_json_value(item, what, depth + 1)
