"""msgpack payload codec.

Payloads (inputs, results, signal payloads) are msgpack with extension types for the Python values a
Django project passes around. Decoding never executes code: the admin decodes payloads straight from the
database. Encoding checks the size against WEFT_MAX_PAYLOAD_BYTES and the nesting against MAX_DEPTH, so callers
reject a payload before they write anything.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import threading
import uuid
from typing import Any, cast

import msgpack

from django_weft.common import payload_crypto
from django_weft.conf import weft_settings
from django_weft.exceptions import PayloadNotSerializable, PayloadTooDeep, PayloadTooLarge

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


# The one nesting limit of every payload: lists, dicts, tuples and sets nested deeper are refused at every entrance
# (PayloadTooDeep), so whatever is stored renders in the HTTP API and the admin, which recurse once a level.
# Tuples, sets and timedeltas are packed (and unpacked) by a nested msgpack call each, which costs C stack (about
# 43 KB a level when decoding): 32 levels of them decode within a 2 MB thread stack.
MAX_DEPTH = 32
CONTAINERS = (list, tuple, dict, set, frozenset)

# Nested pack/unpack calls: the outermost, one per tuple or set, and a timedelta's own. A payload within MAX_DEPTH
# never passes it; decoding still refuses more (a ValueError), whatever the database holds.
MAX_EXT_NESTING = MAX_DEPTH + 2
_nesting = threading.local()


class _TooDeep(ValueError):
    pass


class _Nested:
    """Counts nested pack/unpack calls on this thread; _TooDeep (a ValueError) past MAX_EXT_NESTING."""

    def __enter__(self) -> None:
        depth = getattr(_nesting, "depth", 0) + 1
        if depth > MAX_EXT_NESTING:
            raise _TooDeep(f"tuples, sets and timedeltas nested more than {MAX_EXT_NESTING - 2} deep")
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
    # _Nested's count, written out: this runs for every journal row a replay reads.
    depth = getattr(_nesting, "depth", 0) + 1
    if depth > MAX_EXT_NESTING:
        raise _TooDeep(f"tuples, sets and timedeltas nested more than {MAX_EXT_NESTING - 2} deep")
    _nesting.depth = depth
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False, timestamp=0)
    finally:
        _nesting.depth = depth - 1


def nests_deeper_than(value: Any, levels: int) -> bool:
    """Whether ``value`` nests lists, dicts, tuples or sets more than ``levels`` deep (``[["x"]]`` is 2 deep).
    Level by level, without recursion; a value that contains itself is deeper than any limit."""
    level = [value] if isinstance(value, CONTAINERS) else []
    for _ in range(levels):
        inner: list[Any] = []
        for container in level:
            inner += [item for item in container if isinstance(item, CONTAINERS)]  # a dict's keys
            if isinstance(container, dict):
                inner += [item for item in container.values() if isinstance(item, CONTAINERS)]
        if not inner:
            return False
        level = inner
    return bool(level)


def _too_deep(what: str) -> PayloadTooDeep:
    return PayloadTooDeep(f"{what} is nested more than {MAX_DEPTH} levels deep (lists, dicts, tuples and sets), "
                          "the limit of every payload: flatten it, or store it elsewhere and pass a reference")


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
    except (_TooDeep, RecursionError):
        raise _too_deep(what) from None
    except (ValueError, OverflowError) as exc:
        if "recursion limit" in str(exc):  # msgpack's own, past 511 levels or for a value that contains itself
            raise _too_deep(what) from None
        raise PayloadNotSerializable(f"{what} cannot be encoded: {exc}") from None
    # Each level takes at least a byte, so a payload this short cannot be too deep: most need no walk.
    if len(data) > MAX_DEPTH and nests_deeper_than(value, MAX_DEPTH):
        raise _too_deep(what)
    limit = weft_settings.MAX_PAYLOAD_BYTES
    if limit and len(data) > limit:
        raise PayloadTooLarge(
            f"{what} is {len(data)} bytes encoded, over WEFT_MAX_PAYLOAD_BYTES={limit}; store large data "
            "elsewhere and pass a reference"
        )
    return payload_crypto.seal(data)  # as it is, unless WEFT_PAYLOAD_CODEC encrypts payloads at rest


_SEALED = payload_crypto.MAGIC
_SEALED_LEN = len(_SEALED)


def decode(data: bytes | memoryview | None) -> Any:
    if data is None:
        return None
    data = bytes(data)
    # The sealed check written out: a replay decodes every journal row it reads.
    return _unpack(payload_crypto.unseal(data) if data[:_SEALED_LEN] == _SEALED else data)
