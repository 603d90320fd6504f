"""The HTTP API's run routes through Django's test client: start, start_or_signal, list (every filter), count,
get, signal, cancel, terminate, fork; each success and each error it can give."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import RunStatus, Signal, Workflow
from tests.api_helpers import error_of
from tests.testapp.fork_workflows import BUG

pytestmark = pytest.mark.django_db


# --- start ----------------------------------------------------------------------------------------------


def test_start_answers_201_and_a_repeat_of_the_id_409(api):
    response = api.post("runs", {"workflow": "test.approval", "input": "k", "workflow_id": "order-1",
                                 "tags": ["web"], "search_attributes": {"region": "eu"}})
    assert response.status_code == 201
    body = response.json()
    assert (body["workflow_id"], body["status"]) == ("order-1", RunStatus.PENDING)
    run = Workflow.objects.get(pk=body["run_id"])
    assert (run.tags, run.search_attributes) == (["web"], {"region": "eu"})
    assert error_of(api.post("runs", {"workflow": "test.approval", "input": "k", "workflow_id": "order-1"})) == (
        409, "workflow_already_exists")


def test_start_with_an_idempotency_key_returns_the_same_run(api):
    first = api.post("runs", {"workflow": "test.approval", "input": "k", "idempotency_key": "pay-1"}).json()
    again = api.post("runs", {"workflow": "test.approval", "input": "k", "idempotency_key": "pay-1"}).json()
    assert first["run_id"] == again["run_id"] and Workflow.objects.count() == 1


@pytest.mark.parametrize(("body", "code"), [
    ({"workflow": "no.such", "input": 1}, "unknown_workflow"),
    ({"input": 1}, "invalid_request"),
    ({"workflow": 7}, "invalid_request"),
    ({"workflow": "test.approval", "tags": "web"}, "invalid_request"),
    ({"workflow": "test.approval", "search_attributes": {"undeclared": 1}}, "invalid_argument"),
    ({"workflow": "test.approval", "search_attributes": {"customer_id": "seven"}}, "invalid_argument"),
    ({"workflow": "test.approval", "on_terminal_conflict": "start_new"}, "invalid_argument"),
    ({"workflow": "test.approval", "start_after": -1}, "invalid_request"),
])
def test_a_bad_start_is_a_422_and_writes_nothing(api, body, code):
    assert error_of(api.post("runs", body)) == (422, code)
    assert not Workflow.objects.exists()


# --- start_or_signal ------------------------------------------------------------------------------------


def test_start_or_signal_starts_201_then_signals_200(api):
    body = {"workflow": "test.collect", "input": 2, "workflow_id": "cart-1", "signal": "item", "payload": "a",
            "signal_id": "s1", "tags": ["web"]}
    started = api.post("runs/start_or_signal", body)
    assert started.status_code == 201
    assert (started.json()["outcome"], started.json()["delivered"]) == ("started", True)
    again = api.post("runs/start_or_signal", body)  # the same signal_id: accepted, stored once
    assert again.status_code == 200
    assert (again.json()["outcome"], again.json()["delivered"]) == ("signalled", False)
    other = api.post("runs/start_or_signal", {**body, "signal_id": "s2", "payload": "b"})
    assert (other.status_code, other.json()["delivered"]) == (200, True)
    assert Workflow.objects.count() == 1 and Signal.objects.count() == 2


def test_start_or_signal_of_a_finished_run_is_409_and_without_an_id_422(api, weft_env):
    body = {"workflow": "test.collect", "input": 1, "workflow_id": "cart-2", "signal": "item", "signal_id": "s1"}
    assert api.post("runs/start_or_signal", body).status_code == 201
    weft_env.drive()
    assert error_of(api.post("runs/start_or_signal", {**body, "signal_id": "s2"})) == (409, "start_or_signal_conflict")
    assert error_of(api.post("runs/start_or_signal", {**body, "signal_id": None})) == (422, "invalid_argument")
    restarted = api.post("runs/start_or_signal", {**body, "signal_id": "s3", "on_terminal_conflict": "start_new"})
    assert restarted.status_code == 201


def test_start_or_signal_needs_both_start_and_signal_permissions(key_with):
    body = {"workflow": "test.collect", "input": 1, "signal": "item", "idempotency_key": "k"}
    assert error_of(key_with("add_workflow").post("runs/start_or_signal", body)) == (403, "forbidden")
    assert error_of(key_with("signal_workflow").post("runs/start_or_signal", body)) == (403, "forbidden")
    assert key_with("add_workflow", "signal_workflow").post("runs/start_or_signal", body).status_code == 201


# --- list and count -------------------------------------------------------------------------------------


def test_list_pages_newest_first_with_a_cursor(api):
    handles = [weft.start("test.approval", str(i)) for i in range(5)]
    first = api.get("runs", {"limit": 2}).json()
    assert [r["run_id"] for r in first["results"]] == [str(h.run_id) for h in handles[:-3:-1]]
    second = api.get("runs", {"limit": 2, "cursor": first["next"]}).json()
    third = api.get("runs", {"limit": 2, "cursor": second["next"]}).json()
    assert [r["run_id"] for r in second["results"] + third["results"]] == [str(h.run_id) for h in handles[2::-1]]
    assert third["next"] is None


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:00", "2025-01-01"])
def test_an_edited_cursor_is_422_not_a_500(api, moment):
    # Well-formed, but naive or overflowing in UTC when the adapter converts it.
    raw = json.dumps([moment, "00000000-0000-0000-0000-000000000000"]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert error_of(api.get("runs", {"cursor": cursor})) == (422, "invalid_cursor")


def test_list_takes_every_filter_of_finding(api, weft_env):
    parent = weft.start("test.parent", {"key": "p", "children": 1}, workflow_id="p-1")
    eu = weft.start("test.approval", "a", workflow_id="shop-eu", tags=["web", "vip"],
                    search_attributes={"region": "eu", "amount": "150.5", "customer_id": 7})
    weft.start("test.approval", "b", workflow_id="shop-us", tags=["web"],
               search_attributes={"region": "us", "amount": "20", "customer_id": 8})
    weft.start("test.uncaught", "c", workflow_id="crash-1")
    weft_env.drive()
    child = Workflow.objects.get(parent_id=parent.run_id)

    def ids(**params) -> set[str]:
        response = api.get("runs", params)
        assert response.status_code == 200, response.json()
        return {run["workflow_id"] for run in response.json()["results"]}

    assert ids(status="failed") == {"crash-1"}
    assert ids(status="failed,waiting", type="test.approval") == {"shop-eu", "shop-us"}
    assert ids(type=["test.uncaught", "test.parent"]) == {"crash-1", "p-1"}
    assert ids(workflow_id_prefix="shop-") == {"shop-eu", "shop-us"}
    assert ids(tag=["web", "vip"]) == {"shop-eu"}
    assert ids(attr="region=eu") == {"shop-eu"}
    assert ids(attr=["amount__gte=100", "customer_id__in=7,9"]) == {"shop-eu"}
    assert ids(attr="region__in=eu,us", status="waiting") == {"shop-eu", "shop-us"}
    assert ids(parent=str(parent.run_id)) == {child.workflow_id}
    assert ids(failure_category="application") == {"crash-1"}
    assert ids(version=1, workflow_id_prefix="crash") == {"crash-1"}
    created = eu.refresh().created_at
    assert "shop-eu" in ids(created_after=created.isoformat())
    assert ids(created_before=(created - timedelta(days=1)).isoformat()) == set()
    assert ids(schedule="none-such") == set()


@pytest.mark.parametrize("params", [
    {"status": "sleeping"}, {"type": "no.such"}, {"attr": "undeclared=1"}, {"attr": "customer_id=seven"},
    {"attr": "region"}, {"attr": "region__near=eu"}, {"created_after": "yesterday"}, {"parent": "not-a-uuid"},
    {"failure_category": "bad"}, {"version": 0}, {"version": "one"}, {"limit": 0}, {"limit": 501},
    {"cursor": "garbage"}, {"workflow_id_prefix": ""},
])
def test_a_bad_filter_is_a_422_naming_it(api, params):
    status, code = error_of(api.get("runs", params))
    assert status == 422 and code in ("invalid_argument", "invalid_request", "invalid_cursor", "unknown_workflow")


def test_count_groups_by_status_type_or_an_attribute(api, weft_env):
    weft.start("test.approval", "a", search_attributes={"region": "eu"})
    weft.start("test.approval", "b", search_attributes={"region": "eu"})
    weft.start("test.uncaught", "c", search_attributes={"region": "us"})
    weft_env.drive()
    by_status = api.get("runs/count").json()
    assert by_status == {"counts": [{"key": "waiting", "count": 2}, {"key": "failed", "count": 1}], "total": 3}
    by_region = api.get("runs/count", {"group_by": "region", "type": "test.approval"}).json()
    assert by_region == {"counts": [{"key": "eu", "count": 2}], "total": 2}
    assert api.get("runs/count", {"group_by": "version"}).json()["counts"] == [{"key": 1, "count": 3}]
    assert error_of(api.get("runs/count", {"group_by": "colour"})) == (422, "invalid_argument")
    assert error_of(api.get("runs/count", {"status": "nope"})) == (422, "invalid_argument")


# --- get, signal, cancel, terminate ---------------------------------------------------------------------


def test_get_returns_the_latest_run_and_404_for_an_unknown_id(api, weft_env):
    handle = weft.start("test.steps", {"key": "g", "count": 2}, workflow_id="get-1")
    weft_env.drive()
    body = api.get("runs/get-1").json()
    assert (body["run_id"], body["status"], body["result"]) == (str(handle.run_id), "completed", handle.result())
    assert error_of(api.get("runs/none-such")) == (404, "workflow_not_found")


def test_signal_202_then_a_repeat_is_not_delivered_and_a_closed_run_409(api, weft_env):
    weft.start("test.approval", "s", workflow_id="sig-1")
    weft_env.drive()
    sent = api.post("runs/sig-1/signals/approval", {"payload": "yes", "signal_id": "once"})
    assert (sent.status_code, sent.json()["delivered"]) == (202, True)
    assert api.post("runs/sig-1/signals/approval", {"payload": "yes", "signal_id": "once"}).json()["delivered"] is False
    weft_env.drive()
    assert error_of(api.post("runs/sig-1/signals/approval")) == (409, "workflow_closed")
    assert error_of(api.post("runs/none/signals/approval")) == (404, "workflow_not_found")


@pytest.mark.parametrize(("route", "status", "reason"), [
    ("cancel", RunStatus.CANCELLED, "cancelled by key:"), ("terminate", RunStatus.TIMED_OUT, "terminated by key:")])
def test_cancel_and_terminate_end_the_run_once(api, route, status, reason):
    weft.start("test.approval", "c", workflow_id="end-1")
    first = api.post(f"runs/end-1/{route}")
    assert first.status_code == 200
    assert (first.json()["status"], first.json()["changed"]) == (status, True)
    assert reason in Workflow.objects.get().error["message"]
    assert api.post(f"runs/end-1/{route}", {"reason": "again"}).json()["changed"] is False
    assert error_of(api.post(f"runs/none/{route}")) == (404, "workflow_not_found")
    assert error_of(api.post(f"runs/end-1/{route}", {"reason": 5})) == (422, "invalid_request")


def test_terminate_records_the_reason_given(api):
    weft.start("test.approval", "t", workflow_id="end-2")
    api.post("runs/end-2/terminate", {"reason": "stuck since Monday"})
    run = Workflow.objects.get()
    assert (run.termination_reason, run.error["message"]) == ("terminated", "terminated: stuck since Monday")


# --- fork -----------------------------------------------------------------------------------------------


@pytest.fixture
def failed_pipeline(weft_env):
    BUG["fixed"] = False
    weft.start("fork.pipeline", "api", workflow_id="pipe-1")
    weft_env.drive()
    yield
    BUG["fixed"] = False


def test_fork_starts_a_run_from_the_step_given(api, weft_env, failed_pipeline):
    BUG["fixed"] = True
    forked = api.post("runs/pipe-1/fork", {"from_step": 4})
    assert forked.status_code == 201
    assert forked.json()["workflow_id"] == "pipe-1:fork:4"
    weft_env.drive()
    assert api.get("runs/pipe-1:fork:4").json()["result"][3] == "fixed api:4"
    named = api.post("runs/pipe-1/fork", {"from_step": 1, "workflow_id": "pipe-again"})
    assert (named.status_code, named.json()["workflow_id"]) == (201, "pipe-again")
    assert error_of(api.post("runs/pipe-1/fork", {"from_step": 1, "workflow_id": "pipe-again"})) == (
        409, "workflow_already_exists")


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"from_step": 0}, 422, "invalid_request"), ({"from_step": "4"}, 201, None), ({}, 422, "invalid_request"),
    ({"from_step": 99}, 422, "invalid_argument"), ({"from_step": 1, "run_id": "nope"}, 422, "invalid_request"),
])
def test_fork_checks_its_body(api, failed_pipeline, body, status, code):
    response = api.post("runs/pipe-1/fork", body)
    assert response.status_code == status
    if code:
        assert error_of(response) == (status, code)


def test_fork_of_an_unknown_id_is_404(api):
    assert error_of(api.post("runs/none/fork", {"from_step": 1})) == (404, "workflow_not_found")
