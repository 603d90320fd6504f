"""Filters given as text (``manage.py weft_runs`` options, the admin's query string) as the typed keywords of
:func:`~django_weft.services.visibility.runs_matching`: search attribute values typed by their declared kind, moments as
aware datetimes. Every mistake is an InvalidArgument naming the text."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils import timezone

from django_weft.common import attributes
from django_weft.exceptions import InvalidArgument

TRUE = frozenset({"true", "yes", "1", "on"})
FALSE = frozenset({"false", "no", "0", "off"})


def moment(text: str, what: str) -> datetime:
    """An ISO 8601 date or datetime; without an offset, in the current time zone (TIME_ZONE)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(f"{what}: {text!r} is not an ISO 8601 date or datetime "
                              "(e.g. 2025-03-01 or 2025-03-01T10:00+00:00)") from None
    return timezone.make_aware(value) if timezone.is_naive(value) else value


def attribute(key: str, text: str) -> Any:
    """The value of attribute filter ``key`` (``name`` or ``name__lookup``) from ``text``, typed by the name's
    declared kind; ``__in`` takes comma-separated values."""
    name, _, lookup = key.partition("__")
    kind = attributes.kind_of(name)
    item_kind = "keyword" if kind == "keyword_list" else kind
    if lookup == "contains":
        item_kind = "text"
    if lookup == "in":
        return [attributes.check_scalar(name, scalar(name, part.strip(), item_kind), item_kind)
                for part in text.split(",") if part.strip()]
    return attributes.check_scalar(name, scalar(name, text, item_kind), item_kind)


def scalar(name: str, text: str, kind: str) -> Any:
    """``text`` as a value of ``kind`` (int, decimal, datetime, bool; keywords and text as they are)."""
    try:
        if kind == "int":
            return int(text)
        if kind == "decimal":
            return Decimal(text)
        if kind == "datetime":
            return moment(text, f"search attribute {name!r}")
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered in TRUE | FALSE:
                return lowered in TRUE
            raise ValueError(text)
    except (ValueError, InvalidOperation):
        raise InvalidArgument(f"search attribute {name!r} is {kind}: {text!r} is not one") from None
    return text


def attribute_pair(text: str) -> tuple[str, Any]:
    """``name=value`` or ``name__gte=value`` (the command's ``--attr``) as (key, typed value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise InvalidArgument(f"an attribute filter is name=value or name__lookup=value, got {text!r}")
    return key.strip(), attribute(key.strip(), value)


def integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"{what} must be a whole number, got {text!r}") from None
