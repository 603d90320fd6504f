"""Who may call what, and never a 500 for bad input: every route's permission (a key without it: 403; no
credentials: 401), sessions and CSRF, bodies too large, not JSON, of the wrong shape or nested too deeply;
the async-activity webhooks in the API; the staff-only docs page and the public OpenAPI document."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

import django_weft as weft
from django_weft.models import AsyncActivity, Workflow
from tests.api_helpers import BASE, Api, error_of

pytestmark = pytest.mark.django_db

START = {"workflow": "test.approval", "input": "x"}
# (method, path, body, the permission it needs): every route but the webhooks.
ROUTES = [
    ("post", "runs", START, "add_workflow"),
    ("post", "runs/start_or_signal", {**START, "signal": "s", "idempotency_key": "k"}, "signal_workflow"),
    ("get", "runs", None, "view_workflow"),
    ("get", "runs/count", None, "view_workflow"),
    ("get", "runs/w", None, "view_workflow"),
    ("get", "runs/w/result", {"timeout": 0}, "view_workflow"),
    ("post", "runs/w/signals/go", None, "signal_workflow"),
    ("post", "runs/w/cancel", None, "cancel_workflow"),
    ("post", "runs/w/terminate", None, "cancel_workflow"),
    ("post", "runs/w/fork", {"from_step": 1}, "retry_workflow"),
    ("post", "runs/w/queries/items", None, "view_workflow"),
    ("post", "runs/w/updates/add", {"timeout": 0}, "signal_workflow"),
    ("get", "runs/w/updates/add/u1", {"timeout": 0}, "view_workflow"),
    ("post", "bulk/cancel", {"dry_run": True}, "cancel_workflow"),
]
ALL_BUT = {codename for *_, codename in ROUTES} | {"add_workflow"}


def call(api: Api, method: str, path: str, body) -> object:
    return api.get(path, body) if method == "get" else api.post(path, body)


@pytest.mark.parametrize(("method", "path", "body", "codename"), ROUTES)
def test_every_route_needs_credentials_and_its_permission(client, key_with, method, path, body, codename):
    assert error_of(call(Api(client), method, path, body)) == (401, "unauthenticated")
    assert error_of(call(Api(client, "weft_000000000000_forged"), method, path, body)) == (401, "unauthenticated")
    lacking = key_with(*(ALL_BUT - {codename}))
    refused = call(lacking, method, path, body)
    assert error_of(refused) == (403, "forbidden") and f"django_weft.{codename}" in refused.json()["error"]
    allowed = call(key_with(codename, "add_workflow"), method, path, body)
    assert allowed.status_code not in (401, 403, 500)


def test_a_revoked_key_is_401(client):
    from django_weft.services import api_keys

    _record, key = api_keys.create("gone", ["django_weft.view_workflow"])
    assert Api(client, key).get("runs").status_code == 200
    api_keys.revoke("gone")
    assert error_of(Api(client, key).get("runs")) == (401, "unauthenticated")


# --- sessions -------------------------------------------------------------------------------------------


@pytest.fixture
def operator() -> User:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_workflow", "cancel_workflow"]))
    return user


def test_a_session_reads_and_unsafe_methods_need_the_csrf_token(operator):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    weft.start("test.approval", "s", workflow_id="sess-1")
    assert strict.get(BASE + "runs").status_code == 200
    refused = strict.post(BASE + "runs/sess-1/cancel", "{}", content_type="application/json")
    assert error_of(refused) == (403, "csrf_failed")
    strict.get("/admin/")  # sets the CSRF cookie
    token = strict.cookies["csrftoken"].value
    done = strict.post(BASE + "runs/sess-1/cancel", "{}", content_type="application/json",
                       headers={"X-CSRFToken": token})
    assert done.status_code == 200 and done.json()["changed"] is True
    assert Workflow.objects.get().error["message"] == "cancelled by op through the HTTP API"
    # Its permissions are the user's: no add_workflow.
    assert error_of(strict.post(BASE + "runs", json.dumps(START), content_type="application/json",
                                headers={"X-CSRFToken": token})) == (403, "forbidden")


def test_an_inactive_user_is_401(operator, client):
    operator.is_active = False
    operator.save()
    client.force_login(operator)
    assert client.get(BASE + "runs").status_code == 401


# --- bad input ------------------------------------------------------------------------------------------


@override_settings(WEFT_MAX_REQUEST_BYTES=1000)
def test_a_body_over_the_request_limit_is_413_before_it_is_parsed(api):
    assert error_of(api.post("runs", {**START, "input": "x" * 2000})) == (413, "request_too_large")
    assert error_of(api.post("complete", {"token": "t", "result": "x" * 2000})) == (413, "request_too_large")
    assert not Workflow.objects.exists()


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_a_payload_over_the_payload_limit_is_413(api):
    assert error_of(api.post("runs", {**START, "input": "x" * 200})) == (413, "payload_too_large")
    weft.start("test.approval", "p", workflow_id="big")
    assert error_of(api.post("runs/big/signals/approval", {"payload": "x" * 200})) == (413, "payload_too_large")


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"[1, 2]", b'"text"', b"null", b"1e999999"])
def test_a_body_that_is_not_a_json_object_is_400_or_422(api, raw):
    status, _code = error_of(api.post("runs", raw=raw))
    assert status in (400, 422)


@pytest.mark.parametrize("path", ["runs/w/cancel", "runs/w/terminate", "runs/w/signals/go", "runs/w/queries/q",
                                  "runs/w/updates/u", "bulk/cancel", "complete"])
def test_a_body_that_is_a_list_is_422_not_read_as_all_defaults(api, path):
    weft.start("test.approval", "w", workflow_id="w")
    assert error_of(api.post(path, [{"reason": "x"}, 3])) == (422, "invalid_request")  # found by schemathesis
    assert Workflow.objects.get().status == "pending"


def test_a_deeply_nested_body_is_not_a_500(api):
    deep = "[" * 100_000 + "]" * 100_000
    status, _code = error_of(api.post("runs", raw='{"workflow": "test.approval", "input": ' + deep + "}"))
    assert status in (400, 413, 422)
    # Within what JSON parses: stored, or refused with a 4xx.
    nested: object = "x"
    for _ in range(900):
        nested = [nested]
    assert api.post("runs", {**START, "input": nested}).status_code in (201, 400, 413, 422)


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
def test_a_filter_moment_out_of_range_in_utc_is_422(api, moment):
    # Valid ISO 8601 whose UTC value Python cannot hold: the database adapter's conversion overflowed (a 500).
    assert error_of(api.get("runs", {"created_after": moment})) == (422, "invalid_argument")
    assert error_of(api.get("runs/count", {"created_before": moment})) == (422, "invalid_argument")
    assert error_of(api.post("bulk/cancel", {"filters": {"created_after": moment}, "dry_run": True})) == (
        422, "invalid_argument")


@pytest.mark.parametrize("param", ["type", "workflow_id_prefix", "tag", "schedule"])
def test_a_nul_in_a_text_filter_is_422(api, param):
    # PostgreSQL refuses NUL in any text it is sent, a WHERE's too: a 500 there; SQLite answered a silent 200.
    weft.start("test.approval", "n")
    assert error_of(api.get("runs", {param: "a\x00"})) == (422, "invalid_argument")
    assert error_of(api.get("runs/count", {param: "a\x00"})) == (422, "invalid_argument")
    assert error_of(api.post("bulk/cancel", {"filters": {param: ["a\x00"] if param in ("type", "tag") else "a\x00"},
                                             "dry_run": True})) == (422, "invalid_argument")


def test_wrong_types_and_unknown_routes(api):
    assert error_of(api.post("runs", {"workflow": ["a"], "input": 1})) == (422, "invalid_request")
    assert error_of(api.post("runs", {**START, "workflow_id": ""})) == (422, "invalid_request")
    assert error_of(api.post("runs", {**START, "execution_timeout": "long"})) == (422, "invalid_request")
    assert error_of(api.post("runs", raw="workflow=x", content_type="application/x-www-form-urlencoded"))[0] in (
        400, 422)
    assert api.get("runs", {"unknown": "1"}).status_code == 200  # an unknown query parameter is ignored
    assert api.get("nowhere").status_code == 404
    assert api.client.delete(BASE + "runs", headers=api.headers).status_code == 405


# --- the webhooks in the API ----------------------------------------------------------------------------


@pytest.fixture
def token(weft_env) -> str:
    handle = weft.start("test.async", "api-hook")
    weft_env.drive()
    return AsyncActivity.objects.get(run_id=handle.run_id, status="pending").token


def test_complete_needs_only_the_token_not_a_key_nor_csrf(token, weft_env):
    strict = Api(Client(enforce_csrf_checks=True))
    done = strict.post("complete", {"token": token, "result": {"ok": 1}})
    assert (done.status_code, done.json()) == (200, {"ok": True})
    assert error_of(strict.post("complete", {"token": token, "result": 2})) == (409, "token_already_used")
    weft_env.drive()
    assert Workflow.objects.get(workflow_type="test.async").status == "completed"


def test_fail_goes_through_the_retry_policy(token):
    strict = Api(Client(enforce_csrf_checks=True))
    assert strict.post("fail", {"token": token, "error": {"message": "no", "type": "Rejected"}}).json() == {"ok": True}
    assert error_of(strict.post("fail", {"token": token})) == (422, "invalid_request")


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_the_webhooks_errors(token, client):
    hooks = Api(client)
    assert error_of(hooks.post("complete", {"token": "forged", "result": 1})) == (404, "invalid_token")
    assert error_of(hooks.post("complete", {"token": token, "result": "x" * 200})) == (413, "payload_too_large")
    assert error_of(hooks.post("fail", {"token": token, "error": ""})) == (400, "invalid_payload")
    assert error_of(hooks.post("complete", raw=b"{nope")) == (400, "bad_request")
    assert error_of(hooks.post("complete", {"result": 1})) == (422, "invalid_request")
    assert AsyncActivity.objects.get(token=token).status == "pending"


# --- docs -----------------------------------------------------------------------------------------------


def test_the_openapi_document_is_public_and_the_docs_page_staff_only(client, operator):
    document = client.get(BASE + "openapi.json")
    assert document.status_code == 200 and "/weft/api/runs/count" in document.json()["paths"]
    assert client.get(BASE + "docs").status_code == 302  # to the admin's login
    client.force_login(operator)
    page = client.get(BASE + "docs")
    assert page.status_code == 200 and b"swagger" in page.content.lower()
    # Offline: no CDN; the script and stylesheet come from here (staff only, like the page).
    html = page.content.decode()
    assert "http://" not in html and "https://" not in html
    script = client.get(BASE + "docs/assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and script["Content-Type"] == "application/javascript"
    assert b"SwaggerUIBundle" in b"".join(script.streaming_content)
    assert client.get(BASE + "docs/assets/secrets.py").status_code == 404
    client.logout()
    assert client.get(BASE + "docs/assets/swagger-ui.css").status_code == 302
