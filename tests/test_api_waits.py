"""The HTTP API's routes that wait for a run: the result long poll, queries, updates and their replies."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

import django_weft as weft
from django_weft.models import UpdateStatus, WorkflowUpdate
from tests.api_helpers import error_of

pytestmark = pytest.mark.django_db


# --- result ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("workflow", "arg", "status"), [
    ("test.steps", {"key": "r", "count": 1}, "completed"), ("test.uncaught", "r", "failed"),
    ("test.approval", "r", "cancelled"), ("test.approval", "t", "timed_out")])
def test_a_finished_run_answers_200_however_it_ended(api, weft_env, workflow, arg, status):
    handle = weft.start(workflow, arg, workflow_id="res-1")
    if status == "cancelled":
        handle.cancel("no")
    elif status == "timed_out":
        handle.terminate("stuck")
    weft_env.drive()
    body = api.get("runs/res-1/result", {"timeout": 0}).json()
    assert body["status"] == status
    if status == "completed":
        assert body["result"] == ["R:0"] and body["error"] is None
    else:
        assert body["result"] is None and body["error"]["message"]


def test_a_run_still_open_after_the_timeout_is_408_and_the_wait_is_bounded(api):
    weft.start("test.approval", "open", workflow_id="res-2")
    began = time.monotonic()
    assert error_of(api.get("runs/res-2/result", {"timeout": 0.2})) == (408, "timeout")
    assert 0.2 <= time.monotonic() - began < 2
    with override_settings(WEFT_API_MAX_WAIT_SECONDS=0.1):  # the setting caps what the client asks for
        began = time.monotonic()
        assert error_of(api.get("runs/res-2/result", {"timeout": 30})) == (408, "timeout")
        assert time.monotonic() - began < 2


@pytest.mark.parametrize("timeout", [-1, 31, "soon"])
def test_a_bad_timeout_is_422(api, timeout):
    weft.start("test.approval", "open", workflow_id="res-3")
    assert error_of(api.get("runs/res-3/result", {"timeout": timeout})) == (422, "invalid_request")


def test_the_result_of_an_unknown_id_is_404(api):
    assert error_of(api.get("runs/none/result", {"timeout": 0})) == (404, "workflow_not_found")


# --- queries --------------------------------------------------------------------------------------------


@pytest.fixture
def cart(weft_env):
    weft.start("queries.cart", "ann", workflow_id="cart-q")
    weft_env.drive()
    weft.signal("cart-q", "add", "A1")
    weft_env.drive()


def test_a_query_answers_from_the_replayed_state(api, cart):
    assert api.post("runs/cart-q/queries/items").json() == {"result": ["A1"]}
    assert api.post("runs/cart-q/queries/has", {"args": ["A1"]}).json() == {"result": True}
    assert api.post("runs/cart-q/queries/total", {"args": []}).json() == {"result": 3}


@pytest.mark.parametrize(("name", "body", "status", "code"), [
    ("nope", None, 422, "query_not_found"), ("broken", None, 422, "query_failed"),
    ("unencodable", None, 422, "query_failed"), ("has", {"args": "A1"}, 422, "invalid_request"),
    ("has", {"args": ["A1", "B2"]}, 422, "query_failed"),
])
def test_a_query_that_cannot_answer_is_422(api, cart, name, body, status, code):
    assert error_of(api.post(f"runs/cart-q/queries/{name}", body)) == (status, code)


def test_a_query_of_an_unknown_id_is_404(api):
    assert error_of(api.post("runs/none/queries/items")) == (404, "workflow_not_found")


# --- updates --------------------------------------------------------------------------------------------


@pytest.fixture
def shop(weft_env):
    weft.start("updates.cart", "bo", workflow_id="cart-u")
    weft_env.drive()


def test_an_update_answers_with_the_handlers_reply_and_a_repeat_with_the_same(api, shop):
    sent = api.post("runs/cart-u/updates/add_item", {"payload": "A1", "update_id": "u1"})
    assert sent.status_code == 200
    assert sent.json() == {"update_id": "u1", "name": "add_item", "result": 1}
    assert api.post("runs/cart-u/updates/add_item", {"payload": "A1", "update_id": "u1"}).json()["result"] == 1
    assert api.get("runs/cart-u/updates/add_item/u1", {"timeout": 0}).json()["result"] == 1
    generated = api.post("runs/cart-u/updates/add_item", {"payload": "B2"}).json()
    assert generated["result"] == 2 and generated["update_id"]


@pytest.mark.parametrize(("name", "body", "code"), [
    ("add_item", {"payload": "Z9"}, "update_rejected"),  # its validator refuses
    ("nope", {"payload": 1}, "update_rejected"),  # no such handler
    ("clear", {"payload": 1}, "update_failed"),  # the handler raised (takes no argument)
    ("add_item", {"payload": "A1", "timeout": 31}, "invalid_request"),
    ("add_item", {"payload": "A1", "update_id": ""}, "invalid_request"),
])
def test_an_update_refused_or_failed_is_422(api, shop, name, body, code):
    assert error_of(api.post(f"runs/cart-u/updates/{name}", body)) == (422, code)


def test_an_update_not_applied_in_time_is_408_with_its_id_and_applies_later(api, weft_env):
    handle = weft.start("updates.cart", "cy", workflow_id="cart-late")
    weft_env.drive()
    handle.suspend("paused")  # the run cannot apply it until resumed
    late = api.post("runs/cart-late/updates/add_item", {"payload": "A1", "update_id": "late-1", "timeout": 0})
    assert error_of(late) == (408, "timeout")
    assert late.json()["update_id"] == "late-1" and "stays accepted" in late.json()["error"]
    assert WorkflowUpdate.objects.get(update_id="late-1").status == UpdateStatus.PENDING
    assert error_of(api.get("runs/cart-late/updates/add_item/late-1", {"timeout": 0})) == (408, "timeout")
    handle.resume()
    assert api.get("runs/cart-late/updates/add_item/late-1").json()["result"] == 1


def test_an_update_of_a_closed_run_is_409_and_of_an_unknown_one_404(api, weft_env):
    weft.start("updates.quick", workflow_id="done-u")
    weft_env.drive()
    assert error_of(api.post("runs/done-u/updates/late")) == (409, "workflow_closed")
    assert error_of(api.post("runs/none/updates/late")) == (404, "workflow_not_found")
    assert error_of(api.get("runs/done-u/updates/late/none")) == (404, "workflow_not_found")


@pytest.mark.parametrize("path", ["runs/a%00/updates/add/u", "runs/a/updates/a%00/u", "runs/a/updates/add/u%00"])
def test_a_nul_in_an_update_reply_path_is_422(api, path):
    # PostgreSQL refuses NUL even in a WHERE: it was a 500 there (a 404 on SQLite).
    assert error_of(api.get(path, {"timeout": 0})) == (422, "invalid_argument")
