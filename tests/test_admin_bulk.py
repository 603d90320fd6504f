"""The admin's "apply to all runs matching this filter": the changelist's filter as bulk filters, the dry run on a
confirmation page, its token posted back; and the audit records."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.http import QueryDict
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.admin import bulk as admin_bulk
from django_weft.models import BulkOperation, RunStatus, Workflow

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_weft_workflow_changelist"


def bulk_url(name: str, query: str) -> str:
    return reverse("admin:django_weft_workflow_bulk", args=[name]) + "?" + query


def started(n: int) -> list:
    return [weft.start("test.long_sleep") for _ in range(n)]


def statuses(handles) -> set:
    return set(Workflow.objects.filter(pk__in=[h.run_id for h in handles]).values_list("status", flat=True))


def test_a_filtered_changelist_links_every_bulk_operation(staff_client):
    started(3)
    page = staff_client.get(reverse(CHANGELIST), {"status__exact": "pending"})
    body = page.content.decode()
    assert "All 3 runs matching this filter:" in body
    for name in ("cancel", "terminate", "retry", "suspend", "resume", "purge"):
        assert bulk_url(name, "status__exact=pending").replace("&", "&amp;") in body
    assert "weft-bulk-links" not in staff_client.get(reverse(CHANGELIST)).content.decode()  # not filtered
    body = staff_client.get(reverse(CHANGELIST), {"status__exact": "pending", "q": "x"}).content.decode()
    assert "No bulk operations on this list" in body and "the search box" in body and "weft-bulk-cancel" not in body


def test_the_confirmation_page_previews_and_its_token_acts(staff_client):
    runs = started(3)
    other = weft.start("test.steps", {"count": 1, "key": "adm-bulk"})
    query = "status__exact=pending&type=test.long_sleep&o=2"
    page = staff_client.get(bulk_url("cancel", query))
    assert page.status_code == 200
    preview = page.context["preview"]
    assert preview.matched == 3 and {r.pk for r in page.context["sample"]} == {h.run_id for h in runs}
    body = page.content.decode()
    assert "Cancel all 3 runs matching this filter?" in body and preview.confirmation_token in body
    assert reverse("admin:django_weft_workflow_change", args=[runs[0].run_id]) in body
    assert statuses(runs) == {RunStatus.PENDING} and not BulkOperation.objects.exists()

    done = staff_client.post(bulk_url("cancel", query), {"confirmation_token": preview.confirmation_token})
    assert done.status_code == 302
    assert done["Location"] == reverse(CHANGELIST) + "?status__exact=pending&type=test.long_sleep"
    assert statuses(runs) == {RunStatus.CANCELLED} and statuses([other]) == {RunStatus.PENDING}
    run = Workflow.objects.get(pk=runs[0].run_id)
    assert run.error["message"] == "cancelled by admin in the admin (all runs matching a filter)"
    audit = BulkOperation.objects.get()
    assert (audit.operation, audit.requested_by, audit.matched, audit.count) == ("cancel", "admin (admin)", 3, 3)
    assert audit.filters == {"status": ["pending"], "type": ["test.long_sleep"]}
    message = [str(m) for m in staff_client.get(done["Location"]).context["messages"]]
    assert any("3 of 3 matching run(s) changed" in m and f"#{audit.pk}" in m for m in message)


def test_a_set_that_changed_is_refused_and_previewed_again(staff_client):
    runs = started(2)
    query = "status__exact=pending"
    token = staff_client.get(bulk_url("suspend", query)).context["preview"].confirmation_token
    late = weft.start("test.long_sleep")
    page = staff_client.post(bulk_url("suspend", query), {"confirmation_token": token})
    assert page.status_code == 200
    assert any("changed since the preview (2 then, 3 now)" in str(m) for m in page.context["messages"])
    assert page.context["preview"].matched == 3  # the new preview
    assert statuses([*runs, late]) == {RunStatus.PENDING} and not BulkOperation.objects.exists()

    page = staff_client.post(bulk_url("suspend", query), {"confirmation_token": token + "x"})
    assert any("not issued by a bulk preview" in str(m) for m in page.context["messages"])
    assert statuses([*runs, late]) == {RunStatus.PENDING}


def test_every_operation_goes_through_the_same_path(staff_client):
    def apply(name: str, query: str) -> int:
        token = staff_client.get(bulk_url(name, query)).context["preview"].confirmation_token
        assert staff_client.post(bulk_url(name, query), {"confirmation_token": token}).status_code == 302
        return BulkOperation.objects.filter(operation=admin_bulk.BULK_ACTIONS[name].operation).latest("id").count

    failed = [weft.start("test.uncaught", f"adm-bulk-{i}") for i in range(2)]
    weft.run_maintenance()
    assert statuses(failed) == {RunStatus.FAILED}
    assert apply("retry", "failure_category__exact=application") == 2
    assert statuses(failed) == {RunStatus.RUNNING}
    assert apply("suspend", "type=test.uncaught") == 2
    assert apply("resume", "workflow_type=test.uncaught") == 2
    assert apply("terminate", "workflow_type=test.uncaught") == 2
    assert {r.termination_reason for r in Workflow.objects.filter(workflow_type="test.uncaught")} == {"terminated"}
    assert apply("purge", "status__exact=timed_out") == 2
    assert not Workflow.objects.filter(workflow_type="test.uncaught").exists()


def test_nothing_to_do_and_unsupported_filters_offer_no_form(staff_client):
    started(1)
    page = staff_client.get(bulk_url("retry", "status__exact=pending")).content.decode()
    assert "nothing to do" in page and "confirmation_token" not in page
    page = staff_client.get(bulk_url("cancel", "status__exact=pending&q=abc")).content.decode()
    assert "no bulk equivalent" in page and "the search box" in page and "confirmation_token" not in page
    page = staff_client.get(bulk_url("cancel", "p=2")).content.decode()
    assert "the list is not filtered" in page and "confirmation_token" not in page
    assert staff_client.get(reverse("admin:django_weft_workflow_bulk", args=["explode"])).status_code == 404


def test_each_operation_needs_its_permission(client):
    user = get_user_model().objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_workflow", "retry_workflow"]))
    client.force_login(user)
    runs = started(1)
    body = client.get(reverse(CHANGELIST), {"status__exact": "pending"}).content.decode()
    assert "weft-bulk-retry" in body and "weft-bulk-cancel" not in body and "weft-bulk-purge" not in body
    assert client.get(bulk_url("cancel", "status__exact=pending")).status_code == 403
    assert client.post(bulk_url("cancel", "status__exact=pending"), {"confirmation_token": "x"}).status_code == 403
    assert client.get(bulk_url("retry", "status__exact=pending")).status_code == 200
    assert statuses(runs) == {RunStatus.PENDING}


def test_the_changelist_query_string_maps_to_runs_matching_filters():
    schedule = weft.create_schedule("bulk-sched", "test.collect", 0, cron="*/5 * * * *", timezone="UTC")
    query = QueryDict("status__exact=failed&workflow_type=test.steps&failure_category__exact=application"
                      "&created_at__gte=2024-01-01+00:00:00%2B00:00&created_at__lt=2024-02-01+00:00:00%2B00:00"
                      f"&schedule__id__exact={schedule.pk}&version=2&o=1&p=3&e=1")
    filters, unsupported = admin_bulk.changelist_filters(query)
    assert unsupported == []
    assert filters == {"status": ["failed"], "type": ["test.steps"], "failure_category": ["application"],
                       "created_after": datetime(2024, 1, 1, tzinfo=UTC),
                       "created_before": datetime(2024, 2, 1, tzinfo=UTC),
                       "schedule": "bulk-sched", "version": 2}
    assert admin_bulk.changelist_filters(QueryDict("version=two&colour=red"))[1] == [
        "version (version must be a whole number, got 'two')", "colour"]
    with override_settings(WEFT_SEARCH_ATTRIBUTES={"amount": "decimal", "region": "keyword"}):
        filters, unsupported = admin_bulk.changelist_filters(QueryDict("attr_amount__gte=10&attr_region=eu"))
        assert unsupported == [] and filters == {"attributes": {"amount__gte": 10, "region": "eu"}}


def test_a_filter_of_another_module_registers_its_parameters(monkeypatch):
    monkeypatch.setattr(admin_bulk, "PARAMETERS", dict(admin_bulk.PARAMETERS))
    assert admin_bulk.changelist_filters(QueryDict("prefix=order-"))[1] == ["prefix"]
    admin_bulk.register_parameter("prefix", lambda value, filters: filters.update(workflow_id_prefix=value))
    assert admin_bulk.changelist_filters(QueryDict("prefix=order-")) == ({"workflow_id_prefix": "order-"}, [])


def test_the_audit_records_are_listed_read_only(staff_client):
    started(2)
    preview = weft.bulk.cancel("audit me", dry_run=True, status="pending")
    weft.bulk.cancel("audit me", confirmation_token=preview.confirmation_token, status="pending",
                     requested_by="script")
    record = BulkOperation.objects.get()
    page = staff_client.get(reverse("admin:django_weft_bulkoperation_changelist"))
    assert page.status_code == 200 and "script" in page.content.decode()
    body = staff_client.get(reverse("admin:django_weft_bulkoperation_change", args=[record.pk])).content.decode()
    assert "audit me" in body and "pending" in body
    assert staff_client.get(reverse("admin:django_weft_bulkoperation_add")).status_code == 403
    staff_client.post(reverse("admin:django_weft_bulkoperation_change", args=[record.pk]), {"count": 0})
    assert BulkOperation.objects.get().count == 2


def test_a_large_set_is_warned_about_and_never_wrapped_in_one_request_transaction(staff_client, monkeypatch):
    from django.db import connection
    from django.urls import resolve

    monkeypatch.setattr(admin_bulk, "LARGE", 2)
    started(2)
    assert "the request may time out" in staff_client.get(bulk_url("cancel", "status__exact=pending")).content.decode()
    view = resolve(reverse("admin:django_weft_workflow_bulk", args=["cancel"])).func
    assert connection.alias in getattr(view, "_non_atomic_requests", set())  # ATOMIC_REQUESTS leaves it alone


def test_a_reason_given_on_the_confirmation_page_is_confirmed_and_recorded(staff_client):
    runs = started(2)
    query = "status__exact=pending&type=test.long_sleep"
    body = staff_client.get(bulk_url("cancel", query)).content.decode()
    assert 'name="weft_reason"' in body  # asked for, as the list's action and weft_runs ask
    assert '<input type="hidden" name="type" value="test.long_sleep">' in body  # the filter stays with it
    with_reason = query + "&weft_reason=duplicate+orders+from+the+import"
    page = staff_client.get(bulk_url("cancel", with_reason))
    assert page.context["preview"].matched == 2 and "duplicate orders from the import" in page.content.decode()
    # The preview's token was issued for that reason: posted back to the same URL, it acts.
    done = staff_client.post(bulk_url("cancel", with_reason),
                             {"confirmation_token": page.context["preview"].confirmation_token})
    assert done.status_code == 302 and "weft_reason" not in done["Location"]
    assert statuses(runs) == {RunStatus.CANCELLED}
    message = Workflow.objects.get(pk=runs[0].run_id).error["message"]
    assert message == "cancelled by admin in the admin (all runs matching a filter): duplicate orders from the import"
    # The token of the preview without a reason does not confirm one with a reason.
    more = started(1)
    plain = staff_client.get(bulk_url("cancel", query)).context["preview"].confirmation_token
    refused = staff_client.post(bulk_url("cancel", with_reason), {"confirmation_token": plain})
    assert refused.status_code == 200 and statuses(more) == {RunStatus.PENDING}
    assert "other arguments" in refused.content.decode()
