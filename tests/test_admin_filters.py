"""The run changelist's filters by search attribute, version and tag (issue 16), through the Django test client,
and the run page's list of attributes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.models import Workflow

pytestmark = pytest.mark.django_db

RUNS = "admin:django_weft_workflow_changelist"


@pytest.fixture
def runs():
    """Three runs with attributes (tests/settings.py declares them), tags and versions."""
    made = {
        "a": weft.start("test.long_sleep", workflow_id="a", tags=["eu", "vip"], search_attributes={
            "customer_id": 7, "region": "eu", "amount": Decimal("150.00"), "labels": ["new", "gold"],
            "vip": True, "due": datetime(2030, 1, 10, tzinfo=UTC), "note": "Called about a late parcel"}),
        "b": weft.start("test.long_sleep", workflow_id="b", tags=["eu"], search_attributes={
            "customer_id": 8, "region": "us", "amount": "50", "labels": ["new"], "vip": False,
            "due": datetime(2030, 1, 20, tzinfo=UTC)}),
        "c": weft.start("evolve.versioned", workflow_id="c"),
    }
    assert Workflow.objects.get(workflow_id="c").version == 2
    return made


def listed(client, **params) -> list[str]:
    page = client.get(reverse(RUNS), params)
    assert page.status_code == 200, page.status_code
    return sorted(run.workflow_id for run in page.context["cl"].result_list)


FILTERED = [
    ({}, ["a", "b", "c"]),
    ({"attr_customer_id": "7"}, ["a"]),
    ({"attr_customer_id__gte": "8"}, ["b"]),
    ({"attr_customer_id__gte": "7", "attr_customer_id__lte": "8"}, ["a", "b"]),
    ({"attr_region": "us"}, ["b"]),
    ({"attr_labels": "new"}, ["a", "b"]),
    ({"attr_labels": "gold"}, ["a"]),
    ({"attr_vip": "1"}, ["a"]),
    ({"attr_vip": "0"}, ["b"]),
    ({"attr_amount__gte": "100"}, ["a"]),
    ({"attr_amount__gte": "50", "attr_amount__lte": "50.00"}, ["b"]),
    ({"attr_due__gte": "2030-01-15"}, ["b"]),
    ({"attr_due__lte": "2030-01-10T00:00"}, ["a"]),
    ({"attr_note__contains": "LATE"}, ["a"]),
    ({"attr_amount__gte": "", "attr_amount__lte": ""}, ["a", "b", "c"]),  # an empty box filters nothing
    ({"version": "2"}, ["c"]),
    ({"version": "1"}, ["a", "b"]),
    ({"tag": "eu"}, ["a", "b"]),
    ({"tag": "eu, vip"}, ["a"]),
    ({"tag": "eu", "attr_region": "us", "status__exact": "pending"}, ["b"]),
]


@pytest.mark.parametrize("params, expected", FILTERED)
def test_each_filter_matches_what_list_runs_matches(staff_client, runs, params, expected):
    assert listed(staff_client, **params) == expected


@pytest.mark.parametrize("params, expected", [case for case in FILTERED if any(case[0].values())])
def test_all_runs_matching_each_filter_are_the_runs_the_list_shows(staff_client, runs, params, expected):
    body = staff_client.get(reverse(RUNS), params).content.decode()
    assert f"All {len(expected)} run" in body and "weft-bulk-cancel" in body
    page = staff_client.get(reverse("admin:django_weft_workflow_bulk", args=["cancel"]), params)
    assert page.status_code == 200
    preview = page.context["preview"]
    assert preview.matched == len(expected)
    assert sorted(run.workflow_id for run in page.context["sample"]) == expected


@pytest.mark.parametrize("params, message", [
    ({"attr_customer_id": "seven"}, "Customer id: &#x27;seven&#x27; is not a whole number"),
    ({"attr_amount__gte": "1.5.5"}, "search attribute &#x27;amount&#x27; is decimal"),
    ({"attr_due__gte": "soon"}, "is not a date and time"),
    ({"version": "x"}, "version must be an int"),
])
def test_a_value_the_rules_refuse_is_an_error_and_matches_nothing(staff_client, runs, params, message):
    page = staff_client.get(reverse(RUNS), params)
    assert page.status_code == 200 and list(page.context["cl"].result_list) == []
    assert message in page.content.decode()


def test_the_sidebar_offers_a_filter_per_declared_attribute_keeping_the_others(staff_client, runs):
    body = staff_client.get(reverse(RUNS), {"status__exact": "pending", "attr_region": "eu"}).content.decode()
    for name in ("attr_customer_id", "attr_customer_id__gte", "attr_customer_id__lte", "attr_amount__gte",
                 "attr_due__lte", "attr_note__contains", "attr_labels", "tag"):
        assert f'name="{name}"' in body
    assert '<input type="hidden" name="status__exact" value="pending">' in body  # another filter's form keeps it
    assert 'name="attr_region" value="eu"' in body
    assert "?attr_vip=1" in body or "attr_vip=1" in body


@override_settings(WEFT_SEARCH_ATTRIBUTES={"region": "keyword"})
def test_the_filters_follow_the_setting(staff_client, runs):
    body = staff_client.get(reverse(RUNS)).content.decode()
    assert 'name="attr_region"' in body and "attr_customer_id" not in body


def test_the_run_page_lists_its_attributes_escaped(staff_client):
    handle = weft.start("test.long_sleep", search_attributes={
        "note": "<script>alert(1)</script>", "labels": ["b", "a"], "amount": "12.50"})
    Workflow.objects.filter(pk=handle.run_id).update(
        search_attributes={**handle.refresh().search_attributes, "gone": "<i>old</i>"})
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "<script>alert(1)</script>" not in body and "<i>old</i>" not in body
    assert "<tr><td>note</td><td>text</td><td>&lt;script&gt;alert(1)&lt;/script&gt;</td></tr>" in body
    assert "<tr><td>labels</td><td>keyword_list</td><td>a, b</td></tr>" in body
    assert "<tr><td>amount</td><td>decimal</td><td>12.50</td></tr>" in body
    assert "<tr><td>gone</td><td>not declared</td><td>&lt;i&gt;old&lt;/i&gt;</td></tr>" in body


def test_many_workflow_types_are_offered_in_one_select_that_filters(staff_client, runs):
    """The test session registers far more than WorkflowTypeFilter.MAX_LINKS types: the sidebar offers them in one
    select (not hundreds of links), each option the changelist filtered by its type."""
    from django.utils.html import escape

    from django_weft.admin.runs import WorkflowTypeFilter
    from django_weft.common.registry import registered_workflow_names

    assert len(registered_workflow_names()) > WorkflowTypeFilter.MAX_LINKS
    body = staff_client.get(reverse(RUNS)).content.decode()
    assert body.count('class="weft-filter-select"') == 1
    assert f'<option value="{escape("?type=test.long_sleep")}">test.long_sleep</option>' in body
    assert '<a href="?type=test.long_sleep">' not in body
    assert listed(staff_client, type="test.long_sleep") == ["a", "b"]
    selected = staff_client.get(reverse(RUNS), {"type": "evolve.versioned"}).content.decode()
    assert f'<option value="{escape("?type=evolve.versioned")}" selected>evolve.versioned</option>' in selected


def test_the_queue_filter_offers_the_configured_queues_without_reading_the_runs(staff_client, weft_env):
    """Queues come from WEFT_QUEUES (tests/settings.py) and QueueState, not a SELECT DISTINCT over every run;
    "default" lists the runs started on no queue, as weft_maintenance --queues names them."""
    on_queue = weft.start("test.long_sleep", workflow_id="on-emails", queue="emails")
    weft.start("test.long_sleep", workflow_id="on-none")
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        body = staff_client.get(reverse(RUNS)).content.decode()
    assert '<a href="?queue=emails">emails</a>' in body and '<a href="?queue=default">default (no queue)</a>' in body
    assert not [query["sql"] for query in captured.captured_queries if "DISTINCT" in query["sql"]]
    assert listed(staff_client, queue="emails") == [on_queue.workflow_id]
    assert listed(staff_client, queue="default") == ["on-none"]
