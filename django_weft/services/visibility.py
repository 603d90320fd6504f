"""Finding runs: ``weft.list_runs(**filters)`` (a QuerySet of runs, newest first) and
``weft.count_runs(**filters, group_by=...)``; the bulk operations and the ``weft_runs`` command take the same
filters (:func:`runs_matching`).

Every filter is checked before a query is built (a wrong status, an undeclared attribute or a value of the
wrong type is an InvalidArgument naming it). Attribute filters are ``EXISTS`` over the indexed rows of
:class:`~django_weft.models.SearchAttributeValue`, one per attribute (its conditions hold on the same row; a
``keyword_list`` has one per condition, since each keyword is a row).

The query shapes rely on what the write path (``attribute_rows``) guarantees: a run has one row per scalar
attribute and one per keyword, its value in its type's column, and the run's ``created_at`` beside it. So a
page filtered by an attribute's equality joins the run to that row and is ordered by the row's ``created_at``:
the first page is then read in order from the attribute's (name, value, created_at) index, however many
runs match; and a count by attribute counts rows, read from that index alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.db import connections, router
from django.db.models import BooleanField, Count, Exists, OuterRef, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from django_weft.common import attributes
from django_weft.common.queues import NO_QUEUE
from django_weft.common.registry import get_workflow
from django_weft.common.storable import check_text
from django_weft.exceptions import InvalidArgument, WorkflowNotRegistered
from django_weft.models import FailureCategory, RunStatus, SearchAttributeValue, Workflow

FILTERS = ("status", "type", "workflow_id_prefix", "tags", "attributes", "created_after", "created_before",
           "schedule", "parent", "failure_category", "version", "queue")
LOOKUPS = ("exact", "gt", "gte", "lt", "lte", "in", "contains")
GROUPS = ("status", "type", "failure_category", "version")


def runs_matching(*, status: str | Iterable[str] | None = None, type: Any = None,
                  workflow_id_prefix: str | None = None, tags: Iterable[str] | None = None,
                  attributes: dict[str, Any] | None = None, created_after: datetime | None = None,
                  created_before: datetime | None = None, schedule: Any = None, parent: Any = None,
                  failure_category: str | Iterable[str] | None = None,
                  version: int | None = None, queue: str | None = None) -> QuerySet[Workflow]:
    """The runs every given filter matches (unordered). ``queue``: a queue's name ("default": runs of no
    queue)."""
    runs: QuerySet[Workflow] = Workflow.objects.all()
    if status is not None:
        runs = runs.filter(status__in=_choices(status, RunStatus.values, "status"))
    if type is not None:
        runs = runs.filter(workflow_type__in=type_names(type))
    if workflow_id_prefix is not None:
        if not isinstance(workflow_id_prefix, str) or not workflow_id_prefix:
            raise InvalidArgument(f"workflow_id_prefix must be a non-empty string, got {workflow_id_prefix!r}")
        check_text(workflow_id_prefix, "workflow_id_prefix")
        runs = runs.filter(workflow_id__startswith=workflow_id_prefix)
    if tags is not None:
        runs = _with_tags(runs, tags)
    if attributes is not None:
        runs = runs.filter(attribute_filter(attributes))
    if created_after is not None:
        runs = runs.filter(created_at__gte=_moment(created_after, "created_after"))
    if created_before is not None:
        runs = runs.filter(created_at__lt=_moment(created_before, "created_before"))
    if schedule is not None:
        schedule_id = getattr(schedule, "schedule_id", schedule)
        if not isinstance(schedule_id, str):
            raise InvalidArgument(f"schedule must be a schedule id or a Schedule, got {schedule!r}")
        check_text(schedule_id, "schedule")
        runs = runs.filter(schedule__schedule_id=schedule_id)
    if parent is not None:
        runs = runs.filter(parent_id=_run_id(parent, "parent"))
    if failure_category is not None:
        runs = runs.filter(failure_category__in=_choices(failure_category, FailureCategory.values,
                                                         "failure_category"))
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise InvalidArgument(f"version must be an int >= 1, got {version!r}")
        runs = runs.filter(version=version)
    if queue is not None:
        if not isinstance(queue, str) or not queue:
            raise InvalidArgument(f"queue must be a queue's name, got {queue!r}")
        check_text(queue, "queue")
        runs = runs.filter(queue="" if queue == NO_QUEUE else queue)
    return runs


def list_runs(**filters: Any) -> QuerySet[Workflow]:
    """The runs matching ``filters`` (see :func:`runs_matching`), newest first: slice it for a page."""
    _known(filters)
    runs = runs_matching(**filters)  # every filter checked, in order
    conditions = filters.get("attributes")
    driver = None if conditions is None else _driver(_conditions(conditions))
    if conditions is None or driver is None:
        return runs.order_by("-created_at", "-run_id")
    # An equality drives: the run joined to its one row of that value, newest first by the row's created_at
    # (the run's), so a page walks the row's index in order; the other conditions stay EXISTS.
    rest = {key: value for key, value in conditions.items() if key != driver.key}
    runs = runs_matching(**{**filters, "attributes": rest})
    return runs.filter(attribute_values__name=driver.name, **{f"attribute_values__{driver.column}": driver.value}
                       ).order_by("-attribute_values__created_at", "-run_id")


def count_runs(*, group_by: str = "status", **filters: Any) -> dict[Any, int]:
    """How many runs match ``filters``, per ``group_by``: "status", "type", "failure_category", "version", or a
    declared search attribute (a run counts once per value it has: a keyword_list once per keyword; runs
    without the attribute are not counted)."""
    _known(filters)
    runs = runs_matching(**filters)
    if group_by in GROUPS:
        column = "workflow_type" if group_by == "type" else group_by
        # COUNT(*): read from an index on the column alone (an index-only scan), not from the rows.
        rows = runs.order_by().values_list(column).annotate(n=Count("*"))
        return {key: n for key, n in rows}
    kind = attributes.kind_of(group_by)
    column = attributes.COLUMNS[kind]
    # A run has one row per value (per keyword for a keyword_list), so rows are counted, from the attribute's
    # index; a filter on the runs narrows them to the matching runs' rows.
    values = SearchAttributeValue.objects.filter(name=group_by, **{f"{column}__isnull": False})
    if runs.query.has_filters():
        values = values.filter(run__in=runs.values("pk"))
    return {key: n for key, n in values.order_by().values_list(column).annotate(n=Count("*"))}


class _Condition(NamedTuple):
    key: str
    name: str
    kind: str
    column: str
    lookup: str
    value: Any


def _driver(conditions: list[_Condition]) -> _Condition | None:
    """The equality that drives a page: the first on a non-bool attribute (a bool has two values), else one on a
    bool; none if every condition is a range, a list or a text search."""
    equalities = [c for c in conditions if c.lookup == "exact" and c.kind != "text"]
    return next((c for c in equalities if c.kind != "bool"), equalities[0] if equalities else None)


def attribute_filter(conditions: dict[str, Any]) -> Q:
    """``{"customer_id": 7, "amount__gte": 100, "region__in": ["eu", "us"]}``: every condition holds."""
    combined = Q()
    per_name: dict[str, dict[str, Any]] = {}
    for c in _conditions(conditions):
        lookup = {f"{c.column}__{'icontains' if c.lookup == 'contains' else c.lookup}": c.value}
        same_row = per_name.setdefault(c.name, {})
        if c.kind == "keyword_list" or lookup.keys() & same_row.keys():  # keywords are rows of their own
            combined &= Q(Exists(SearchAttributeValue.objects.filter(run=OuterRef("pk"), name=c.name, **lookup)))
        else:  # one row per run: a range's bounds hold on the same row
            same_row.update(lookup)
    for name, lookups in per_name.items():
        if lookups:
            combined &= Q(Exists(SearchAttributeValue.objects.filter(run=OuterRef("pk"), name=name, **lookups)))
    return combined


def _conditions(conditions: Any) -> list[_Condition]:
    """Each attribute condition, checked."""
    if not isinstance(conditions, dict):
        raise InvalidArgument(f"attributes must be a dict of attribute[__lookup] -> value, got {conditions!r}")
    checked_conditions = []
    for key, value in conditions.items():
        name, _, lookup = str(key).partition("__")
        lookup = lookup or "exact"
        kind = attributes.kind_of(name)
        if lookup not in LOOKUPS:
            raise InvalidArgument(f"attribute filter {key!r}: the lookups are {', '.join(LOOKUPS)}")
        if (lookup == "contains") != (kind == "text") and not (lookup == "exact" and kind != "text"):
            raise InvalidArgument(f"attribute filter {key!r}: a {kind} attribute takes "
                                  + ("__contains (text is not compared whole)" if kind == "text" else
                                     "exact, gt, gte, lt, lte or in"))
        item_kind = "keyword" if kind == "keyword_list" else kind
        if lookup == "in":
            if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
                raise InvalidArgument(f"attribute filter {key!r} takes a list, got {value!r}")
            checked: Any = [attributes.check_scalar(name, item, item_kind) for item in value]
        else:
            checked = attributes.check_scalar(name, value, "text" if lookup == "contains" else item_kind)
        checked_conditions.append(_Condition(str(key), name, kind, attributes.COLUMNS[kind], lookup, checked))
    return checked_conditions


def _known(filters: dict[str, Any]) -> None:
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise InvalidArgument(f"unknown filter(s) {unknown}; the filters are {', '.join(FILTERS)}")


def type_names(value: Any) -> list[str]:
    """The workflow type names of a ``type`` filter (names or workflow functions, one or a list). A name no
    longer registered is taken while runs of it are stored, so they can still be found (and purged)."""
    names = []
    for item in [value] if callable(value) else _listed(value, "type"):
        try:
            names.append(get_workflow(item).name)
        except WorkflowNotRegistered as exc:
            if isinstance(item, str):
                check_text(item, "type filter")  # PostgreSQL refuses NUL even in a WHERE
            if isinstance(item, str) and Workflow.objects.filter(workflow_type=item).exists():
                names.append(item)
            else:
                raise InvalidArgument(f"type filter: {exc}") from None
    return names


def _listed(value: Any, what: str) -> list[Any]:
    """One value or a list of them (a str is one value, not a list of characters)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    raise InvalidArgument(f"{what} must be one value or a list of them, got {value!r}")


def _choices(value: Any, allowed: list[str], what: str) -> list[str]:
    values = _listed(value, what)
    wrong = [v for v in values if v not in allowed]
    if wrong or not values:
        raise InvalidArgument(f"{what} must be one or a list of {', '.join(allowed)}; got {value!r}")
    return values


def _moment(value: Any, what: str) -> datetime:
    if not isinstance(value, datetime) or timezone.is_naive(value):
        raise InvalidArgument(f"{what} must be an aware datetime, got {value!r}")
    try:  # the database adapter converts to UTC: 9999-12-31T23:59-01:00 would overflow there (a 500)
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidArgument(f"{what} is out of range in UTC, got {value!r}") from None


def _run_id(value: Any, what: str) -> uuid.UUID:
    value = getattr(value, "run_id", value)
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise InvalidArgument(f"{what} must be a run id, a handle or a run, got {value!r}") from None


def _with_tags(runs: QuerySet[Workflow], tags: Any) -> QuerySet[Workflow]:
    """Runs that have every tag."""
    wanted = _listed(tags, "tags")
    if not wanted or not all(isinstance(tag, str) and tag for tag in wanted):
        raise InvalidArgument(f"tags must be a non-empty list of tags, got {tags!r}")
    for tag in wanted:
        check_text(tag, "a tag filter")
    vendor = connections[router.db_for_read(Workflow)].vendor
    if vendor != "sqlite":
        return runs.filter(tags__contains=wanted)
    # SQLite's JSON has no containment: one json_each probe per tag.
    table = Workflow._meta.db_table
    for tag in wanted:
        runs = runs.filter(RawSQL(f'EXISTS (SELECT 1 FROM json_each("{table}"."tags") WHERE json_each.value = %s)',
                                  [tag], output_field=BooleanField()))
    return runs
