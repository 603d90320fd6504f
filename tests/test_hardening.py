"""Regression tests for issue 10: lost completions, poison error text, tokens, and bad input refused
with a WeftError before anything is written. Each fails on the code before the fix."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.common import tokens
from django_weft.models import AsyncActivity, Schedule, Signal, Workflow, WorkflowStep
from django_weft.store import repairs
from tests.testapp.hardening_workflows import Crash, handed_out
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db

LEASE = timedelta(seconds=31)  # past tests.settings' WEFT_LEASE_SECONDS


def drive_until_crash(env) -> None:
    with pytest.raises(Crash):
        env.drive()


# --- 1. an accepted completion is applied however it raced with parking, replay and retry ------------------


def test_a_completion_sent_while_no_executor_holds_the_run_is_applied(weft_env):
    handle = weft.start("hardening.async_crash", ["lost", "raise"])
    drive_until_crash(weft_env)  # the body handed its token out; the executor "died" before the park
    assert handle.refresh().status == "running"
    weft.complete_async_activity(handed_out["lost"], {"approved": True})

    weft_env.advance(LEASE)  # the lease runs out; another executor takes the run over
    assert handle.result(timeout=0) == {"approved": True}
    # The lost attempt's token was answered: its answer is applied without running the body again.
    assert executions("lost:body") == 1 and executions("lost:after") == 1
    with pytest.raises(weft.TaskTokenAlreadyUsed):
        weft.complete_async_activity(handed_out["lost"], "again")
    [record] = AsyncActivity.objects.filter(run_id=handle.run_id)
    assert (record.status, record.activity) == ("completed", "tests.testapp.hardening_workflows.hand_out_then_crash")


def test_after_a_takeover_the_lost_attempts_token_is_used_up_and_the_next_attempts_token_works(weft_env):
    handle = weft.start("hardening.async_crash", ["relost", "raise"])
    drive_until_crash(weft_env)  # attempt 1 handed its token out; its executor "died" before the park
    first_token = handed_out["relost"]
    weft_env.advance(LEASE)  # taken over: attempt 1 counts as lost, attempt 2 hands out its own token and parks
    second_token = handed_out["relost"]
    assert second_token != first_token
    assert handle.refresh().status == "waiting"
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="was lost with its executor"):
        weft.complete_async_activity(first_token, "too late")
    weft.complete_async_activity(second_token, "from attempt 2")
    weft_env.drive()
    assert handle.result(timeout=0) == "from attempt 2"


def test_a_failure_sent_while_no_executor_holds_the_run_goes_to_the_retry_policy(weft_env):
    handle = weft.start("hardening.async_crash", ["lostfail", "raise"])
    drive_until_crash(weft_env)
    first_token = handed_out["lostfail"]
    weft.fail_async_activity(first_token, "declined")
    weft_env.advance(LEASE)
    run = handle.refresh()
    assert run.status == "waiting" and "attempt 2" in run.wait_reason  # the failed attempt 1 is retried
    weft_env.advance(timedelta(seconds=5))
    second_token = handed_out["lostfail"]
    assert second_token != first_token
    weft.complete_async_activity(second_token, "second time lucky")
    weft_env.drive()
    assert handle.result(timeout=0) == "second time lucky"


def test_the_token_of_a_failed_attempt_is_refused_after_an_operator_retry(weft_env):
    handle = weft.start("hardening.async_once", "retry")
    weft_env.drive()
    old_token = handed_out["retry:1"]
    weft.fail_async_activity(old_token, "no")
    weft_env.drive()
    assert handle.refresh().status == "failed"

    repairs.retry_failed(handle.run_id, weft_env.now())
    weft_env.drive()
    assert handle.refresh().status == "waiting"
    new_token = handed_out["retry:2"]
    assert new_token != old_token
    with pytest.raises(weft.TaskTokenAlreadyUsed, match=r"before run .* was retried"):
        weft.complete_async_activity(old_token, "stale")
    assert handle.refresh().status == "waiting"
    weft.complete_async_activity(new_token, "fresh")
    weft_env.drive()
    assert handle.result(timeout=0) == "fresh"


def test_a_completion_arriving_after_a_retry_but_before_the_replay_is_applied(weft_env):
    handle = weft.start("hardening.async_once", "race")
    weft_env.drive()
    weft.fail_async_activity(handed_out["race:1"], "no")
    weft_env.drive()
    repairs.retry_failed(handle.run_id, weft_env.now())
    # The new attempt's token is deterministic; an outside system that has it answers before the replay.
    run = handle.refresh()
    token = tokens.make_task_token(run.run_id, 1, 1, run.retries)
    weft.complete_async_activity(token, "early")
    weft_env.drive()
    assert handle.result(timeout=0) == "early"


# --- 6. a plain activity's token resolves nothing ---------------------------------------------------------


def test_a_plain_activitys_token_is_refused_once_its_step_finished(weft_env):
    handle = weft.start("hardening.plain_token", "plain")
    weft_env.drive()
    assert handle.refresh().status == "waiting"  # for its signal, past the plain activity
    with pytest.raises(weft.InvalidTaskToken, match="not an async activity"):
        weft.complete_async_activity(handed_out["plain"], "late")
    with pytest.raises(weft.InvalidTaskToken, match="not an async activity"):
        weft.fail_async_activity(handed_out["plain"], "late")
    assert not AsyncActivity.objects.filter(run_id=handle.run_id).exists()
    handle.signal("done")
    weft_env.drive()
    assert handle.result(timeout=0) == ["plain result", "after"]
    with pytest.raises(weft.TaskTokenAlreadyUsed):
        weft.complete_async_activity(handed_out["plain"], "later still")


def test_a_token_used_while_its_plain_activity_still_runs_wins(weft_env):
    handle = weft.start("hardening.plain_completed_meanwhile", "meanwhile")
    weft_env.drive()
    assert handle.result(timeout=0) == "from the token"


def test_a_token_for_an_attempt_that_never_ran_is_refused(weft_env):
    handle = weft.start("hardening.plain_token", "never")
    weft_env.drive()
    with pytest.raises(weft.InvalidTaskToken):
        weft.complete_async_activity(tokens.make_task_token(handle.run_id, 1, 5), "x")
    with pytest.raises(weft.InvalidTaskToken):
        weft.complete_async_activity(tokens.make_task_token(handle.run_id, 9, 1), "x")


# --- 2. error text the database cannot store ---------------------------------------------------------------


def test_an_activity_error_with_nul_and_a_lone_surrogate_fails_the_run_once(weft_env):
    handle = weft.start("hardening.poison_activity", "poison")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=2))  # the one retry
    weft_env.advance(LEASE)  # nothing left to recover
    run = handle.refresh()
    assert run.status == "failed"
    assert executions("poison:poison") == 2  # the retry policy's two attempts, not one per lease expiry
    assert executions("poison:after") == 1  # the activity before it is not re-run
    assert "bad\\x00byte and a lone \\ud800 surrogate" in run.error["message"]
    step = WorkflowStep.objects.get(run=run, seq=2)
    assert step.status == "failed" and "\\x00" in step.error["message"]
    with pytest.raises(weft.WorkflowFailed, match="PoisonText"):
        handle.result(timeout=0)


def test_a_workflow_error_with_nul_fails_the_run_once_and_run_maintenance_does_not_raise(weft_env):
    handle = weft.start("hardening.poison_workflow", "wf")
    report = weft.run_maintenance(now=weft_env.now())
    assert report.outcomes["failed"] == 1
    run = handle.refresh()
    assert run.status == "failed" and "\\x00 and \\udfff" in run.error["message"]
    assert executions("wf:after") == 1


def test_a_signal_name_the_database_cannot_store_fails_the_run_with_a_clear_error(weft_env):
    handle = weft.start("hardening.bad_signal_name", "sig")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "failed" and "NUL" in run.error["message"]
    assert run.error["type"] == "django_weft.exceptions.InvalidArgument"


def test_an_async_failure_with_unstorable_text_is_refused_and_the_token_stays_good(weft_env):
    handle = weft.start("test.async", "asyncnul")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=handle.run_id).token
    for error in ("bad \x00", {"message": "ok", "type": "Bad\ud800"}, {"message": "x" * 5000}):
        with pytest.raises(weft.InvalidArgument):
            weft.fail_async_activity(token, error)
    assert AsyncActivity.objects.get(run_id=handle.run_id).status == "pending"
    weft.complete_async_activity(token, "fine")
    weft_env.drive()
    assert handle.result(timeout=0) == "fine"


# --- 4. bad identifiers refused with InvalidArgument naming the field, nothing written ----------------------

BAD_TEXT = ["nul\x00inside", "lone\ud800surrogate"]


def rows() -> tuple[int, int, int]:
    return Workflow.objects.count(), Signal.objects.count(), Schedule.objects.count()


@pytest.fixture
def open_run(weft_env):
    handle = weft.start("test.collect", 1, workflow_id="target")
    weft_env.drive()
    return handle


@pytest.mark.parametrize("bad", BAD_TEXT, ids=["nul", "surrogate"])
@pytest.mark.parametrize(("field", "call"), [
    ("workflow_id", lambda bad: weft.start("test.collect", workflow_id=bad)),
    ("idempotency_key", lambda bad: weft.start("test.collect", idempotency_key=bad)),
    ("tag", lambda bad: weft.start("test.collect", tags=["ok", bad])),
    ("search attribute", lambda bad: weft.start("test.collect", search_attributes={"region": bad})),
    ("search attribute", lambda bad: weft.start("test.collect", search_attributes={bad: 1})),
    ("signal name", lambda bad: weft.signal("target", bad)),
    ("signal_id", lambda bad: weft.signal("target", "go", signal_id=bad)),
    ("workflow_id", lambda bad: weft.signal(bad, "go")),
    ("workflow_id", lambda bad: weft.get_handle(bad)),
    ("workflow_id", lambda bad: weft.cancel(bad)),
    ("reason", lambda bad: weft.cancel("target", reason=bad)),
    ("signal name", lambda bad: weft.start_or_signal("test.collect", signal=bad, workflow_id="new", signal_id="1")),
    ("signal_id", lambda bad: weft.start_or_signal("test.collect", signal="go", workflow_id="new", signal_id=bad)),
    ("idempotency_key", lambda bad: weft.start_or_signal("test.collect", signal="go", idempotency_key=bad)),
    ("schedule_id", lambda bad: weft.create_schedule(bad, "test.collect", cron="0 * * * *")),
    ("schedule_id", lambda bad: weft.get_schedule(bad)),
])
def test_unstorable_text_is_refused_naming_the_field(open_run, field, call, bad):
    before = rows()
    with pytest.raises(weft.InvalidArgument, match=field):
        with transaction.atomic():  # on PostgreSQL a raw DataError would also break this transaction
            call(bad)
    assert rows() == before
    assert open_run.refresh().status == "waiting"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, {"deep": [math.nan]}, "NaN", "Infinity"])
def test_non_finite_search_attribute_values_are_refused(db, value):
    with pytest.raises(weft.InvalidArgument, match="search attribute 'amount' is decimal"):
        weft.start("test.collect", search_attributes={"amount": value})
    assert not Workflow.objects.exists()


def test_tags_are_bounded(db):
    with pytest.raises(weft.InvalidArgument, match="at most 64 tags"):
        weft.start("test.collect", tags=[f"t{i}" for i in range(65)])
    with pytest.raises(weft.InvalidArgument, match="tag"):
        weft.start("test.collect", tags=["x" * 256])
    assert not Workflow.objects.exists()
    handle = weft.start("test.collect", tags=[f"t{i}" for i in range(64)])
    assert len(handle.refresh().tags) == 64


@pytest.mark.parametrize("view", ["django_weft:complete", "django_weft:fail"])
def test_a_deeply_nested_webhook_body_is_a_422(client, weft_env, view):
    handle = weft.start("test.async", "deep")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=handle.run_id).token
    deep = "[" * 100_000 + "]" * 100_000
    body = f'{{"token": {json.dumps(token)}, "result": {deep}, "error": {deep}}}'
    response = client.post(reverse(view), body, content_type="application/json")
    assert response.status_code == 422 and "nested too deeply" in response.json()["error"]
    # Nested deep enough for the JSON parser but over the payload limit: the codec refuses the result, also a 422
    # (fail reads only the error's message, a string here).
    mid = "[" * 900 + "]" * 900
    field, value = ("result", mid) if view == "django_weft:complete" else ("error", f'{{"message": {json.dumps(mid)}}}')
    body = f'{{"token": {json.dumps(token)}, "{field}": {value}}}'
    with override_settings(WEFT_MAX_REQUEST_BYTES=10_000_000):
        response = client.post(reverse(view), body, content_type="application/json")
    assert response.status_code == (422 if view == "django_weft:complete" else 200)
    assert AsyncActivity.objects.get(run_id=handle.run_id).status in ("pending", "completed", "failed")


@pytest.mark.parametrize("bad", ["\x00", "a\ud800"])
def test_unstorable_text_in_a_webhook_body_is_a_400(client, weft_env, bad):
    handle = weft.start("test.async", "hooktext")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=handle.run_id).token
    body = json.dumps({"token": token, "error": {"message": f"declined {bad}"}})
    response = client.post(reverse("django_weft:fail"), body, content_type="application/json")
    assert response.status_code == 400 and "error's message" in response.json()["error"]
    assert AsyncActivity.objects.get(run_id=handle.run_id).status == "pending"


# --- 5. resume keeps a delayed start ---------------------------------------------------------------------


def test_resume_of_a_suspended_delayed_start_waits_for_its_start_time(weft_env):
    handle = weft.start("hardening.delayed", "later", start_after=timedelta(hours=1))
    handle.suspend()
    handle.resume()
    weft_env.drive()
    assert handle.refresh().status == "pending"
    assert executions("later:after") == 0
    weft_env.advance(timedelta(minutes=59))
    assert executions("later:after") == 0
    weft_env.advance(timedelta(minutes=1))
    assert handle.result(timeout=0) == "after"


def test_resume_after_the_delayed_start_passed_runs_at_once(weft_env):
    handle = weft.start("hardening.delayed", "passed", start_after=timedelta(minutes=5))
    handle.suspend()
    weft_env.advance(timedelta(minutes=10))
    assert handle.refresh().status == "suspended"
    handle.resume()
    weft_env.drive()
    assert handle.result(timeout=0) == "after"


# --- 7. durations and schedules ---------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["start_after", "execution_timeout"])
@pytest.mark.parametrize("value", [math.nan, math.inf, 1e12, 10**400, timedelta.max])
def test_unrepresentable_durations_are_refused(db, option, value):
    with pytest.raises(weft.InvalidArgument, match=option):
        weft.start("test.collect", **{option: value})
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("field", ["initial_backoff", "max_backoff", "backoff_multiplier"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_retry_policy_refuses_non_finite_values(field, value):
    with pytest.raises(weft.InvalidArgument, match=field):
        weft.RetryPolicy(**{field: value})


@pytest.mark.parametrize("option", ["every", "jitter", "catchup_window"])
def test_schedule_durations_refuse_nan(db, option):
    kwargs = {"every": timedelta(minutes=1)} if option != "every" else {}
    with pytest.raises(weft.InvalidArgument, match=option):
        weft.create_schedule("nan", "test.collect", **kwargs, **{option: math.nan})
    assert not Schedule.objects.exists()


def test_moments_with_offsets_postgresql_cannot_store_are_taken_in_utc(db):
    # Python allows UTC offsets up to 24 h; PostgreSQL stores at most 15:59.
    import datetime as dt

    far_east = dt.timezone(dt.timedelta(hours=16))
    moment = dt.datetime(2030, 1, 1, 12, 0, tzinfo=far_east)
    handle = weft.start("test.collect", 1, start_at=moment)
    assert handle.refresh().runnable_at == moment
    schedule = weft.create_schedule("offset", "test.collect", 1, every=timedelta(hours=1), start_at=moment)
    schedule.refresh_from_db()
    assert schedule.start_at == moment


def test_run_maintenance_takes_now_in_any_offset(db):
    import datetime as dt

    handle = weft.start("hardening.delayed", "offset-now")
    later = dt.datetime(2099, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=16)))
    weft.run_maintenance(now=later)
    assert handle.result(timeout=0) == "after"


def test_deeply_nested_tuples_decode_in_a_small_thread_stack():
    import threading

    from django_weft.common.codec import MAX_DEPTH, decode, encode

    value: object = timedelta(days=1)  # packed by a nested call of its own
    for _ in range(MAX_DEPTH):
        value = (value,)
    data = encode(value)
    with pytest.raises(weft.PayloadTooDeep, match="nested more than"):
        encode((value,))
    results: list = []
    previous = threading.stack_size(2 * 1024 * 1024)
    try:
        thread = threading.Thread(target=lambda: results.append(decode(data) == value))
        thread.start()
        thread.join(30)
    finally:
        threading.stack_size(previous)
    assert results == [True]
