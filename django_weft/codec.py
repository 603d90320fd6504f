"""msgpack payload codec.

Payloads (inputs, results, signal payloads) are msgpack with extension types for the Python values a
Django project passes around. Decoding never executes code: the admin decodes payloads straight from the
database. Encoding checks the size against WEFT_MAX_PAYLOAD_BYTES, so callers reject a payload before
they write anything.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import threading
import uuid
from typing import Any, cast

import msgpack

from .conf import weft_settings
from .exceptions import PayloadNotSerializable, PayloadTooLarge

# Extension type codes. Stored data depends on them: never renumber.
EXT_DATETIME = 1
EXT_DATE = 2
EXT_TIME = 3
EXT_TIMEDELTA = 4
EXT_DECIMAL = 5
EXT_UUID = 6
EXT_SET = 7
EXT_FROZENSET = 8
EXT_TUPLE = 9


# Tuples, sets and timedeltas are packed (and unpacked) by a nested msgpack call each, which costs C
# stack (about 43 KB a level when decoding); nesting them deeper than this is refused on both sides, so
# that decoding stays within a 2 MB thread stack.
MAX_EXT_NESTING = 32
_nesting = threading.local()


class _Nested:
    """Counts nested pack/unpack calls on this thread; ValueError past MAX_EXT_NESTING."""

    def __enter__(self) -> None:
        depth = getattr(_nesting, "depth", 0) + 1
        if depth > MAX_EXT_NESTING:
            raise ValueError(f"tuples, sets and timedeltas nested more than {MAX_EXT_NESTING} deep")
        _nesting.depth = depth

    def __exit__(self, *exc: object) -> None:
        _nesting.depth -= 1


def _pack(value: Any) -> bytes:
    # strict_types routes tuples (and subclasses of builtins) through _default, so tuples survive.
    with _Nested():
        return msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True, datetime=False)


def _default(obj: Any) -> Any:
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, dt.datetime):
        return msgpack.ExtType(EXT_DATETIME, obj.isoformat().encode())
    if isinstance(obj, dt.date):
        return msgpack.ExtType(EXT_DATE, obj.isoformat().encode())
    if isinstance(obj, dt.time):
        return msgpack.ExtType(EXT_TIME, obj.isoformat().encode())
    if isinstance(obj, dt.timedelta):
        return msgpack.ExtType(EXT_TIMEDELTA, _pack([obj.days, obj.seconds, obj.microseconds]))
    if isinstance(obj, decimal.Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, uuid.UUID):
        return msgpack.ExtType(EXT_UUID, obj.bytes)
    if isinstance(obj, frozenset):
        return msgpack.ExtType(EXT_FROZENSET, _pack(list(obj)))
    if isinstance(obj, set):
        return msgpack.ExtType(EXT_SET, _pack(list(obj)))
    if isinstance(obj, tuple):
        return msgpack.ExtType(EXT_TUPLE, _pack(list(obj)))
    # Subclasses of builtins (str enums such as TextChoices, OrderedDict, ...) store as the builtin.
    if isinstance(obj, enum.Enum) and isinstance(obj, str | int | float):
        return obj.value
    for base in (str, int, float, bytes, dict, list):
        if isinstance(obj, base):
            return base(cast(Any, obj))
    raise TypeError(type(obj).__qualname__)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_DATETIME:
        return dt.datetime.fromisoformat(data.decode())
    if code == EXT_DATE:
        return dt.date.fromisoformat(data.decode())
    if code == EXT_TIME:
        return dt.time.fromisoformat(data.decode())
    if code == EXT_TIMEDELTA:
        days, seconds, micros = _unpack(data)
        return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    if code == EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == EXT_UUID:
        return uuid.UUID(bytes=data)
    if code == EXT_SET:
        return set(_unpack(data))
    if code == EXT_FROZENSET:
        return frozenset(_unpack(data))
    if code == EXT_TUPLE:
        return tuple(_unpack(data))
    return msgpack.ExtType(code, data)


def _unpack(data: bytes) -> Any:
    with _Nested():
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False, timestamp=0)


def encode(value: Any, *, what: str = "payload") -> bytes:
    """Encode ``value``; raise a :class:`PayloadError` naming ``what`` if it cannot be stored."""
    try:
        data = _pack(value)
    except TypeError as exc:
        raise PayloadNotSerializable(
            f"{what} holds a value of type {exc} that django_weft cannot store; use plain data "
            "(None, bool, int, float, str, bytes, list, tuple, dict, set, datetime, date, time, "
            "timedelta, Decimal, UUID)"
        ) from None
    except (ValueError, OverflowError) as exc:
        raise PayloadNotSerializable(f"{what} cannot be encoded: {exc}") from None
    except RecursionError:
        raise PayloadNotSerializable(f"{what} is nested too deeply to encode") from None
    limit = weft_settings.MAX_PAYLOAD_BYTES
    if limit and len(data) > limit:
        raise PayloadTooLarge(
            f"{what} is {len(data)} bytes encoded, over WEFT_MAX_PAYLOAD_BYTES={limit}; store large data "
            "elsewhere and pass a reference"
        )
    return data


def decode(data: bytes | memoryview | None) -> Any:
    if data is None:
        return None
    return _unpack(bytes(data))
