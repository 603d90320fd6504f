"""weft.heartbeat_async(token, details): an outside system working on an async activity beats with its task
token. A beat stores details for the step's next attempt, renews the activity's heartbeat_timeout (an async
activity that hears nothing for that long times out and is retried), and answers whether the attempt was
cancelled. The same through the webhook (weft/heartbeat/) and the HTTP API (weft/api/heartbeat)."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.common.tokens import make_task_token
from django_weft.models import ActivityHeartbeat, AsyncActivity, StepAttempt, Timer, Workflow
from django_weft.store import activity_heartbeats
from tests.testapp.workflows import executions, mark

pytestmark = pytest.mark.django_db

# What each attempt found as activity_info().heartbeat_details, by key.
seen: dict[str, list] = {}


@weft.activity(name="hb.render", heartbeat_timeout=timedelta(minutes=5),
               retry=weft.RetryPolicy(max_attempts=2, initial_backoff=10))
def render(key: str) -> None:
    """Hands its token to a render farm, which beats while it works and completes it at the end."""
    seen.setdefault(key, []).append(weft.activity_info().heartbeat_details)
    mark(f"{key}:render:{weft.activity_info().attempt}")
    weft.complete_async()


@weft.activity(name="hb.bounded", heartbeat_timeout=60, schedule_to_close_timeout=timedelta(minutes=5),
               retry=weft.RetryPolicy(max_attempts=3, initial_backoff=1))
def bounded(key: str) -> None:
    mark(f"{key}:bounded")
    weft.complete_async()


@weft.activity(name="hb.beats_first", heartbeat_timeout=60)
def beats_before_parking(key: str) -> None:
    """The outside system beats before the attempt has parked (it was handed the token at once)."""
    assert weft.heartbeat_async(weft.activity_info().task_token, {"queued": key}) is False
    weft.complete_async()


@weft.workflow(name="hb.render")
def render_workflow(ctx: weft.Context, key: str) -> object:
    try:
        return ctx.run(render, key)
    except weft.ActivityError as exc:
        return f"gave up: {exc}"


@weft.workflow(name="hb.strict")
def strict_workflow(ctx: weft.Context, key: str) -> object:
    return ctx.run(render, key)  # a step that gives up fails the run


@weft.workflow(name="hb.bounded")
def bounded_workflow(ctx: weft.Context, key: str) -> object:
    try:
        return ctx.run(bounded, key)
    except weft.ActivityError as exc:
        return f"gave up: {exc}"


@weft.workflow(name="hb.branch")
def branch_workflow(ctx: weft.Context, key: str) -> object:
    try:
        return ctx.start_activity(render, key).result()
    except weft.ActivityError as exc:
        return f"gave up: {exc}"


@weft.workflow(name="hb.race")
def race_workflow(ctx: weft.Context, key: str) -> int:
    index, _value = ctx.race(ctx.start_activity(render, key), ctx.start_timer(60))
    return index


@weft.workflow(name="hb.undo")
def undo_workflow(ctx: weft.Context, key: str) -> object:
    try:
        ctx.sleep(3600)
    except weft.CancelledError:
        with ctx.cleanup():  # the undo the outside system does is not cancelled by the run's cancel
            return ctx.run(render, key)
    return None


@weft.workflow(name="hb.beats_first")
def beats_first_workflow(ctx: weft.Context, key: str) -> object:
    return ctx.run(beats_before_parking, key)


def pending(handle: weft.WorkflowHandle) -> AsyncActivity:
    return AsyncActivity.objects.get(run_id=handle.run_id, status="pending")


def stored(handle: weft.WorkflowHandle, seq: int = 1) -> tuple[int, object] | None:
    row = ActivityHeartbeat.objects.filter(run_id=handle.run_id, seq=seq).first()
    return None if row is None else (row.attempt, decode(row.details))


def timers(handle: weft.WorkflowHandle) -> tuple[int, int]:
    """(unfired, fired) activity-timeout timers of the run."""
    rows = Timer.objects.filter(run_id=handle.run_id, purpose="activity_timeout")
    return rows.filter(fired_at__isnull=True).count(), rows.filter(fired_at__isnull=False).count()


# --- what a beat stores ---------------------------------------------------------------------------------------


def test_details_reach_the_next_attempt(weft_env):
    handle = weft.start("hb.render", "film")
    weft_env.drive()
    first = pending(handle)
    assert weft.heartbeat_async(first.token, {"frame": 10}) is False
    assert weft.heartbeat_async(first.token, {"frame": 20}) is False
    assert stored(handle) == (1, {"frame": 20})
    assert ActivityHeartbeat.objects.get(run_id=handle.run_id).beat_at == weft_env.now()
    assert weft.heartbeat_async(first.token) is False  # no details: the stored ones stay
    assert stored(handle) == (1, {"frame": 20})

    weft.fail_async_activity(first.token, "the farm crashed")
    weft_env.advance(timedelta(seconds=10))
    second = pending(handle)
    assert second.attempt == 2
    assert seen["film"] == [None, {"frame": 20}]  # as weft.heartbeat(details) would hand them on
    assert weft.heartbeat_async(second.token, {"frame": 30}) is False
    assert stored(handle) == (2, {"frame": 30})
    weft.complete_async_activity(second.token, "film.mp4")
    weft_env.drive()
    assert handle.result() == "film.mp4"


def test_a_beat_writes_one_row_and_leaves_the_run_alone(weft_env):
    handle = weft.start("hb.render", "cheap")
    weft_env.drive()
    token = pending(handle).token
    before = Workflow.objects.values_list("fence", "inbox_seq", "updated_at", "runnable_at").get(pk=handle.run_id)
    weft_env.advance(timedelta(minutes=1))
    weft.heartbeat_async(token, {"done": 1})
    after = Workflow.objects.values_list("fence", "inbox_seq", "updated_at", "runnable_at").get(pk=handle.run_id)
    assert after == before  # no fence bump, no wake-up: the run reads the beat when its timer fires
    assert timers(handle) == (1, 0)


def test_an_attempt_beating_before_it_parked_is_kept(weft_env):
    handle = weft.start("hb.beats_first", "early")
    weft_env.drive()
    assert stored(handle) == (1, {"queued": "early"})
    weft.complete_async_activity(pending(handle).token, "done")
    weft_env.drive()
    assert handle.result() == "done"


def test_a_late_beat_of_an_earlier_attempt_never_overwrites_a_later_ones_details(weft_env):
    handle = weft.start("hb.render", "fenced")
    weft_env.drive()
    first = pending(handle)
    weft.fail_async_activity(first.token, "lost the job")
    weft_env.advance(timedelta(seconds=10))
    second = pending(handle)
    weft.heartbeat_async(second.token, {"from": 2})
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="already failed"):
        weft.heartbeat_async(first.token, {"from": 1})
    # The same beat racing the failure (read while the attempt was pending, written after): the row stays.
    activity_heartbeats.save(handle.run_id, 1, 1, weft_env.now(), b"\xa1x")
    assert stored(handle) == (2, {"from": 2})


# --- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["", "garbage", "a:b:c", 42, None])
def test_forged_or_malformed_tokens_are_refused(weft_env, token):
    handle = weft.start("hb.render", "forged")
    weft_env.drive()
    with pytest.raises(weft.InvalidTaskToken):
        weft.heartbeat_async(token, {"x": 1})
    assert not ActivityHeartbeat.objects.exists() and pending(handle).attempt == 1


def test_a_token_signed_with_another_key_or_of_no_run_is_refused(weft_env, settings):
    handle = weft.start("hb.render", "key")
    weft_env.drive()
    with pytest.raises(weft.InvalidTaskToken, match="no longer exists"):
        weft.heartbeat_async(make_task_token(Workflow().run_id, 1, 1))
    with pytest.raises(weft.InvalidTaskToken, match="is not waiting"):
        weft.heartbeat_async(make_task_token(handle.run_id, 7, 1))  # genuine, but names no attempt in flight
    token = pending(handle).token
    settings.SECRET_KEY = "another-secret"
    with pytest.raises(weft.InvalidTaskToken, match="not genuine"):
        weft.heartbeat_async(token)
    assert not ActivityHeartbeat.objects.exists()


def test_the_token_of_a_completed_attempt_is_refused(weft_env):
    handle = weft.start("hb.render", "done")
    weft_env.drive()
    token = pending(handle).token
    weft.complete_async_activity(token, "ok")
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="already completed"):
        weft.heartbeat_async(token, {"late": True})
    weft_env.drive()
    assert handle.result() == "ok"
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="already completed"):  # also once the run closed
        weft.heartbeat_async(token)
    assert not ActivityHeartbeat.objects.exists()


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_oversized_or_unserialisable_details_are_refused_and_nothing_is_written(weft_env):
    handle = weft.start("hb.render", "big")
    weft_env.drive()
    token = pending(handle).token
    weft.heartbeat_async(token, {"frame": 1})
    beat = ActivityHeartbeat.objects.values_list("details", "beat_at").get()
    weft_env.advance(timedelta(minutes=1))
    with pytest.raises(weft.PayloadTooLarge, match="heartbeat details"):
        weft.heartbeat_async(token, "x" * 200)
    with pytest.raises(weft.PayloadNotSerializable, match="heartbeat details"):
        weft.heartbeat_async(token, {"frame": object()})
    assert ActivityHeartbeat.objects.values_list("details", "beat_at").get() == beat
    assert weft.heartbeat_async(token, {"frame": 2}) is False  # the token is still good


# --- cancellation ---------------------------------------------------------------------------------------------


def test_a_beat_reports_the_runs_cancel(weft_env):
    handle = weft.start("hb.render", "cx")
    weft_env.drive()
    token = pending(handle).token
    assert weft.heartbeat_async(token) is False
    handle.cancel("the customer left")
    weft_env.drive()  # the cancel wakes the run at once; its code sees it where it waits for the token
    assert handle.status == "cancelled"
    assert weft.heartbeat_async(token, {"frame": 5}) is True
    assert weft.heartbeat_async(token) is True
    assert stored(handle) == (1, None)  # a cancelled attempt's details are not kept


def test_a_beat_reports_a_closed_run(weft_env):
    handle = weft.start("hb.render", "gone")
    weft_env.drive()
    token = pending(handle).token
    handle.terminate("operator stopped it")
    assert weft.heartbeat_async(token) is True


def test_the_loser_of_a_race_is_reported_cancelled(weft_env):
    handle = weft.start("hb.race", "race")
    weft_env.drive()
    token = pending(handle).token
    assert weft.heartbeat_async(token) is False
    weft_env.advance(timedelta(seconds=60))
    assert handle.result() == 1  # the timer won
    assert weft.heartbeat_async(token) is True
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="cancelled"):
        weft.complete_async_activity(token, "too late")


def test_an_attempt_begun_inside_cleanup_is_not_cancelled_by_the_runs_cancel(weft_env):
    handle = weft.start("hb.undo", "undo")
    weft_env.drive()
    handle.cancel("refund")
    weft_env.drive()
    token = pending(handle).token
    assert handle.status == "waiting" and weft.heartbeat_async(token) is False
    weft.complete_async_activity(token, "undone")
    weft_env.drive()
    assert handle.result() == "undone"


# --- heartbeat_timeout ----------------------------------------------------------------------------------------


def test_an_async_activity_that_hears_nothing_for_its_heartbeat_timeout_times_out_and_is_retried(weft_env):
    handle = weft.start("hb.render", "silent")
    weft_env.drive()
    first = pending(handle)
    weft_env.advance(timedelta(seconds=299))
    assert pending(handle).attempt == 1
    weft_env.advance(timedelta(seconds=1))
    first.refresh_from_db()
    assert first.status == "timed_out" and "300s heartbeat_timeout" in first.error["message"]
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="timed_out"):
        weft.heartbeat_async(first.token)
    weft_env.advance(timedelta(seconds=10))  # the retry policy's backoff
    assert pending(handle).attempt == 2 and executions("silent:render:2") == 1
    weft_env.advance(timedelta(seconds=300))
    result = handle.result()
    assert result.startswith("gave up:") and "ActivityTimeout" in result and "300s heartbeat_timeout" in result
    assert list(StepAttempt.objects.filter(run_id=handle.run_id).values_list("attempt", "outcome")) == [
        (1, "timed_out"), (2, "timed_out")]


def test_beats_keep_an_async_activity_alive_past_several_heartbeat_timeouts(weft_env, staff_client):
    handle = weft.start("hb.render", "alive")
    weft_env.drive()
    token = pending(handle).token
    for frame in range(5):  # 20 minutes in all, a beat every 4
        weft_env.advance(timedelta(minutes=4))
        assert weft.heartbeat_async(token, {"frame": frame}) is False
    assert pending(handle).attempt == 1 and handle.status == "waiting"
    unfired, fired = timers(handle)
    assert unfired == 1 and fired >= 3  # the fired timer gave way to one at the later deadline, each time
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert page.count("a heartbeat came in time") == fired  # the admin says why each fired timer did not time out
    weft.complete_async_activity(token, "rendered")
    weft_env.drive()
    assert handle.result() == "rendered"
    assert executions("alive:render:1") == 1 and executions("alive:render:2") == 0
    assert timers(handle)[0] == 0


def test_beats_stop_and_the_activity_times_out_a_heartbeat_timeout_after_the_last(weft_env):
    handle = weft.start("hb.render", "stops")
    weft_env.drive()
    token = pending(handle).token
    weft_env.advance(timedelta(minutes=4))
    weft.heartbeat_async(token)
    weft_env.advance(timedelta(minutes=4, seconds=59))  # 8:59: the 5-minute deadline moved to 9:00
    assert pending(handle).attempt == 1
    weft_env.advance(timedelta(seconds=1))
    assert AsyncActivity.objects.get(token=token).status == "timed_out"


def test_beats_do_not_extend_the_schedule_to_close_timeout(weft_env):
    handle = weft.start("hb.bounded", "bounded")
    weft_env.drive()
    token = pending(handle).token
    for _ in range(5):
        weft_env.advance(timedelta(seconds=50))
        assert weft.heartbeat_async(token) is False
    weft_env.advance(timedelta(seconds=50))  # 5 minutes after it was scheduled
    result = handle.result()
    assert "schedule_to_close_timeout" in result and executions("bounded:bounded") == 1  # not retried


def test_a_branch_activity_times_out_without_beats_and_lives_with_them(weft_env):
    handle = weft.start("hb.branch", "branch")
    weft_env.drive()
    weft_env.advance(timedelta(minutes=5))
    weft_env.advance(timedelta(seconds=10))
    second = pending(handle)
    assert second.attempt == 2
    for _ in range(3):
        weft_env.advance(timedelta(minutes=4))
        assert weft.heartbeat_async(second.token, {"attempt": 2}) is False
    assert pending(handle).attempt == 2 and timers(handle)[0] == 1
    weft.complete_async_activity(second.token, "branch done")
    weft_env.drive()
    assert handle.result() == "branch done"


def test_an_operators_retry_lets_the_new_attempts_beat_and_keeps_the_progress(weft_env):
    handle = weft.start("hb.strict", "again")
    weft_env.drive()
    first = pending(handle)
    weft.heartbeat_async(first.token, {"frame": 7})
    weft.fail_async_activity(first.token, "no")
    weft_env.advance(timedelta(seconds=10))
    weft.heartbeat_async(pending(handle).token, {"frame": 8})
    weft.fail_async_activity(pending(handle).token, "no again")
    weft_env.drive()
    assert handle.status == "failed" and stored(handle) == (2, {"frame": 8})
    call_command("weft_runs", "retry", "--type", "hb.strict", "--yes", stdout=io.StringIO())
    weft_env.drive()
    fresh = pending(handle)
    assert fresh.attempt == 1 and seen["again"][-1] == {"frame": 8}
    assert weft.heartbeat_async(fresh.token, {"frame": 9}) is False
    assert stored(handle) == (1, {"frame": 9})
    weft_env.advance(timedelta(minutes=4))
    weft.heartbeat_async(fresh.token)
    weft_env.advance(timedelta(minutes=4))
    assert pending(handle).token == fresh.token  # the beat renewed its deadline


# --- the webhook and the HTTP API -----------------------------------------------------------------------------


def hook(client: Client, body: object) -> object:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return client.post(reverse("django_weft:heartbeat"), data=data, content_type="application/json")


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_the_webhook(client, weft_env):
    handle = weft.start("hb.render", "hook")
    weft_env.drive()
    token = pending(handle).token
    response = hook(client, {"token": token, "details": {"frame": 3}})
    assert response.status_code == 200 and response.json() == {"ok": True, "cancelled": False}
    assert stored(handle) == (1, {"frame": 3})
    assert hook(client, {"token": token}).json() == {"ok": True, "cancelled": False}
    assert hook(client, {"token": "forged"}).status_code == 404
    assert hook(client, {"token": token, "details": "x" * 200}).status_code == 413
    assert hook(client, {"token": token, "detials": 1}).status_code == 400  # a misspelling stores nothing
    assert hook(client, b"{not json").status_code == 400
    assert client.get(reverse("django_weft:heartbeat")).status_code == 405
    assert stored(handle) == (1, {"frame": 3})
    strict = Client(enforce_csrf_checks=True)  # the token is the credential
    assert hook(strict, {"token": token}).status_code == 200
    handle.cancel()
    weft_env.drive()
    assert hook(client, {"token": token}).json() == {"ok": True, "cancelled": True}


def test_the_webhook_refuses_a_completed_attempts_token(client, weft_env):
    handle = weft.start("hb.render", "hook-done")
    weft_env.drive()
    token = pending(handle).token
    weft.complete_async_activity(token, 1)
    response = hook(client, {"token": token})
    assert response.status_code == 409 and "already completed" in response.json()["error"]


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_the_http_api(weft_env):
    from tests.api_helpers import Api

    api = Api(Client(enforce_csrf_checks=True))  # no key: the token is the credential, as for complete and fail
    handle = weft.start("hb.render", "api")
    weft_env.drive()
    token = pending(handle).token
    response = api.post("heartbeat", {"token": token, "details": {"frame": 4}})
    assert response.status_code == 200 and response.json() == {"cancelled": False}
    assert stored(handle) == (1, {"frame": 4})

    def refusal(body: dict) -> tuple[int, str]:
        answer = api.post("heartbeat", body)
        return answer.status_code, answer.json()["code"]

    assert refusal({"token": "forged"}) == (404, "invalid_token")
    assert refusal({"token": token, "details": "x" * 200}) == (413, "payload_too_large")
    assert refusal({"token": token, "detail": 1}) == (422, "invalid_request")
    assert stored(handle) == (1, {"frame": 4})
    handle.cancel()
    weft_env.drive()
    assert api.post("heartbeat", {"token": token}).json() == {"cancelled": True}
    other = weft.start("hb.render", "api-done")
    weft_env.drive()
    done = pending(other).token
    weft.complete_async_activity(done, 1)
    assert refusal({"token": done}) == (409, "token_already_used")


def test_the_openapi_document_names_the_route(client):
    operation = client.get("/weft/api/openapi.json").json()["paths"]["/weft/api/heartbeat"]["post"]
    assert {"200", "404", "409", "413", "422"} <= set(operation["responses"])
    assert "security" not in operation  # like complete and fail: no key asked for
