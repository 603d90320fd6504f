"""The runs list an operator uses (design 9.5): a workflow-id prefix search, the parent's workflow id in a column,
and a filter for top-level runs."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

import django_weft as weft

pytestmark = pytest.mark.django_db

URL = "admin:django_weft_workflow_changelist"


@weft.workflow(name="runlist.child")
def child(ctx: weft.Context) -> None:
    ctx.sleep(3600)


@weft.workflow(name="runlist.parent")
def parent(ctx: weft.Context) -> None:
    ctx.run_child("runlist.child")


def rows(page: str) -> list[str]:
    """The workflow ids the list shows."""
    return re.findall(r'class="field-workflow_id"><a [^>]*>([^<]*)</a>', page)


def parents(page: str) -> list[str]:
    return re.findall(r'class="field-parent_column"><a [^>]*>([^<]*)</a>', page)


def test_a_prefix_search_the_parent_column_and_top_level_only(staff_client, weft_env):
    weft.start("runlist.parent", workflow_id="order-1")
    weft.start("runlist.parent", workflow_id="order-2")
    weft.start("runlist.child", workflow_id="invoice-1")
    weft_env.drive()  # each parent starts its child
    listing = staff_client.get(reverse(URL), {"q": "order-*"}).content.decode()
    assert sorted(rows(listing)) == ["order-1", "order-2"]
    assert "start with it (order-*)" in listing
    everything = staff_client.get(reverse(URL)).content.decode()
    assert sorted(parents(everything)) == ["order-1", "order-2"]  # a child shows its parent's workflow id
    top = staff_client.get(reverse(URL), {"lineage": "top"}).content.decode()
    assert sorted(rows(top)) == ["invoice-1", "order-1", "order-2"]
    assert len(rows(staff_client.get(reverse(URL), {"lineage": "child"}).content.decode())) == 2


def test_a_cancel_from_the_list_asks_for_a_reason_and_records_it(staff_client, weft_env):
    handle = weft.start("runlist.child", workflow_id="cancel-me")
    weft_env.drive()
    data = {"action": "cancel_selected", "_selected_action": [str(handle.run_id)], "index": "0"}
    confirmation = staff_client.post(reverse(URL), data).content.decode()
    assert 'name="reason"' in confirmation
    staff_client.post(reverse(URL), {**data, "post": "yes", "reason": "duplicate order"}, follow=True)
    run = handle.refresh()
    assert run.cancel_reason.endswith("in the admin: duplicate order")


def test_the_type_filter_is_named_as_in_the_api_and_old_links_still_work(staff_client, weft_env):
    weft.start("runlist.child", workflow_id="typed")
    weft.start("runlist.parent", workflow_id="other-type")
    assert rows(staff_client.get(reverse(URL), {"type": "runlist.child"}).content.decode()) == ["typed"]
    assert rows(staff_client.get(reverse(URL), {"workflow_type": "runlist.child"}).content.decode()) == ["typed"]


def test_the_run_page_gives_times_to_the_second_in_one_labelled_zone_and_folds_the_bookkeeping(staff_client,
                                                                                               weft_env):
    handle = weft.start("runlist.parent", workflow_id="timed")
    weft_env.drive()
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    created = handle.refresh().created_at
    assert created.strftime("%Y-%m-%d %H:%M:%S UTC") in page  # the run's times: seconds, the zone named
    assert re.search(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC', page)  # the steps': milliseconds
    assert "a.m." not in page and "p.m." not in page
    assert "Admin change log" in page and ">History<" not in page  # not mistaken for the workflow's history
    assert page.count("<details") >= 2  # Execution and Flow control fold


@weft.workflow(name="runlist.fails")
def fails(ctx: weft.Context) -> None:
    ctx.set_query_handler("where", lambda: "before the failure")
    raise RuntimeError("broken on purpose")


def test_a_failed_runs_queries_panel_says_where_it_ended_without_an_alarm(staff_client, weft_env):
    handle = weft.start("runlist.fails")
    weft_env.drive()
    assert handle.refresh().status == "failed"
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    panel = page.split('id="weft-queries"', 1)[1].split("</fieldset>", 1)[0]
    assert "weft-replay-note" in panel and "errornote" not in panel and "where" in panel


def test_with_a_status_filter_the_list_offers_only_the_actions_that_apply(staff_client):
    def offered(params: dict) -> set[str]:
        page = staff_client.get(reverse(URL), params).content.decode()
        return set(re.findall(r'<option value="([a-z_]+_selected)"', page))

    assert offered({}) == {"cancel_selected", "retry_selected", "suspend_selected", "resume_selected",
                           "purge_selected"}
    assert offered({"status__exact": "failed"}) == {"retry_selected", "purge_selected"}
    assert offered({"status__exact": "waiting"}) == {"cancel_selected", "suspend_selected"}
    assert offered({"status__exact": "suspended"}) == {"cancel_selected", "resume_selected"}
