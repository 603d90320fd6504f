"""The filters of ``weft.list_runs`` as the API takes them: query parameters of ``GET runs`` and
``GET runs/count``, and the ``"filters"`` object of ``POST bulk/<operation>`` (the same names, the same text).

Values are text, as in a query string (``created_after=2025-03-01``, ``attr=amount__gte=100``), read by
:mod:`~.visibility_text` as ``manage.py weft_runs`` reads its options; :func:`to_keywords` turns them into
the keywords of :func:`~.visibility.runs_matching`, which checks them (a mistake is a 422 naming it).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from django_weft.api.schemas import Body
from django_weft.services import visibility_text
from django_weft.services.visibility import GROUPS

TEXT = 255  # the longest value a filter takes (ids, names, prefixes)
MANY = 50  # the most values a repeated filter takes


class RunFilters(Body):
    """A misspelt filter in a bulk body would widen the set acted on: refused (Body), not ignored."""

    status: list[str] | None = Field(None, max_length=MANY, description="Repeat or comma-separate for several.")
    type: list[str] | None = Field(None, max_length=MANY, description="Workflow names; repeat for several.")
    workflow_id_prefix: str | None = Field(None, min_length=1, max_length=TEXT)
    tag: list[str] | None = Field(None, max_length=MANY, description="Runs with every tag given; repeatable.")
    attr: list[str] | None = Field(
        None, max_length=MANY,
        description="A search attribute filter `name[__lookup]=value`, typed by WEFT_SEARCH_ATTRIBUTES: "
                    "`region=eu`, `amount__gte=100`, `region__in=eu,us`, `note__contains=late`; repeatable.")
    created_after: str | None = Field(None, max_length=64, description="ISO 8601; without an offset, TIME_ZONE.")
    created_before: str | None = Field(None, max_length=64, description="ISO 8601; without an offset, TIME_ZONE.")
    schedule: str | None = Field(None, min_length=1, max_length=TEXT, description="A schedule id.")
    parent: str | None = Field(None, max_length=64, description="The run id of the parent run.")
    failure_category: list[str] | None = Field(None, max_length=MANY, description="Repeat or comma-separate.")
    version: int | None = Field(None, ge=1, le=2**31 - 1)
    queue: str | None = Field(None, min_length=1, max_length=100, description="A queue ('default': runs of no queue).")

    @field_validator("version", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        # pydantic reads true as 1: a bulk body's "version": true would act on version 1 (schemathesis found it).
        if isinstance(value, bool):
            raise ValueError("version must be a whole number, not true or false")
        return value


class CountQuery(RunFilters):
    group_by: str = Field("status", min_length=1, max_length=TEXT,
                          description=f"One of {', '.join(GROUPS)}, or a declared search attribute.")


def listed(values: list[str] | None) -> list[str] | None:
    """Repeated and comma-separated values as one list (None when none is given)."""
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()] or None


def to_keywords(given: RunFilters) -> dict[str, Any]:
    """The runs_matching keywords of the filters given (the ones left out are not passed)."""
    keywords: dict[str, Any] = {}
    for name, keyword in (("status", "status"), ("type", "type"), ("tag", "tags"),
                          ("failure_category", "failure_category")):
        values = listed(getattr(given, name))
        if values is not None:
            keywords[keyword] = values
    for name in ("workflow_id_prefix", "schedule", "parent", "version", "queue"):
        value = getattr(given, name)
        if value is not None:
            keywords[name] = value
    if given.attr:
        keywords["attributes"] = dict(visibility_text.attribute_pair(text) for text in given.attr)
    for name in ("created_after", "created_before"):
        text = getattr(given, name)
        if text is not None:
            keywords[name] = visibility_text.moment(text, name)
    return keywords
