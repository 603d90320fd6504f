"""The HTTP API refuses what it cannot honour (design 9.1): payloads nested deeper than the one limit
(django_weft.common.codec.MAX_DEPTH) are 422 at every entrance and whatever is stored renders; unknown body fields are
422; every id that can be created can be addressed (slashes and route words included, percent-encoded) and a
missing one is a JSON 404; a missing, wrong or revoked key is 401 on every method."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection
from django.db.models.signals import pre_save
from django.test import Client

import django_weft as weft
from django_weft.api.schemas import TOO_DEEP
from django_weft.common.codec import MAX_DEPTH
from django_weft.models import AsyncActivity, BulkOperation, Schedule, Signal, Workflow, WorkflowUpdate
from tests.api_helpers import EVERY_PERMISSION, Api, error_of, make_key

pytestmark = pytest.mark.django_db

SCHEDULES = ("view_schedule", "add_schedule", "change_schedule")


@pytest.fixture
def api(key_with) -> Api:
    """A key holding every permission the API asks for, schedules' too."""
    return key_with(*EVERY_PERMISSION, *SCHEDULES)


def deep_json(depth: int) -> str:
    """JSON text of a list nested ``depth`` deep (Python's encoder cannot write the deepest)."""
    return "[" * depth + '"leaf"' + "]" * depth


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


# --- nesting --------------------------------------------------------------------------------------------


@pytest.fixture
def targets(weft_env) -> str:
    """Open runs to signal, update and complete, and a schedule to change; the async activity's token."""
    weft.start("test.approval", "k", workflow_id="open")
    weft.start("updates.cart", "u", workflow_id="cart")
    waiting = weft.start("test.async", "a", workflow_id="async")
    weft.create_schedule("nightly", "test.approval", "k", every=60)
    weft_env.drive()
    return AsyncActivity.objects.get(run_id=waiting.run_id).token


# (method, path, body with DEEP where the deep value goes): every route that takes a payload.
PAYLOAD_ROUTES = [
    ("post", "runs", '{"workflow": "test.approval", "input": DEEP}'),
    ("post", "runs/start_or_signal", '{"workflow": "test.collect", "input": 1, "signal": "item", "payload": DEEP, '
                                     '"idempotency_key": "k"}'),
    ("post", "runs/start_or_signal", '{"workflow": "test.collect", "input": DEEP, "signal": "item", '
                                     '"idempotency_key": "k"}'),
    ("post", "runs/open/signals/approval", '{"payload": DEEP}'),
    ("post", "runs/cart/updates/add_item", '{"payload": DEEP, "timeout": 0}'),
    ("post", "runs/cart/queries/items", '{"args": [DEEP]}'),
    ("post", "complete", '{"token": TOKEN, "result": DEEP}'),
    ("post", "heartbeat", '{"token": TOKEN, "details": DEEP}'),
    ("post", "schedules", '{"schedule_id": "other", "workflow": "test.approval", "input": DEEP, "every": 60}'),
    ("patch", "schedules/nightly", '{"input": DEEP}'),
    ("post", "bulk/signal", '{"signal": "approval", "payload": DEEP, "dry_run": true}'),
]


def state() -> tuple:
    return (sorted(Workflow.objects.values_list("workflow_id", "status")), Signal.objects.count(),
            WorkflowUpdate.objects.count(), sorted(AsyncActivity.objects.values_list("status", flat=True)),
            sorted(Schedule.objects.values_list("schedule_id", "input")), BulkOperation.objects.count())


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 999, 5000])
@pytest.mark.parametrize(("method", "path", "body"), PAYLOAD_ROUTES)
def test_a_payload_nested_deeper_than_the_limit_is_422_at_every_entrance(api, targets, method, path, body, depth):
    before = state()
    raw = body.replace("DEEP", deep_json(depth)).replace("TOKEN", json.dumps(targets))
    response = getattr(api.client, method)("/weft/api/" + path, raw, content_type="application/json",
                                           headers=api.headers)
    assert error_of(response) == (422, "payload_too_deep")
    assert f"{MAX_DEPTH} levels" in response.json()["error"]
    assert state() == before


def test_a_payload_at_the_limit_is_stored_and_renders(api, weft_env):
    assert api.post("runs", {"workflow": "test.approval", "input": "k", "workflow_id": "w"}).status_code == 201
    weft_env.drive()
    assert api.post("runs/w/signals/approval", {"payload": nested(MAX_DEPTH)}).status_code == 202
    weft_env.drive()
    assert api.get("runs/w").json()["result"] == nested(MAX_DEPTH)


def test_what_was_stored_deeper_before_the_limit_renders_cut_at_it(api, weft_env):
    handle = weft.start("test.steps", {"key": "d", "count": 1}, workflow_id="legacy")
    schedule = weft.create_schedule("legacy", "test.approval", "k", every=60)
    weft_env.drive()
    stored = b"\x91" * 600 + b"\xa1x"  # ["x"] nested 600 deep, as msgpack
    Workflow.objects.filter(pk=handle.run_id).update(result=stored)
    Schedule.objects.filter(pk=schedule.pk).update(input=stored)
    cut: Any = TOO_DEEP
    for _ in range(MAX_DEPTH):
        cut = [cut]
    for response in (api.get("runs/legacy"), api.get("runs/legacy/result", {"timeout": 0})):
        assert response.status_code == 200 and response.json()["result"] == cut
    listed = api.get("runs")
    assert listed.status_code == 200 and listed.json()["results"][0]["result"] == cut
    assert api.get("schedules/legacy").json()["input"] == cut
    assert api.get("schedules").json()["results"][0]["input"] == cut


# --- unknown body fields --------------------------------------------------------------------------------


def test_a_misspelt_idempotency_key_is_refused_not_a_new_run_each_time(api):
    for _ in range(3):
        refused = api.post("runs", {"workflow": "test.approval", "idempotencyKey": "order-7"})
        assert error_of(refused) == (422, "invalid_request")
        assert refused.json()["error"] == "idempotencyKey: unknown field"
    assert not Workflow.objects.exists()


# (method, path, a body holding one field the document does not name, that field): every route that takes a body.
UNKNOWN_FIELDS = [
    ("post", "runs", {"workflow": "test.approval", "workflowId": "w-2"}, "workflowId"),
    ("post", "runs", {"workflow": "test.approval", "start_afer": 60}, "start_afer"),
    ("post", "runs/start_or_signal", {"workflow": "test.collect", "input": 1, "signal": "item", "workflow_id": "sos",
                                      "signalId": "s1"}, "signalId"),
    ("post", "runs/open/signals/approval", {"payload": 1, "signalId": "s1"}, "signalId"),
    ("post", "runs/open/cancel", {"reson": "typo"}, "reson"),
    ("post", "runs/open/terminate", {"reason": "r", "force": True}, "force"),
    ("post", "runs/open/fork", {"from_step": 1, "fromStep": 1}, "fromStep"),
    ("post", "runs/cart/updates/add_item", {"payload": "A1", "updateId": "u1", "timeout": 0}, "updateId"),
    ("post", "runs/cart/queries/items", {"args": [], "kwargs": {}}, "kwargs"),
    ("post", "complete", {"token": "TOKEN", "result": 1, "reslt": 1}, "reslt"),
    ("post", "fail", {"token": "TOKEN", "error": "no", "retry": False}, "retry"),
    ("post", "heartbeat", {"token": "TOKEN", "detail": 1}, "detail"),
    ("post", "bulk/cancel", {"dry_run": True, "dryrun": False}, "dryrun"),
    ("post", "schedules", {"schedule_id": "other", "workflow": "test.approval", "every": 60, "scheduleId": "x"},
     "scheduleId"),
    ("patch", "schedules/nightly", {"cronn": "0 * * * *"}, "cronn"),
    ("post", "schedules/nightly/pause", {"notes": "typo"}, "notes"),
    ("post", "schedules/nightly/backfill", {"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z",
                                            "dry_run": True}, "dry_run"),
]


@pytest.mark.parametrize(("method", "path", "body", "unknown"), UNKNOWN_FIELDS)
def test_every_body_refuses_a_field_the_document_does_not_name(api, targets, method, path, body, unknown):
    before = state()
    refused = api.call(method, path, {name: targets if value == "TOKEN" else value for name, value in body.items()})
    assert error_of(refused) == (422, "invalid_request")
    assert refused.json()["error"] == f"{unknown}: unknown field"
    assert state() == before


@pytest.mark.parametrize(("view", "field", "typo"), [("complete", "result", "reslt"), ("fail", "error", "retry"),
                                                     ("heartbeat", "details", "detail")])
def test_the_webhooks_refuse_a_field_they_do_not_take(client, targets, view, field, typo):
    body = {"token": targets, field: "x", typo: 1}
    response = client.post(f"/weft/{view}/", json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and "unknown field" in response.json()["error"]
    assert AsyncActivity.objects.get(token=targets).status == "pending"


# --- who calls ------------------------------------------------------------------------------------------

# (method, path, body): every route that asks for credentials, each method.
AUTHENTICATED_ROUTES = [
    ("post", "runs", {"workflow": "test.approval"}),
    ("get", "runs", None),
    ("get", "runs/count", None),
    ("post", "runs/start_or_signal", {"workflow": "test.collect", "signal": "s", "idempotency_key": "k"}),
    ("get", "runs/open", None),
    ("get", "runs/open/result", {"timeout": 0}),
    ("post", "runs/open/signals/approval", None),
    ("post", "runs/open/cancel", None),
    ("post", "runs/open/terminate", None),
    ("post", "runs/open/fork", {"from_step": 1}),
    ("post", "runs/cart/queries/items", None),
    ("post", "runs/cart/updates/add_item", {"payload": "A1", "timeout": 0}),
    ("get", "runs/cart/updates/add_item/u1", {"timeout": 0}),
    ("post", "bulk/cancel", {"dry_run": True}),
    ("post", "schedules", {"schedule_id": "s", "workflow": "test.approval", "every": 60}),
    ("get", "schedules", None),
    ("get", "schedules/nightly", None),
    ("patch", "schedules/nightly", {"every": 120}),
    ("post", "schedules/nightly/pause", None),
    ("post", "schedules/nightly/resume", None),
    ("post", "schedules/nightly/trigger", None),
    ("post", "schedules/nightly/backfill", {"start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z"}),
    ("post", "schedules/nightly/cancel", None),
]


@pytest.fixture
def revoked_key(db) -> str:
    from django_weft.services import api_keys

    _record, key = api_keys.create("gone", [f"django_weft.{codename}" for codename in (*EVERY_PERMISSION,
                                                                                      *SCHEDULES)])
    api_keys.revoke("gone")
    return key


def send(client: Client, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    if method == "get":
        return client.get("/weft/api/" + path, body or {}, headers=headers)
    data = "" if body is None else json.dumps(body)
    return getattr(client, method)("/weft/api/" + path, data, content_type="application/json", headers=headers)


@pytest.mark.parametrize(("method", "path", "body"), AUTHENTICATED_ROUTES)
def test_a_missing_wrong_or_revoked_key_is_401_on_every_method(targets, revoked_key, method, path, body):
    """As a real server calls the API: with Django's CSRF check on (no session: nothing for it to protect)."""
    before = state()
    strict = Client(enforce_csrf_checks=True)
    for authorization in (None, "Bearer weft_000000000000_forged", f"Bearer {revoked_key}", "Bearer"):
        refused = send(strict, method, path, body, {"Authorization": authorization} if authorization else {})
        assert error_of(refused) == (401, "unauthenticated"), (authorization, refused.content)
        assert refused["WWW-Authenticate"] == 'Bearer realm="django_weft"'
    assert state() == before


@pytest.mark.parametrize("header", ["bearer {key}", "BEARER {key}", "Bearer   {key}", "  Bearer {key}  "])
def test_the_bearer_scheme_is_case_insensitive(client, header):
    key = make_key("add_workflow", "view_workflow")
    response = client.post("/weft/api/runs", json.dumps({"workflow": "test.approval"}),
                           content_type="application/json", headers={"Authorization": header.format(key=key)})
    assert response.status_code == 201


def test_a_wrong_key_is_401_even_beside_a_session(staff_client):
    response = staff_client.get("/weft/api/runs", headers={"Authorization": "Bearer weft_000000000000_forged"})
    assert error_of(response) == (401, "unauthenticated") and "unknown or revoked" in response.json()["error"]
    assert staff_client.get("/weft/api/runs").status_code == 200  # the session alone still does


# --- addressing -----------------------------------------------------------------------------------------

# Ids and names as the Python API and the API create them: slashes, route words, what percent-encoding carries.
ODD_IDS = ["order/42", "a/result", "count", "start_or_signal", "signals", "/lead", "trail/", "a//b", "50%",
           "a%2Fb", "what?", "#1", " spaced ", "ü/ß", ".", "..", "new\nline"]
ROUTE_WORDS = {"count", "start_or_signal"}  # where runs/<id> is also a route of its own


def encoded(text: str) -> str:
    """``text`` as one path segment: percent-encoded, and a route word with its first letter encoded too."""
    segment = quote(text, safe="")
    return f"%{ord(segment[0]):02X}{segment[1:]}" if text in ROUTE_WORDS else segment


@pytest.mark.parametrize("workflow_id", ODD_IDS)
def test_a_run_whose_id_has_a_slash_or_is_a_route_word_is_reachable_by_every_route(api, weft_env, workflow_id):
    created = api.post("runs", {"workflow": "test.approval", "input": "k", "workflow_id": workflow_id})
    assert created.status_code == 201 and created.json()["workflow_id"] == workflow_id
    weft_env.drive()
    at = "runs/" + encoded(workflow_id)
    assert api.get(at).json()["workflow_id"] == workflow_id
    assert error_of(api.get(at + "/result", {"timeout": 0})) == (408, "timeout")
    assert api.post(at + "/signals/" + encoded("pay/ment"), {"payload": 1}).status_code == 202
    assert Signal.objects.get().name == "pay/ment"
    assert error_of(api.post(at + "/queries/" + encoded("a/b"))) == (422, "query_not_found")
    assert error_of(api.post(at + "/updates/" + encoded("a/b"), {"timeout": 0})) == (422, "update_rejected")
    assert error_of(api.get(at + "/updates/x/" + encoded("u/1"), {"timeout": 0})) == (404, "workflow_not_found")
    assert api.post(at + "/signals/approval", {"payload": "yes"}).status_code == 202
    weft_env.drive()
    finished = api.get(at + "/result", {"timeout": 0}).json()
    assert (finished["workflow_id"], finished["result"]) == (workflow_id, "yes")
    forked = api.post(at + "/fork", {"from_step": 1, "workflow_id": workflow_id + "/fork"})
    assert forked.status_code == 201
    assert api.post("runs/" + encoded(workflow_id + "/fork") + "/terminate").json()["changed"] is True


def test_an_update_of_a_run_whose_id_has_a_slash_answers_and_is_read_again_by_its_id(api, weft_env):
    weft.start("updates.cart", "u", workflow_id="cart/7")
    weft_env.drive()
    sent = api.post("runs/cart%2F7/updates/add_item", {"payload": "A1", "update_id": "u/1"})
    assert sent.json() == {"update_id": "u/1", "name": "add_item", "result": 1}
    assert api.get("runs/cart%2F7/updates/add_item/u%2F1", {"timeout": 0}).json()["result"] == 1
    assert api.post("runs/cart%2F7/queries/items").json() == {"result": ["A1"]}
    assert api.post("runs/cart%2F7/cancel", {"reason": "r"}).json()["changed"] is True


@pytest.mark.parametrize("schedule_id", ["team/nightly", "count", "a%2Fb", "..", "pause"])
def test_a_schedule_whose_id_has_a_slash_is_reachable_by_every_route(api, schedule_id):
    body = {"schedule_id": schedule_id, "workflow": "test.approval", "input": "k", "every": 3600}
    assert api.post("schedules", body).status_code == 201
    at = "schedules/" + quote(schedule_id, safe="")
    assert api.get(at).json()["schedule_id"] == schedule_id
    assert api.patch(at, {"every": 7200}).json()["every"] == 7200
    assert api.post(at + "/pause", {"note": "n"}).json()["status"] == "paused"
    assert api.post(at + "/resume").json()["status"] == "active"
    assert api.post(at + "/trigger").json()["schedule_id"] == schedule_id
    assert api.post(at + "/backfill", {"start": "2030-01-01T00:00:00Z", "end": "2030-01-01T00:00:00Z"}).json()[
        "schedule_id"] == schedule_id
    assert api.post(at + "/cancel").json()["status"] == "cancelled"


def test_a_route_word_needs_an_encoded_letter_only_where_it_is_a_route_itself(api, weft_env):
    for workflow_id in ("count", "start_or_signal"):
        weft.start("test.approval", "k", workflow_id=workflow_id)
    assert set(api.get("runs/count").json()) == {"counts", "total"}  # the route
    assert api.get("runs/%63ount").json()["workflow_id"] == "count"  # the run
    assert api.get("runs/start_or_signal").json()["workflow_id"] == "start_or_signal"  # no GET route of that path
    assert api.post("runs/count/cancel").json()["workflow_id"] == "count"


def test_without_the_sent_path_ids_with_a_slash_still_work_where_nothing_follows_that_reads_as_a_route(
        client, weft_env):
    """runserver and Django's test client pass only the decoded path: a parameter then takes as many segments as
    leave a route matching."""
    plain = Api(client, make_key(*EVERY_PERMISSION), sent_path=False)
    for workflow_id in ("order/42", "a/result", "a"):
        assert plain.post("runs", {"workflow": "test.approval", "input": "k", "workflow_id": workflow_id}).status_code \
            == 201
    weft_env.drive()
    assert plain.get("runs/order%2F42").json()["workflow_id"] == "order/42"
    assert plain.get("runs/order/42").json()["workflow_id"] == "order/42"
    assert plain.post("runs/order%2F42/signals/pay%2Fment").json()["workflow_id"] == "order/42"
    assert Signal.objects.get().name == "pay/ment"
    assert plain.post("runs/order/42/cancel").json()["changed"] is True
    assert error_of(plain.get("runs/a%2Fresult", {"timeout": 0})) == (408, "timeout")  # read as the result of a
    assert Api(client, make_key(*EVERY_PERMISSION)).get("runs/a%2Fresult").json()["workflow_id"] == "a/result"


@pytest.mark.parametrize("path", ["", "nowhere", "openapi.json/x", "docs/", "runs/", "bulk", "nowhere/x/y"])
def test_every_path_no_route_takes_is_a_json_404(api, path):
    assert error_of(api.get(path)) == (404, "not_found")
    assert error_of(api.post(path, {})) == (404, "not_found")


@pytest.mark.parametrize(("path", "code"), [("runs/a/b/c/d/e/f/g", "workflow_not_found"),
                                            ("schedules/x/y/z", "schedule_not_found"),
                                            ("runs//cancel", "workflow_not_found")])
def test_a_slash_sent_unencoded_is_read_as_part_of_the_id_where_no_route_takes_the_path_otherwise(api, path, code):
    """As a proxy that decodes %2F would send it; still a JSON 404 when there is no such id."""
    assert error_of(api.get(path)) == (404, code)


def test_a_missing_id_is_a_json_404_on_every_route_and_a_wrong_method_a_json_405(api):
    assert error_of(api.get("runs/order%2F404")) == (404, "workflow_not_found")
    assert error_of(api.get("schedules/team%2F404")) == (404, "schedule_not_found")
    refused = api.client.delete("/weft/api/runs/x", headers=api.headers)
    assert error_of(refused) == (405, "method_not_allowed") and refused["Allow"] == "GET"
    refused = api.client.put("/weft/api/schedules/x", headers=api.headers)
    assert error_of(refused) == (405, "method_not_allowed") and refused["Allow"] == "GET, PATCH"


# --- ATOMIC_REQUESTS through the dispatcher -------------------------------------------------------------


@pytest.fixture
def transaction_depths() -> Any:
    """How many atomic blocks were open each time a schedule or a bulk operation's record was saved."""
    depths: list[int] = []

    def record(sender: Any, **kwargs: Any) -> None:
        depths.append(len(connection.atomic_blocks))

    for model in (Schedule, BulkOperation):
        pre_save.connect(record, sender=model)
    yield depths
    for model in (Schedule, BulkOperation):
        pre_save.disconnect(record, sender=model)


def create_then_bulk_cancel(api: Api, schedule_id: str) -> None:
    assert api.post("schedules", {"schedule_id": schedule_id, "workflow": "test.approval", "every": 60}).status_code \
        == 201
    api.post("runs", {"workflow": "test.approval", "input": "a"})
    preview = api.post("bulk/cancel", {"filters": {"status": ["pending"]}, "dry_run": True}).json()
    done = api.post("bulk/cancel", {"filters": {"status": ["pending"]}, "confirmation_token":
                                    preview["confirmation_token"]})
    assert done.json()["count"] == 1


def test_atomic_requests_puts_each_route_in_a_transaction_but_the_ones_that_wait_or_act_on_many(
        transactional_db, api, monkeypatch, transaction_depths):
    create_then_bulk_cancel(api, "one")
    created, cancelled = transaction_depths
    transaction_depths.clear()
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    create_then_bulk_cancel(api, "two")  # bulk/cancel: a transaction per run, by design, not one around it all
    created_in_one, cancelled_in_one = transaction_depths
    assert created_in_one > created and cancelled_in_one == cancelled


def test_an_error_object_with_a_field_besides_message_and_type_is_refused_everywhere(api, client, targets):
    refused = api.post("fail", {"token": targets, "error": {"message": "declined", "typ": "Declined"}})
    assert error_of(refused) == (422, "invalid_request") and "typ: unknown field" in refused.json()["error"]
    hook = client.post("/weft/fail/", json.dumps({"token": targets, "error": {"message": "no", "typ": "Declined"}}),
                       content_type="application/json")
    assert hook.status_code == 400 and "'typ'" in hook.json()["error"]
    with pytest.raises(weft.InvalidArgument, match="'typ'"):
        weft.fail_async_activity(targets, {"message": "declined", "typ": "Declined"})
    assert AsyncActivity.objects.get(token=targets).status == "pending"
    assert api.post("fail", {"token": targets, "error": {"message": "declined", "type": "Declined"}}).json() == {
        "ok": True}
    assert AsyncActivity.objects.get(token=targets).error["type"] == "Declined"


@pytest.mark.parametrize("unknown", ["WorkflowId", "str", "a[0]", "Input"])
def test_the_unknown_field_is_named_whatever_it_looks_like(api, unknown):
    refused = api.post("runs", {"workflow": "test.approval", unknown: 1})  # schemathesis sent "A" and "QVAUSwvfb"
    assert refused.json() == {"error": f"{unknown}: unknown field", "code": "invalid_request"}
