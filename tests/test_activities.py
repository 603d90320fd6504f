"""Activities: retry policy with durable backoff, non-retryable errors, per-attempt timeouts."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import StepStatus, Timer, WorkflowStep
from tests.testapp.workflows import executions


def test_retry_backoff_is_a_durable_timer_and_follows_the_policy(weft_env):
    # flaky: max_attempts=3, initial_backoff=1s, multiplier 2 -> waits of 1s then 2s.
    handle = weft.start("test.retry", {"key": "f", "failures": 2})
    weft_env.drive()
    assert executions("f") == 1
    run = handle.refresh()
    assert run.status == "waiting" and "attempt 2" in run.wait_reason
    step = WorkflowStep.objects.get(run_id=handle.run_id)
    assert (step.status, step.attempt) == (StepStatus.WAITING, 1)
    assert "failure 1 of f" in step.error["message"]
    timer = Timer.objects.get(run_id=handle.run_id, purpose="retry_backoff")
    assert timer.fire_at == weft_env.now() + timedelta(seconds=1)

    weft_env.advance(timedelta(seconds=0.5))
    assert executions("f") == 1, "the retry must wait for its backoff"
    weft_env.advance(timedelta(seconds=0.5))
    assert executions("f") == 2
    second = Timer.objects.filter(run_id=handle.run_id, purpose="retry_backoff", fired_at__isnull=True).get()
    assert second.fire_at == weft_env.now() + timedelta(seconds=2)

    weft_env.advance(timedelta(seconds=2))
    assert handle.result() == "ok"
    step.refresh_from_db()
    assert (step.status, step.attempt) == (StepStatus.COMPLETED, 3)
    assert executions("f") == 3


def test_exhausted_retries_fail_the_run_with_the_last_error(weft_env):
    handle = weft.start("test.retry", {"key": "g", "failures": 10})
    weft_env.drive()
    weft_env.advance(timedelta(seconds=1))
    weft_env.advance(timedelta(seconds=2))
    assert executions("g") == 3
    run = handle.refresh()
    assert run.status == "failed"
    assert run.error["type"] == "django_weft.exceptions.ActivityError"
    assert "after 3 attempt(s)" in run.error["message"]
    assert "failure 3 of g" in run.error["message"], "the run must carry the last attempt's error"
    with pytest.raises(weft.WorkflowFailed, match="failure 3 of g"):
        handle.result()
    weft_env.advance(timedelta(minutes=5))
    assert executions("g") == 3


def test_non_retryable_error_fails_at_once_and_is_catchable(weft_env):
    handle = weft.start("test.non_retryable", "n")
    weft_env.drive()
    assert handle.result() == "compensated: ValueError"
    assert executions("n") == 1
    step = WorkflowStep.objects.get(run_id=handle.run_id)
    assert (step.status, step.attempt, step.error["type"]) == (StepStatus.FAILED, 1, "ValueError")


def test_uncaught_activity_error_fails_the_run(weft_env):
    handle = weft.start("test.uncaught", "u")
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match="bad value for u"):
        handle.result()


@pytest.mark.django_db(transaction=True)  # the attempt runs in its own thread, with its own connection
def test_per_attempt_timeout_fails_the_attempt_and_retries(weft_env):
    # too_slow: timeout 0.3s, max_attempts=2, backoff 5s; it sleeps 2s each time.
    handle = weft.start("test.timeout", "t")
    weft_env.drive()
    step = WorkflowStep.objects.get(run_id=handle.run_id)
    assert step.status == StepStatus.WAITING
    assert step.error["type"] == "django_weft.exceptions.ActivityTimeout"
    assert "ran longer than its 0.3s timeout" in step.error["message"]
    weft_env.advance(timedelta(seconds=5))
    run = handle.refresh()
    assert run.status == "failed"
    assert "ActivityTimeout" in run.error["message"]
    assert executions("t") == 2


def test_unencodable_activity_result_fails_without_retrying(weft_env):
    handle = weft.start("test.unencodable", "x")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "failed"
    assert "PayloadNotSerializable" in run.error["message"]


def test_retry_policy_rejects_nonsense():
    with pytest.raises(weft.InvalidArgument, match="max_attempts"):
        weft.RetryPolicy(max_attempts=0)
    with pytest.raises(weft.InvalidArgument, match="backoff_multiplier"):
        weft.RetryPolicy(backoff_multiplier=0.5)
    with pytest.raises(weft.InvalidArgument, match="timeout must be positive"):
        weft.activity(timeout=0)


def test_default_policy_matches_the_documented_defaults():
    policy = weft.RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff, policy.backoff_multiplier, policy.max_backoff) == (
        3, 1.0, 2.0, 30.0)
    assert [policy.backoff(n) for n in (1, 2, 3, 6, 10)] == [1.0, 2.0, 4.0, 30.0, 30.0]
