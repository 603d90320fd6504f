"""The indexed rows of search attributes (:class:`~django_weft.models.SearchAttributeValue`), written inside the
caller's transaction: with a new run (``transitions.insert_run``) and with the step of
``ctx.set_search_attributes`` (``journal.SetSearchAttributes``), so a run's rows never disagree with its
row's ``search_attributes``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_weft.common import attributes
from django_weft.models import SearchAttributeValue, Workflow


def _rows(run_id: Any, created_at: datetime, values: dict[str, Any]) -> list[SearchAttributeValue]:
    return [SearchAttributeValue(run_id=run_id, name=name, created_at=created_at, **{column: value})
            for name, column, value in attributes.column_values(values)]


def insert_for(run: Workflow) -> None:
    """The rows of a run being inserted, from its (checked) ``search_attributes``."""
    if run.search_attributes:
        SearchAttributeValue.objects.bulk_create(
            _rows(run.pk, run.created_at, attributes.from_json(run.search_attributes)))


def replace(run_id: Any, created_at: datetime, values: dict[str, Any], shown: dict[str, Any]) -> None:
    """Checked ``values`` set on a run: its row shows ``shown``; the rows of the names set are replaced (a
    None leaves none)."""
    Workflow.objects.filter(pk=run_id).update(search_attributes=shown)
    SearchAttributeValue.objects.filter(run_id=run_id, name__in=list(values)).delete()
    SearchAttributeValue.objects.bulk_create(_rows(run_id, created_at, values))
