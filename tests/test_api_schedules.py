"""The schedule routes of the HTTP API: every route with its statuses and its permission."""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest
from django.test import Client, override_settings

import django_weft as weft
from django_weft.models import Schedule, ScheduleStatus, Workflow
from tests.api_helpers import Api, error_of, make_key

pytestmark = pytest.mark.django_db


def moment(text):
    """A moment the API returned (JSON keeps milliseconds), to compare with one of ours."""
    return dt.datetime.fromisoformat(text)


def near(text, expected):
    return abs(moment(text) - expected) < dt.timedelta(milliseconds=1)

ALL = ("view_schedule", "add_schedule", "change_schedule", "delete_schedule", "django_weft.view_payloads")
HOURLY = {"schedule_id": "hourly", "workflow": "test.collect", "input": 1, "cron": "0 * * * *", "timezone": "UTC"}


@pytest.fixture
def api(weft_env):
    return Api(Client(), make_key(*ALL))


@pytest.fixture
def hourly(weft_env):
    return weft.create_schedule("hourly", "test.collect", 1, cron="0 * * * *", timezone="UTC")


def snapshot(schedule_id="hourly"):
    return Schedule.objects.filter(schedule_id=schedule_id).values().first()


# (method, path, body, permission it needs, success status)
ROUTES = [
    ("post", "schedules", {**HOURLY, "schedule_id": "new"}, "add_schedule", 201),
    ("get", "schedules", None, "view_schedule", 200),
    ("get", "schedules/hourly", None, "view_schedule", 200),
    ("patch", "schedules/hourly", {"cron": "30 * * * *"}, "change_schedule", 200),
    ("post", "schedules/hourly/pause", {"note": "closing"}, "change_schedule", 200),
    ("post", "schedules/hourly/resume", None, "change_schedule", 200),
    ("post", "schedules/hourly/trigger", None, "change_schedule", 200),
    ("post", "schedules/hourly/backfill", {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T02:00:00Z"},
     "change_schedule", 200),
    ("post", "schedules/hourly/cancel", None, "change_schedule", 200),
]


@pytest.mark.parametrize(("method", "path", "body", "permission", "status"), ROUTES)
def test_every_route_needs_authentication(hourly, method, path, body, permission, status):
    before = snapshot()
    response = Api(Client(), None).call(method, path, body)
    assert error_of(response) == (401, "unauthenticated")
    assert snapshot() == before and Workflow.objects.count() == 0


@pytest.mark.parametrize(("method", "path", "body", "permission", "status"), ROUTES)
def test_a_key_without_the_routes_permission_is_refused_and_nothing_changes(
        hourly, method, path, body, permission, status):
    before = snapshot()
    others = [name for name in ALL if name != permission] + ["view_workflow", "add_workflow", "cancel_workflow"]
    response = Api(Client(), make_key(*others)).call(method, path, body)
    assert error_of(response) == (403, "forbidden")
    assert f"django_weft.{permission}" in response.json()["error"]
    assert snapshot() == before and Schedule.objects.count() == 1 and Workflow.objects.count() == 0


@pytest.mark.parametrize(("method", "path", "body", "permission", "status"), ROUTES)
def test_a_key_with_only_the_routes_permission_may_call_it(hourly, method, path, body, permission, status):
    response = Api(Client(), make_key(permission)).call(method, path, body)
    assert response.status_code == status, response.content


# --- create ------------------------------------------------------------------------------------------------


def test_create_returns_the_schedule_with_its_next_occurrence(api, weft_env):
    body = {"schedule_id": "every-10", "workflow": "test.collect", "input": {"n": [1, 2]}, "every": 600,
            "overlap": "buffer_one", "backfill": True, "catchup_window": 3600, "jitter": 5}
    response = api.post("schedules", body)
    assert response.status_code == 201, response.content
    out = response.json()
    assert out["schedule_id"] == "every-10" and out["workflow"] == "test.collect" and out["input"] == {"n": [1, 2]}
    assert (out["cron"], out["every"], out["overlap"], out["backfill"]) == (None, 600.0, "buffer_one", True)
    assert (out["catchup_window"], out["jitter"], out["status"]) == (3600.0, 5.0, "active")
    assert near(out["next_fire_at"], weft_env.now() + dt.timedelta(seconds=600))
    schedule = Schedule.objects.get(schedule_id="every-10")
    assert schedule.decoded_input == {"n": [1, 2]} and schedule.every == dt.timedelta(minutes=10)


@pytest.mark.parametrize(("change", "status", "code", "message"), [
    ({"cron": "61 * * * *"}, 422, "invalid_argument", "invalid cron expression '61 * * * *'"),
    ({"cron": "* * *"}, 422, "invalid_argument", "cron '* * *' has 3 fields"),
    ({"cron": "0 0 30 2 *"}, 422, "invalid_argument", "never fires"),
    ({"timezone": "Mars/Olympus"}, 422, "invalid_argument", "unknown time zone 'Mars/Olympus'"),
    ({"every": 60}, 422, "invalid_argument", "exactly one of cron and every"),
    ({"cron": None}, 422, "invalid_argument", "exactly one of cron and every"),
    ({"cron": None, "every": 0.5}, 422, "invalid_argument", "at least one second"),
    ({"workflow": "no.such"}, 422, "unknown_workflow", "no.such"),
    ({"overlap": "queue"}, 422, "invalid_request", "overlap"),
    ({"start_at": "2026-01-01T00:00:00"}, 422, "invalid_argument", "start_at must be an aware datetime"),
    ({"start_at": "2026-01-02T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"}, 422, "invalid_argument",
     "end_at must be after start_at"),
    ({"catchup": 60}, 422, "invalid_request", "catchup"),
    ({"schedule_id": ""}, 422, "invalid_request", "schedule_id"),
    ({"input": {"big": "x" * 100}, "jitter": -1}, 422, "invalid_argument", "jitter must be positive"),
])
def test_an_invalid_schedule_is_refused_naming_the_problem_and_nothing_is_written(api, change, status, code,
                                                                                  message):
    response = api.post("schedules", {**HOURLY, **change})
    assert error_of(response) == (status, code), response.content
    assert message in response.json()["error"]
    assert Schedule.objects.count() == 0


def test_an_existing_id_is_a_conflict_and_the_schedule_is_unchanged(api, hourly):
    before = snapshot()
    response = api.post("schedules", {**HOURLY, "cron": "5 * * * *"})
    assert error_of(response) == (409, "schedule_already_exists")
    assert "'hourly' already exists" in response.json()["error"]
    assert snapshot() == before


def test_a_body_that_is_not_json_is_a_bad_request(api):
    response = api.client.post("/weft/api/schedules", "{", content_type="application/json", headers=api.headers)
    assert error_of(response) == (400, "bad_request")


# --- list and get ------------------------------------------------------------------------------------------


def test_list_pages_by_id_with_a_cursor_and_filters(api, weft_env):
    for name in ("c", "a", "d", "b"):
        weft.create_schedule(name, "test.collect", 1, every=60)
    weft.get_schedule("d").pause("x")
    first = api.get("schedules", {"limit": 3}).json()
    assert [s["schedule_id"] for s in first["results"]] == ["a", "b", "c"] and first["next"]
    second = api.get("schedules", {"limit": 3, "cursor": first["next"]}).json()
    assert [s["schedule_id"] for s in second["results"]] == ["d"] and second["next"] is None
    paused = api.get("schedules", {"status": "paused"}).json()
    assert [s["schedule_id"] for s in paused["results"]] == ["d"]
    assert api.get("schedules", {"workflow": "test.steps"}).json() == {"results": [], "next": None}
    assert error_of(api.get("schedules", {"cursor": "!!"})) == (422, "invalid_cursor")
    assert error_of(api.get("schedules", {"status": "sleeping"})) == (422, "invalid_request")
    assert error_of(api.get("schedules", {"limit": 0})) == (422, "invalid_request")


def test_get_returns_the_schedule_and_404_for_an_unknown_id(api, hourly):
    out = api.get("schedules/hourly").json()
    assert (out["cron"], out["timezone"], out["input"], out["in_settings"]) == ("0 * * * *", "UTC", 1, False)
    response = api.get("schedules/nope")
    assert error_of(response) == (404, "schedule_not_found") and "'nope'" in response.json()["error"]


@pytest.mark.parametrize(("method", "path", "body"), [
    (method, path.replace("hourly", "nope"), body) for method, path, body, _, _ in ROUTES if "hourly" in path])
def test_every_route_of_one_schedule_is_404_for_an_unknown_id(api, method, path, body):
    assert error_of(api.call(method, path, body)) == (404, "schedule_not_found")
    assert Schedule.objects.count() == 0


# --- update ------------------------------------------------------------------------------------------------


def test_patch_changes_only_what_it_sends(api, hourly, weft_env):
    response = api.patch("schedules/hourly", {"overlap": "allow_all", "input": [7]})
    assert response.status_code == 200, response.content
    out = response.json()
    assert (out["overlap"], out["input"], out["cron"], out["timezone"]) == ("allow_all", [7], "0 * * * *", "UTC")
    replaced = api.patch("schedules/hourly", {"every": 90}).json()
    assert (replaced["cron"], replaced["every"], replaced["overlap"]) == (None, 90.0, "allow_all")
    assert near(replaced["next_fire_at"], weft_env.now() + dt.timedelta(seconds=90))
    cleared = api.patch("schedules/hourly", {"jitter": 10}).json()
    assert cleared["jitter"] == 10.0
    assert api.patch("schedules/hourly", {"jitter": None}).json()["jitter"] is None


@pytest.mark.parametrize(("body", "code", "message"), [
    ({"timezone": "Nowhere/Else"}, "invalid_argument", "unknown time zone 'Nowhere/Else'"),
    ({"cron": "0 25 * * *"}, "invalid_argument", "invalid cron expression"),
    ({"cron": "* * * * *", "every": 60}, "invalid_argument", "exactly one of cron and every"),
    ({"workflow": "test.steps"}, "invalid_request", "workflow"),
    ({"backfill": None}, "invalid_request", "backfill"),
])
def test_an_invalid_update_is_refused_and_nothing_is_written(api, hourly, body, code, message):
    before = snapshot()
    response = api.patch("schedules/hourly", body)
    assert error_of(response) == (422, code) and message in response.json()["error"]
    assert snapshot() == before


def test_a_schedule_defined_in_weft_schedules_is_not_updated_here(api, hourly):
    before = snapshot()
    with override_settings(WEFT_SCHEDULES={"hourly": {"workflow": "test.collect", "cron": "0 * * * *"}}):
        assert api.get("schedules/hourly").json()["in_settings"] is True
        response = api.patch("schedules/hourly", {"cron": "5 * * * *"})
    assert error_of(response) == (409, "schedule_in_settings") and "WEFT_SCHEDULES" in response.json()["error"]
    assert snapshot() == before


# --- operations --------------------------------------------------------------------------------------------


def test_pause_and_resume(api, hourly):
    paused = api.post("schedules/hourly/pause", {"note": "quarter close"}).json()
    assert (paused["status"], paused["note"], paused["next_fire_at"]) == ("paused", "quarter close", None)
    resumed = api.post("schedules/hourly/resume").json()
    assert (resumed["status"], resumed["note"]) == ("active", "") and resumed["next_fire_at"]
    without_note = api.post("schedules/hourly/pause").json()
    assert without_note["note"].startswith("paused by key:") and "HTTP API" in without_note["note"]
    assert error_of(api.post("schedules/hourly/pause", {"note": 5})) == (422, "invalid_request")


def test_trigger_returns_the_run_it_started_or_null_when_the_overlap_policy_skips(api, hourly):
    first = api.post("schedules/hourly/trigger").json()
    run = Workflow.objects.get(schedule=hourly)
    assert first == {"schedule_id": "hourly",
                     "run": {"workflow_id": run.workflow_id, "run_id": str(run.run_id), "status": run.status}}
    # test.collect waits for a signal, so the first run is still open: "skip" starts nothing.
    assert api.post("schedules/hourly/trigger").json() == {"schedule_id": "hourly", "run": None}
    assert Workflow.objects.filter(schedule=hourly).count() == 1


def test_backfill_counts_the_runs_it_started_and_is_idempotent(api, hourly):
    body = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T03:00:00+00:00"}
    assert api.post("schedules/hourly/backfill", body).json() == {"schedule_id": "hourly", "count": 4}
    assert api.post("schedules/hourly/backfill", body).json()["count"] == 0
    moments = Workflow.objects.filter(schedule=hourly).order_by("scheduled_for").values_list("scheduled_for",
                                                                                           flat=True)
    assert list(moments) == [dt.datetime(2026, 1, 1, hour, tzinfo=UTC) for hour in range(4)]


@pytest.mark.parametrize(("body", "code", "message"), [
    ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "invalid_argument", "not be before start"),
    ({"start": "2026-01-01T00:00:00", "end": "2026-01-02T00:00:00Z"}, "invalid_argument", "aware datetime"),
    ({"start": "2000-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "invalid_argument", "more than 10000"),
    ({"start": "2026-01-01T00:00:00Z"}, "invalid_request", "end"),
])
def test_an_invalid_backfill_starts_nothing(api, hourly, body, code, message):
    response = api.post("schedules/hourly/backfill", body)
    assert error_of(response) == (422, code) and message in response.json()["error"]
    assert Workflow.objects.count() == 0


def test_cancel_ends_the_schedule_and_the_operations_after_it_conflict(api, hourly):
    out = api.post("schedules/hourly/cancel").json()
    assert (out["status"], out["next_fire_at"]) == ("cancelled", None)
    assert api.post("schedules/hourly/cancel").status_code == 200  # cancelling again changes nothing
    for operation in ("pause", "resume", "trigger"):
        response = api.post(f"schedules/hourly/{operation}")
        assert error_of(response) == (409, "transition_not_allowed") and "cancelled" in response.json()["error"]
    backfill = api.post("schedules/hourly/backfill", {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00Z"})
    assert error_of(backfill) == (409, "transition_not_allowed")
    assert Workflow.objects.count() == 0 and Schedule.objects.get().status == ScheduleStatus.CANCELLED


def test_a_session_user_needs_the_model_permission_and_the_csrf_token(weft_env, hourly, django_user_model):
    from django.contrib.auth.models import Permission
    from django.test import Client

    user = django_user_model.objects.create_user("ops", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert error_of(client.get("/weft/api/schedules/hourly")) == (403, "forbidden")
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_schedule", "change_schedule"]))
    assert client.get("/weft/api/schedules/hourly").status_code == 200
    refused = client.post("/weft/api/schedules/hourly/pause", "{}", content_type="application/json")
    assert error_of(refused) == (403, "csrf_failed")
    client.get("/admin/login/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    paused = client.post("/weft/api/schedules/hourly/pause", "{}", content_type="application/json",
                         headers={"X-CSRFToken": token})
    assert paused.status_code == 200 and paused.json()["note"] == "paused by ops through the HTTP API"


def test_the_openapi_document_describes_the_schedule_routes_and_the_docs_page_shows_it(client):
    document = client.get("/weft/api/openapi.json").json()
    paths = document["paths"]
    assert set(paths["/weft/api/schedules/{schedule_id}"]) == {"get", "patch"}
    for operation in ("pause", "resume", "trigger", "backfill", "cancel"):
        assert "post" in paths[f"/weft/api/schedules/{{schedule_id}}/{operation}"]
    create = paths["/weft/api/schedules"]["post"]
    assert create["tags"] == ["schedules"] and {"201", "401", "403", "409", "422"} <= set(create["responses"])
    assert client.get("/weft/api/docs").status_code == 302  # staff only: to the admin's login
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.create_user("staff", is_staff=True))
    docs = client.get("/weft/api/docs")
    assert docs.status_code == 200 and b"/weft/api/openapi.json" in docs.content


def test_a_body_over_the_request_limit_is_refused_before_it_is_read(api):
    with override_settings(WEFT_MAX_REQUEST_BYTES=1000):
        response = api.post("schedules", {**HOURLY, "input": "x" * 2000})
    assert error_of(response) == (413, "request_too_large") and "1000 bytes" in response.json()["error"]
    assert Schedule.objects.count() == 0


def test_an_input_over_the_payload_limit_is_refused(api):
    with override_settings(WEFT_MAX_PAYLOAD_BYTES=100):
        response = api.post("schedules", {**HOURLY, "input": "x" * 200})
    assert error_of(response) == (413, "payload_too_large")
    assert Schedule.objects.count() == 0


def test_a_nul_in_the_list_filters_is_422(api):
    # PostgreSQL refuses NUL even in a WHERE: both were 500s there (an empty page on SQLite).
    assert error_of(api.get("schedules", {"workflow": "a\x00"})) == (422, "invalid_argument")
    nul_cursor = "WyJcdTAwMDAiXQ"  # ["\u0000"], base64
    assert error_of(api.get("schedules", {"cursor": nul_cursor})) == (422, "invalid_cursor")
