"""Keyset pages for the list routes: ``?limit=`` and the opaque ``next`` cursor a page returns.

A cursor is the sort key of a page's last row, as a JSON list in URL-safe base64: a page after it starts
after that row however many rows came or went meanwhile (no offsets to drift).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from ninja import Schema
from pydantic import Field

from django_weft.api.errors import ApiError

LIMIT = 500

M = TypeVar("M", bound=Model)


class PageQuery(Schema):
    limit: int = Field(50, ge=1, le=LIMIT)
    cursor: str | None = Field(None, max_length=400, description="The `next` of the previous page.")


def decode(cursor: str, arity: int) -> list[Any]:
    """The sort key a cursor holds (``arity`` values), or 422 invalid_cursor."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        key = None
    if not isinstance(key, list) or len(key) != arity or not all(isinstance(part, str) and part for part in key):
        raise ApiError(422, "invalid_cursor", "cursor is not one this API returned")
    return key


def page(rows: QuerySet[M], limit: int, key_of: Callable[[M], Sequence[str]]) -> tuple[list[M], str | None]:
    """The first ``limit`` of ``rows`` (ordered, after the cursor already), and the cursor of the next page."""
    found = list(rows[:limit + 1])
    if len(found) <= limit:
        return found, None
    found = found[:limit]
    raw = json.dumps(list(key_of(found[-1]))).encode()
    return found, base64.urlsafe_b64encode(raw).decode().rstrip("=")
