"""weft.list_runs and weft.count_runs: every filter, checked before a query is built."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone

import django_weft as weft
from django_weft.models import SearchAttributeValue, Workflow

pytestmark = pytest.mark.django_db

DECLARED = {"customer_id": "int", "region": "keyword", "amount": "decimal", "labels": "keyword_list"}


def with_attributes(handle, **values) -> None:
    """Rows as the write path stores them (one per value, a keyword_list one per keyword)."""
    run = Workflow.objects.get(pk=handle.run_id)
    columns = {"customer_id": "int_value", "region": "keyword_value", "amount": "decimal_value",
               "labels": "keyword_value"}
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            SearchAttributeValue.objects.create(run=run, name=name, created_at=run.created_at,
                                                **{columns[name]: item})


@override_settings(WEFT_SEARCH_ATTRIBUTES=DECLARED)
def test_list_and_count_by_status_type_tags_and_attributes():
    a = weft.start("test.long_sleep", tags=["eu", "vip"])
    b = weft.start("test.long_sleep", tags=["eu"])
    c = weft.start("test.steps", {"count": 1})
    with_attributes(a, customer_id=7, region="eu", amount=Decimal("150.00"), labels=["new", "gold"])
    with_attributes(b, customer_id=8, region="us", amount=Decimal("50"), labels=["new"])
    assert list(weft.list_runs(type="test.long_sleep").values_list("pk", flat=True)) == [b.run_id, a.run_id]
    assert [r.pk for r in weft.list_runs(tags=["eu", "vip"])] == [a.run_id]
    assert [r.pk for r in weft.list_runs(attributes={"customer_id": 7})] == [a.run_id]
    assert [r.pk for r in weft.list_runs(attributes={"amount__gte": 100})] == [a.run_id]
    assert [r.pk for r in weft.list_runs(attributes={"region__in": ["eu", "us"], "labels": "new"})] == [
        b.run_id, a.run_id]
    assert weft.count_runs(group_by="type") == {"test.long_sleep": 2, "test.steps": 1}
    assert weft.count_runs(group_by="labels") == {"new": 2, "gold": 1}
    assert weft.count_runs(status="pending", type=["test.steps"]) == {"pending": 1}
    soon = timezone.now() + timedelta(days=1)
    assert weft.list_runs(created_after=soon).count() == 0 and weft.list_runs(created_before=soon).count() == 3
    assert c.run_id in set(weft.list_runs(workflow_id_prefix=c.workflow_id[:8]).values_list("pk", flat=True))


@override_settings(WEFT_SEARCH_ATTRIBUTES=DECLARED)
@pytest.mark.parametrize("filters, message", [
    ({"status": "sleeping"}, "status must be one or a list of"),
    ({"attributes": {"zone": 1}}, "'zone' is not declared"),
    ({"attributes": {"customer_id": "7"}}, "'customer_id' is int: it takes an int"),
    ({"attributes": {"amount__gte": 1.5}}, "not a float"),
    ({"attributes": {"region__near": "eu"}}, "the lookups are"),
    ({"created_after": timezone.now().replace(tzinfo=None)}, "aware datetime"),
    ({"colour": "red"}, "unknown filter"),
    ({"type": "no.such.workflow"}, "no.such.workflow"),
])
def test_bad_filters_are_clear_errors(filters, message):
    with pytest.raises((weft.InvalidArgument, weft.WorkflowNotRegistered), match=message):
        list(weft.list_runs(**filters))
