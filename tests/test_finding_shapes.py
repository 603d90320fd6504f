"""The query shapes of weft.list_runs and weft.count_runs (finding.py) answer as the plain filters would: an
equality joined and ordered by its row, a range's bounds on one row, counts by attribute from the rows."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings

import django_weft as weft
from django_weft.models import SearchAttributeValue, Workflow

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("declared")]

DECLARED = {"customer_id": "int", "region": "keyword", "amount": "decimal", "labels": "keyword_list", "vip": "bool",
            "note": "text"}
COLUMNS = {"customer_id": "int_value", "region": "keyword_value", "amount": "decimal_value", "labels": "keyword_value",
           "vip": "bool_value", "note": "text_value"}


@pytest.fixture
def declared():
    with override_settings(WEFT_SEARCH_ATTRIBUTES=DECLARED):
        yield


def run_with(minutes_ago: int, status: str = "pending", **values) -> Workflow:
    """A run created ``minutes_ago``, with attribute rows as the write path stores them."""
    handle = weft.start("test.long_sleep")
    run = Workflow.objects.get(pk=handle.run_id)
    run.created_at -= timedelta(minutes=minutes_ago)
    run.status = status
    run.save(update_fields=["created_at", "status"])
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            SearchAttributeValue.objects.create(run=run, name=name, created_at=run.created_at, **{COLUMNS[name]: item})
    return run


def ids(runs) -> list:
    return [run.pk for run in runs]


def test_an_equality_page_is_newest_first_once_per_run_whatever_else_is_filtered():
    old = run_with(30, customer_id=7, region="eu", labels=["new", "gold"], vip=True)
    new = run_with(10, customer_id=7, region="us", labels=["new"], vip=False)
    run_with(20, customer_id=8, region="eu", labels=["gold"])
    middle = run_with(20, status="waiting", customer_id=7, region="eu", labels=["new", "old"], amount=Decimal(5))

    assert ids(weft.list_runs(attributes={"customer_id": 7})) == [new.pk, middle.pk, old.pk]
    assert ids(weft.list_runs(attributes={"customer_id": 7})[:2]) == [new.pk, middle.pk]
    assert weft.list_runs(attributes={"customer_id": 7}).count() == 3
    assert ids(weft.list_runs(attributes={"customer_id": 7, "region": "eu"})) == [middle.pk, old.pk]
    assert ids(weft.list_runs(attributes={"customer_id": 7}, status="waiting")) == [middle.pk]
    assert ids(weft.list_runs(attributes={"labels": "new"})) == [new.pk, middle.pk, old.pk]
    assert ids(weft.list_runs(attributes={"labels": "new", "customer_id__gte": 7, "amount": 5})) == [middle.pk]
    assert ids(weft.list_runs(attributes={"vip": True})) == [old.pk]
    assert ids(weft.list_runs(attributes={"vip": False, "region": "us"})) == [new.pk]
    assert ids(weft.list_runs(attributes={"customer_id": 9})) == []


def sql(runs: object) -> str:
    """The query's text with PostgreSQL's and SQLite's quotes (MySQL quotes names with backticks)."""
    return str(runs.query).replace("`", '"')  # type: ignore[attr-defined]


def test_a_page_on_an_equality_is_read_through_its_row_and_a_range_through_exists():
    equality = sql(weft.list_runs(attributes={"vip": True, "region": "eu"}))
    assert "INNER JOIN" in equality and '"django_weft_searchattributevalue"."keyword_value" = eu' in equality
    assert 'ORDER BY "django_weft_searchattributevalue"."created_at" DESC' in equality
    ranged = sql(weft.list_runs(attributes={"amount__gte": 1, "amount__lt": 9}))
    assert "JOIN" not in ranged and ranged.count("EXISTS") == 1  # both bounds on one row
    assert 'ORDER BY "django_weft_workflow"."created_at" DESC' in ranged
    assert "JOIN" not in str(weft.list_runs(attributes={"note__contains": "x", "region__in": ["eu"]}).query)


def test_a_range_holds_on_one_row_and_each_keyword_is_a_row_of_its_own():
    low = run_with(3, amount=Decimal("50"), labels=["new"])
    mid = run_with(2, amount=Decimal("150"), labels=["new", "gold"])
    run_with(1, amount=Decimal("250"), labels=["gold"])
    assert ids(weft.list_runs(attributes={"amount__gte": 100, "amount__lt": 200})) == [mid.pk]
    assert ids(weft.list_runs(attributes={"amount__gt": 10, "amount__lte": 150})) == [mid.pk, low.pk]
    assert ids(weft.list_runs(attributes={"amount": 50, "amount__exact": 150})) == []
    assert ids(weft.list_runs(attributes={"amount": 150, "amount__exact": 150})) == [mid.pk]
    assert ids(weft.list_runs(attributes={"labels": "new", "labels__in": ["gold"]})) == [mid.pk]
    assert weft.count_runs(attributes={"amount__gte": 100, "amount__lt": 200}) == {"pending": 1}


def test_counts_by_attribute_count_the_rows_of_the_matching_runs():
    run_with(3, region="eu", labels=["new", "gold"])
    run_with(2, status="waiting", region="eu", labels=["new"])
    run_with(1, region="us")
    run_with(0)  # no attributes: not counted
    assert weft.count_runs(group_by="region") == {"eu": 2, "us": 1}
    assert weft.count_runs(group_by="labels") == {"new": 2, "gold": 1}
    assert weft.count_runs(group_by="region", status="waiting") == {"eu": 1}
    assert weft.count_runs(group_by="labels", attributes={"region": "eu"}) == {"new": 2, "gold": 1}
    assert weft.count_runs(group_by="region", attributes={}) == {"eu": 2, "us": 1}
    assert weft.count_runs(group_by="vip") == {}
    assert weft.count_runs(group_by="status") == {"pending": 3, "waiting": 1}
    assert weft.count_runs(group_by="type", status=["waiting"]) == {"test.long_sleep": 1}
    assert weft.count_runs(group_by="failure_category") == {"": 4}
