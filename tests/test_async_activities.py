"""Async activities: parked on a signed, single-use task token that an outside system resolves."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft import signals
from django_weft.models import AsyncActivity, WorkflowStep
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


def pending(handle) -> AsyncActivity:
    return AsyncActivity.objects.get(run_id=handle.run_id, status="pending")


def test_complete_async_parks_the_run_and_the_token_completes_it(weft_env, django_capture_on_commit_callbacks):
    announced = []
    signals.async_activity_pending.connect(lambda **kw: announced.append(kw), weak=False, dispatch_uid="a1")
    try:
        handle = weft.start("test.async", "q")
        with django_capture_on_commit_callbacks(execute=True):
            weft_env.drive()
    finally:
        signals.async_activity_pending.disconnect(dispatch_uid="a1")
    run = handle.refresh()
    assert run.status == "waiting" and "ask_human" in run.wait_reason
    record = pending(handle)
    assert (record.seq, record.attempt) == (1, 1)
    assert [a["task_token"] for a in announced] == [record.token]
    assert announced[0]["activity"] == record.activity and announced[0]["run"].run_id == handle.run_id

    # Replays do not run the activity body again to find the token.
    handle.suspend()
    handle.resume()
    weft_env.drive()
    assert executions("q:asked:1") == 1

    weft.complete_async_activity(record.token, {"approved": True})
    assert handle.refresh().runnable_at == weft_env.now()
    weft_env.drive()
    assert handle.result() == {"approved": True}
    assert executions("q:after") == 1
    record.refresh_from_db()
    assert record.status == "completed" and record.resolved_at == weft_env.now()


def test_a_token_is_single_use(weft_env):
    handle = weft.start("test.async", "once")
    weft_env.drive()
    token = pending(handle).token
    weft.complete_async_activity(token, 1)
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="already completed"):
        weft.complete_async_activity(token, 2)
    with pytest.raises(weft.TaskTokenAlreadyUsed):
        weft.fail_async_activity(token, "late failure")
    weft_env.drive()
    assert handle.result() == 1


@pytest.mark.parametrize("token", ["", "garbage", "a:b:c", 42, None])
def test_forged_or_malformed_tokens_are_refused(weft_env, token):
    handle = weft.start("test.async", "forged")
    weft_env.drive()
    with pytest.raises(weft.InvalidTaskToken):
        weft.complete_async_activity(token, "x")
    assert pending(handle).status == "pending"


def test_a_token_signed_with_another_key_is_refused(weft_env, settings):
    handle = weft.start("test.async", "key")
    weft_env.drive()
    token = pending(handle).token
    settings.SECRET_KEY = "another-secret"
    with pytest.raises(weft.InvalidTaskToken, match="not genuine"):
        weft.complete_async_activity(token, "x")


@override_settings(WEFT_MAX_PAYLOAD_BYTES=100)
def test_an_oversized_result_does_not_use_up_the_token(weft_env):
    handle = weft.start("test.async", "big")
    weft_env.drive()
    token = pending(handle).token
    with pytest.raises(weft.PayloadTooLarge):
        weft.complete_async_activity(token, "x" * 200)
    assert pending(handle).token == token
    weft.complete_async_activity(token, "small")
    weft_env.drive()
    assert handle.result() == "small"


def test_a_failure_goes_through_the_retry_policy_with_a_fresh_token(weft_env):
    # ask_human: max_attempts=2, backoff 10 s.
    handle = weft.start("test.async", "retry")
    weft_env.drive()
    first = pending(handle)
    weft.fail_async_activity(first.token, {"message": "the reviewer rejected the form", "type": "Rejected"})
    weft_env.drive()
    assert handle.refresh().status == "waiting" and executions("retry:asked:2") == 0
    weft_env.advance(timedelta(seconds=10))
    second = pending(handle)
    assert second.attempt == 2 and second.token != first.token
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="already failed"):
        weft.complete_async_activity(first.token, "stale")
    weft.fail_async_activity(second.token, "rejected again")
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match="rejected again"):
        handle.result()


def test_schedule_to_close_timeout_fails_the_activity_through_a_durable_timer(weft_env):
    handle = weft.start("test.async_deadline", "slow")
    weft_env.drive()
    token = pending(handle).token
    weft_env.advance(timedelta(minutes=59))
    assert handle.status == "waiting"
    weft_env.advance(timedelta(minutes=1))
    assert "schedule_to_close_timeout" in handle.result()
    assert AsyncActivity.objects.get(run_id=handle.run_id).status == "timed_out"
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="timed_out"):
        weft.complete_async_activity(token, "too late")
    assert executions("slow:asked") == 1


def test_a_completion_for_a_cancelled_run_is_refused(weft_env):
    handle = weft.start("test.async", "cx")
    weft_env.drive()
    token = pending(handle).token
    handle.cancel("no longer needed")
    weft_env.drive()  # the run's code sees the cancel where it waits for the token
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="cancelled"):
        weft.complete_async_activity(token, "x")
    assert handle.status == "cancelled"


def test_activity_info_and_complete_async_only_inside_an_activity():
    with pytest.raises(weft.WeftError, match="only available inside an activity"):
        weft.activity_info()
    with pytest.raises(weft.WeftError, match="only available inside an activity"):
        weft.complete_async()


@pytest.mark.parametrize(("error", "message"), [(None, "error must be"), ("", "error must be"),
                                                 ({"type": "X"}, "error must be")])
def test_fail_async_activity_needs_an_error(weft_env, error, message):
    handle = weft.start("test.async", "err")
    weft_env.drive()
    with pytest.raises(weft.InvalidArgument, match=message):
        weft.fail_async_activity(pending(handle).token, error)
    assert pending(handle).status == "pending"


# --- webhooks -------------------------------------------------------------------------------------------

def post(client, name, body, **extra):
    return client.post(reverse(f"django_weft:{name}"), data=json.dumps(body) if not isinstance(body, bytes)
                       else body, content_type="application/json", **extra)


def test_webhook_complete(client, weft_env):
    handle = weft.start("test.async", "web")
    weft_env.drive()
    token = pending(handle).token
    response = post(client, "complete", {"token": token, "result": {"ok": 1}})
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert post(client, "complete", {"token": token, "result": 2}).status_code == 409
    weft_env.drive()
    assert handle.result() == {"ok": 1}


def test_webhook_fail(client, weft_env):
    handle = weft.start("test.async", "webfail")
    weft_env.drive()
    token = pending(handle).token
    assert post(client, "fail", {"token": token}).status_code == 400
    response = post(client, "fail", {"token": token, "error": {"message": "nope", "type": "Rejected"}})
    assert response.status_code == 200
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=1)
    weft_env.drive()
    step.refresh_from_db()
    assert step.error["type"] == "Rejected" and step.error["message"] == "nope"


@override_settings(WEFT_MAX_REQUEST_BYTES=500)
def test_webhook_errors(client, weft_env):
    handle = weft.start("test.async", "weberr")
    weft_env.drive()
    token = pending(handle).token
    assert post(client, "complete", {"token": "forged", "result": 1}).status_code == 404
    assert post(client, "complete", b"{not json").status_code == 400
    assert post(client, "complete", ["token"]).status_code == 400
    assert post(client, "complete", {"result": 1}).status_code == 400
    assert post(client, "complete", {"token": token, "result": "x" * 600}).status_code == 413
    assert client.get(reverse("django_weft:complete")).status_code == 405
    assert pending(handle).status == "pending"


def test_webhook_is_csrf_exempt(weft_env):
    from django.test import Client

    handle = weft.start("test.async", "csrf")
    weft_env.drive()
    strict = Client(enforce_csrf_checks=True)
    assert post(strict, "complete", {"token": pending(handle).token, "result": None}).status_code == 200


def test_a_completion_that_arrives_before_the_park_is_kept(weft_env):
    handle = weft.start("test.async_early", "fast")
    weft_env.drive()
    assert handle.result() == "fast answered early"
    record = AsyncActivity.objects.get(run_id=handle.run_id)
    assert record.status == "completed" and record.activity.endswith("answered_at_once")
