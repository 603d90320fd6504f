"""POST bulk/<operation>: a dry run previews, its token acts, a changed set is 409; each operation with its
permission, the filters of GET runs, and the audit record naming the key."""

from __future__ import annotations

import pytest

import django_weft as weft
from django_weft.models import BulkOperation, RunStatus, Signal, Workflow
from tests.api_helpers import error_of

pytestmark = pytest.mark.django_db


def started(n: int, tag: str = "b") -> list:
    return [weft.start("test.approval", f"{tag}{i}", tags=[tag]) for i in range(n)]


def preview(api, operation: str, **body):
    response = api.post(f"bulk/{operation}", {"dry_run": True, **body})
    assert response.status_code == 200, response.json()
    return response.json()


def test_a_dry_run_previews_and_its_token_acts(api):
    runs = started(3)
    other = weft.start("test.approval", "x", tags=["other"])
    filters = {"tag": ["b"]}
    shown = preview(api, "cancel", filters=filters, reason="incident 7")
    assert shown["matched"] == 3 and shown["count"] is None
    assert shown["sample_ids"][0] == str(runs[-1].run_id)
    assert Workflow.objects.filter(status=RunStatus.CANCELLED).count() == 0
    done = api.post("bulk/cancel", {"filters": filters, "reason": "incident 7",
                                    "confirmation_token": shown["confirmation_token"]}).json()
    assert (done["count"], done["matched"], done["skipped"]) == (3, 3, 0)
    audit = BulkOperation.objects.get(pk=done["audit_id"])
    assert (audit.operation, audit.count, audit.requested_by) == ("cancel", 3, "key:key 1")
    assert audit.filters == {"tags": ["b"]}
    assert Workflow.objects.get(pk=other.run_id).status == RunStatus.PENDING
    assert {r.error["message"] for r in Workflow.objects.filter(tags__isnull=False, status="cancelled")} == {
        "incident 7"}


def test_a_set_that_changed_since_the_preview_is_409_and_nothing_is_done(api):
    started(2)
    shown = preview(api, "terminate", filters={"tag": ["b"]})
    started(1)
    refused = api.post("bulk/terminate", {"filters": {"tag": ["b"]}, "confirmation_token": shown["confirmation_token"]})
    assert error_of(refused) == (409, "bulk_set_changed")
    assert not Workflow.objects.filter(status=RunStatus.TIMED_OUT).exists()
    other_filters = api.post("bulk/terminate", {"filters": {"tag": ["c"]},
                                                "confirmation_token": shown["confirmation_token"]})
    assert error_of(other_filters) == (409, "bulk_set_changed")
    assert error_of(api.post("bulk/cancel", {"filters": {"tag": ["b"]}, "confirmation_token": "forged"})) == (
        409, "bulk_set_changed")


@pytest.mark.parametrize("body", [{}, {"dry_run": True, "confirmation_token": "t"}, {"filters": {"tag": ["b"]}}])
def test_neither_or_both_of_dry_run_and_a_token_is_422(api, body):
    assert error_of(api.post("bulk/cancel", body)) == (422, "invalid_argument")


def test_signal_sends_the_payload_to_each_open_run(api):
    started(2)
    shown = preview(api, "signal", filters={"tag": ["b"], "status": ["pending"]}, signal="approval", payload={"ok": 1})
    done = api.post("bulk/signal", {"filters": {"tag": ["b"], "status": ["pending"]}, "signal": "approval",
                                    "payload": {"ok": 1}, "confirmation_token": shown["confirmation_token"]}).json()
    assert done["count"] == 2 and Signal.objects.filter(name="approval").count() == 2
    assert error_of(api.post("bulk/signal", {"dry_run": True})) == (422, "invalid_argument")  # no signal name


def test_suspend_resume_retry_and_purge(api, weft_env):
    started(2)
    weft.start("test.uncaught", "f", tags=["b"])
    weft_env.drive()

    def act(operation: str, **body) -> int:
        shown = preview(api, operation, filters={"tag": ["b"]}, **body)
        return api.post(f"bulk/{operation}", {"filters": {"tag": ["b"]}, **body,
                                              "confirmation_token": shown["confirmation_token"]}).json()["count"]

    assert act("suspend", reason="maintenance") == 2
    assert act("resume") == 2
    assert act("retry_failed") == 1
    weft_env.drive()  # it fails again
    assert act("cancel") == 2
    weft_env.drive()  # the runs' code sees the cancel
    assert act("purge") == 3
    assert not Workflow.objects.exists()


@pytest.mark.parametrize(("operation", "codename"), [
    ("cancel", "cancel_workflow"), ("terminate", "cancel_workflow"), ("signal", "signal_workflow"),
    ("retry_failed", "retry_workflow"), ("suspend", "suspend_workflow"), ("resume", "suspend_workflow"),
    ("purge", "purge_workflow")])
def test_each_operation_needs_the_permission_the_admin_asks_for(key_with, operation, codename):
    body = {"dry_run": True, **({"signal": "approval"} if operation == "signal" else {})}
    assert error_of(key_with("view_workflow").post(f"bulk/{operation}", body)) == (403, "forbidden")
    assert key_with(codename).post(f"bulk/{operation}", body).status_code == 200


def test_a_field_the_operation_does_not_take_is_refused_not_ignored(api):
    response = api.post("bulk/cancel", {"dry_run": True, "payload": {"a": 1}, "signal": "approval"})
    assert error_of(response) == (422, "invalid_argument")
    assert "bulk cancel takes no payload, signal" in response.json()["error"]
    assert api.post("bulk/cancel", {"dry_run": True, "reason": "why"}).status_code == 200


def test_bulk_filters_are_checked_like_the_lists(api):
    assert error_of(api.post("bulk/cancel", {"dry_run": True, "filters": {"status": ["nope"]}})) == (
        422, "invalid_argument")
    assert error_of(api.post("bulk/cancel", {"dry_run": True, "filters": {"attr": ["undeclared=1"]}})) == (
        422, "invalid_argument")
    assert error_of(api.post("bulk/cancel", {"dry_run": True, "filters": {"colour": "red"}})) == (
        422, "invalid_request")
    assert error_of(api.post("bulk/cancel", {"dry_run": True, "filter": {"tag": ["b"]}})) == (422, "invalid_request")
    assert error_of(api.post("bulk/explode", {"dry_run": True})) == (422, "invalid_request")
    # A JSON true is no version (pydantic would read it as 1 and act on version 1's runs).
    assert error_of(api.post("bulk/cancel", {"dry_run": True, "filters": {"version": True}})) == (
        422, "invalid_request")
    assert api.get("runs", {"version": "1"}).status_code == 200  # a query string's text still reads as a number
