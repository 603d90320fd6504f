"""Search attributes: the types ``WEFT_SEARCH_ATTRIBUTES`` declares, how a value of each is checked, and the
column of :class:`~django_weft.models.SearchAttributeValue` that holds it.

Pure functions over the setting: starts (``search_attributes=``), ``ctx.set_search_attributes`` and the
filters of ``weft.list_runs`` all check values here, so a wrong name or type is the same clear
InvalidArgument wherever it is given.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Context, Decimal, InvalidOperation
from typing import Any

from django.utils import timezone

from django_weft.common.durations import check_moment
from django_weft.common.storable import check_text
from django_weft.conf import weft_settings
from django_weft.exceptions import ConfigurationError, InvalidArgument

# type -> the SearchAttributeValue column that holds its values
COLUMNS = {
    "int": "int_value",
    "keyword": "keyword_value",
    "keyword_list": "keyword_value",
    "text": "text_value",
    "decimal": "decimal_value",
    "datetime": "datetime_value",
    "bool": "bool_value",
}
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_KEYWORD_LENGTH = 255
MAX_TEXT_LENGTH = 10_000
MAX_KEYWORDS = 100
# What a decimal column holds (38 digits, 10 after the point) and a BIGINT.
DECIMAL_LIMIT = Decimal(10) ** 28
INT_LIMIT = 2**63
DECIMAL_CONTEXT = Context(prec=38)


def declared() -> dict[str, str]:
    """WEFT_SEARCH_ATTRIBUTES, checked."""
    value = weft_settings.SEARCH_ATTRIBUTES
    if not isinstance(value, dict):
        raise ConfigurationError(f"WEFT_SEARCH_ATTRIBUTES must be a dict of name -> type, got {value!r}")
    for name, kind in value.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigurationError(f"WEFT_SEARCH_ATTRIBUTES: {name!r} is not a valid attribute name (letters, digits "
                                     "and _, at most 64, not starting with a digit)")
        if kind not in COLUMNS:
            raise ConfigurationError(f"WEFT_SEARCH_ATTRIBUTES[{name!r}] is {kind!r}; the types are "
                                     f"{', '.join(sorted(COLUMNS))}")
    return value


def kind_of(name: Any) -> str:
    """The declared type of attribute ``name``, or InvalidArgument naming the declared ones."""
    kinds = declared()
    if not isinstance(name, str) or name not in kinds:
        known = ", ".join(sorted(kinds)) or "none (declare them in WEFT_SEARCH_ATTRIBUTES)"
        raise InvalidArgument(f"search attribute {name!r} is not declared in WEFT_SEARCH_ATTRIBUTES; declared: {known}")
    return kinds[name]


def check_value(name: str, value: Any, kind: str | None = None) -> Any:
    """``value`` as attribute ``name`` stores it (a list of keywords for ``keyword_list``; None clears it), or
    InvalidArgument saying what its type takes."""
    kind = kind or kind_of(name)
    if value is None:
        return None
    if kind == "keyword_list":
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
            raise _wrong(name, kind, value)
        keywords = sorted({check_scalar(name, item, "keyword") for item in value})
        if len(keywords) > MAX_KEYWORDS:
            raise InvalidArgument(f"search attribute {name!r} takes at most {MAX_KEYWORDS} keywords, got "
                                  f"{len(keywords)}")
        return keywords
    return check_scalar(name, value, kind)


def check_scalar(name: str, value: Any, kind: str) -> Any:
    """One value of type ``kind`` (``keyword`` for an item of a ``keyword_list``)."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise _wrong(name, kind, value)
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or not -INT_LIMIT <= value < INT_LIMIT:
            raise _wrong(name, kind, value)
        return value
    if kind == "decimal":
        if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
            raise _wrong(name, kind, value)  # not float: 0.1 is not what it looks like
        try:
            number = Decimal(value)
        except InvalidOperation:
            raise _wrong(name, kind, value) from None
        if not number.is_finite() or abs(number) >= DECIMAL_LIMIT:
            raise _wrong(name, kind, value)
        if number.as_tuple().exponent >= -10:  # type: ignore[operator]
            return number  # as given: 150.00 keeps its scale on the run's row (the column pads it to 10 places)
        return number.quantize(Decimal("1e-10"), context=DECIMAL_CONTEXT)
    if kind == "datetime":
        if not isinstance(value, datetime) or timezone.is_naive(value):
            raise _wrong(name, kind, value)
        return check_moment(value, f"search attribute {name!r} (datetime)")  # in UTC
    if kind in ("keyword", "text"):
        limit = MAX_KEYWORD_LENGTH if kind == "keyword" else MAX_TEXT_LENGTH
        if not isinstance(value, str) or len(value) > limit or (kind == "keyword" and not value):
            raise _wrong(name, kind, value)
        check_text(value, f"search attribute {name!r}")
        return value
    raise _wrong(name, kind, value)


_TAKES = {
    "int": "an int",
    "keyword": "a non-empty string of at most 255 characters",
    "keyword_list": "a list of keywords (strings of at most 255 characters)",
    "text": "a string of at most 10,000 characters",
    "decimal": "a Decimal, an int or a numeric string (not a float), under 10**28",
    "datetime": "an aware datetime",
    "bool": "True or False",
}


def _wrong(name: str, kind: str, value: Any) -> InvalidArgument:
    shown = repr(value) if len(repr(value)) <= 80 else f"a {type(value).__name__}"
    return InvalidArgument(f"search attribute {name!r} is {kind}: it takes {_TAKES[kind]}, got {shown}")


def check_all(values: Any, what: str = "search_attributes") -> dict[str, Any]:
    """A dict of declared attributes, each checked (None clears one)."""
    if not isinstance(values, dict):
        raise InvalidArgument(f"{what} must be a dict of declared search attributes, got {values!r}")
    return {name: check_value(name, value) for name, value in values.items()}


def to_json(value: Any) -> Any:
    """How a checked value is shown on the run's row (``Workflow.search_attributes``, JSON)."""
    if isinstance(value, Decimal):
        return format(value, "f")  # its scale kept ("150.00"), never an exponent ("1.5E+2" is "150")
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def shown(values: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run row's ``search_attributes`` once checked ``values`` are applied over ``current`` (a None
    removes its name)."""
    merged = dict(current or {})
    for name, value in values.items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = to_json(value)
    return merged


def from_json(values: Any) -> dict[str, Any]:
    """A run row's ``search_attributes`` read back as checked values, by today's declarations: what a run
    continuing as new carries over, and what the indexed rows of a new run hold. Names no longer declared,
    and values their declared type no longer takes, are left out."""
    kinds = declared()
    checked = {}
    for name, value in (values or {}).items() if isinstance(values, dict) else ():
        kind = kinds.get(name)
        if kind is None:
            continue
        try:
            if kind == "datetime" and isinstance(value, str):
                value = datetime.fromisoformat(value)
            checked[name] = check_value(name, value, kind)
        except (InvalidArgument, ValueError):
            continue
    return {name: value for name, value in checked.items() if value is not None}


def column_values(values: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``(name, column, value)`` of each indexed row checked ``values`` make: none for a None, one per
    keyword of a ``keyword_list``."""
    kinds = declared()
    rows = []
    for name, value in values.items():
        if value is None:
            continue
        kind = kinds[name]
        for item in value if kind == "keyword_list" else [value]:
            rows.append((name, COLUMNS[kind], item))
    return rows
