"""Parallel branches: ctx.start_activity / start_timer / start_wait_for_signal / start_child, gather, race and
map; async def activities; heartbeats and activity cancellation.

Tests marked ``concurrent`` commit their data (``transaction=True``): attempts then run on threads of their
own, as in production. The others run in the test's transaction, where attempts run one after another in
the executor's thread, with the same journal.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

import django_weft as weft
from django_weft.models import (
    ActivityHeartbeat,
    RunStatus,
    Signal,
    StepAttempt,
    StepStatus,
    Timer,
    Workflow,
    WorkflowStep,
)
from tests.testapp import branch_workflows as bw
from tests.testapp.models import Execution
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db
concurrent = pytest.mark.django_db(transaction=True)


def rows(handle) -> list[tuple[int, str, str]]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq")
                .values_list("seq", "kind", "status"))


# --- gather ---------------------------------------------------------------------------------------------


@concurrent
def test_gathered_activities_run_at_the_same_time(weft_env):
    # Each activity waits at a barrier for the other four: run one after another, they would all fail.
    handle = weft.start("branches.fan_out", {"key": "five", "n": 5})
    weft_env.drive()
    assert handle.result(timeout=0) == [f"five:{seq}" for seq in range(1, 6)]
    assert executions("five:met") == 5
    assert rows(handle) == [(seq, "activity", "completed") for seq in range(1, 6)]


def test_gather_lets_the_others_settle_then_raises_the_first_failure_in_argument_order(weft_env):
    branches = [["g:a", False], ["g:b", True], ["g:c", False], ["g:d", True]]
    handle = weft.start("branches.gather_failure", {"branches": branches})
    weft_env.drive()
    outcome = handle.result()
    assert "g:b refused" in outcome["raised"] and outcome["done"] == [True] * 4
    assert [status for _, _, status in rows(handle)] == ["completed", "failed", "completed", "failed"]
    assert all(executions(key) == 1 for key, _ in branches)


def test_gather_with_return_exceptions_returns_failures_in_place(weft_env):
    handle = weft.start("branches.gather_failure",
                        {"branches": [["r:a", False], ["r:b", True]], "return_exceptions": True})
    weft_env.drive()
    assert handle.result() == ["r:a", "error:ActivityError"]


def test_a_gather_waiting_on_a_timer_parks_and_wakes_when_it_fires(weft_env):
    handle = weft.start("branches.activity_and_timer", "t1")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and run.wait_reason.startswith("sleeping until")
    assert rows(handle) == [(1, "activity", "completed"), (2, "sleep", "waiting")]
    weft_env.advance(timedelta(seconds=30))
    assert handle.result() == ["t1", None]
    assert executions("t1") == 1  # the settled branch was not run again after the wake


def test_a_branch_retries_on_a_durable_backoff_while_the_others_are_kept(weft_env):
    handle = weft.start("branches.retrying_branch", "rb")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and "retrying" in run.wait_reason
    assert Timer.objects.filter(run_id=handle.run_id, purpose="retry_backoff", fired_at__isnull=True).count() == 1
    weft_env.advance(timedelta(seconds=10))
    first, other = handle.result()
    assert first == f"rb:ok:2:{handle.run_id}:1" and other == "rb:other"
    assert executions("rb") == 2 and executions("rb:other") == 1


def test_an_async_branch_parks_the_gather_until_its_token_is_completed(weft_env):
    from django_weft.models import AsyncActivity

    handle = weft.start("branches.async_branch", "ab")
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    record = AsyncActivity.objects.get(run_id=handle.run_id)
    weft.complete_async_activity(record.token, {"answer": 42})
    weft_env.drive()
    assert handle.result() == [{"answer": 42}, "ab:other"]
    assert executions("ab:asked") == 1 and executions("ab:other") == 1


def test_a_child_branch_gathers_with_an_activity(weft_env):
    handle = weft.start("branches.gather_child", "gc")
    weft_env.drive()
    assert handle.result() == ["child gc done", "gc:beside"]
    assert executions("gc:child") == 1


def test_a_crash_keeps_every_settled_branch_and_runs_again_only_the_one_in_flight(weft_env):
    handle = weft.start("branches.crash_mid_gather", "cm")
    with pytest.raises(bw.Crash):
        weft_env.drive()
    assert rows(handle) == [(1, "activity", "completed")]  # committed before the second branch started
    Workflow.objects.filter(pk=handle.run_id).update(runnable_at=weft_env.now())  # its lease, expired
    weft_env.drive()
    assert handle.result() == ["cm:settled", "cm:crashes"]
    assert executions("cm:settled") == 1 and executions("cm:crashes") == 2


def test_changing_the_order_of_started_branches_is_a_nondeterminism_error_naming_the_position(weft_env):
    handle = weft.start("branches.order", "o")
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    bw.order["swapped"] = True
    try:
        weft_env.advance(timedelta(seconds=10))
    finally:
        bw.order["swapped"] = False
    run = handle.refresh()
    assert run.status == RunStatus.FAILED and run.error["type"].endswith("NonDeterminismError")
    assert "step 1" in run.error["message"] and "activity" in run.error["message"]


# --- race -----------------------------------------------------------------------------------------------


def test_a_race_won_by_a_signal_drops_the_timer_and_replays_the_same_winner(weft_env):
    handle = weft.start("branches.approval", 2)
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and run.awaiting_signals == ["approval"]
    handle.signal("approval", {"by": "ann"})
    weft_env.drive()
    assert handle.result() == {"winner": "signal", "value": {"by": "ann"}}
    assert [(kind, status) for _, kind, status in rows(handle)] == [
        ("signal", "completed"), ("sleep", "cancelled"), ("race", "completed"), ("activity", "completed")]
    assert not Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).exists()
    assert executions(f"{handle.workflow_id}:0") == 1


def test_a_race_won_by_the_timer_consumes_no_signal(weft_env):
    handle = weft.start("branches.approval", 1)
    weft_env.drive()
    weft_env.advance(timedelta(days=1))
    assert handle.refresh().status == RunStatus.WAITING  # the later wait_for_signal
    assert [(kind, status) for _, kind, status in rows(handle)][:3] == [
        ("signal", "cancelled"), ("sleep", "completed"), ("race", "completed")]
    handle.signal("approval", "late yes")
    weft_env.drive()
    assert handle.result() == {"winner": "timer", "late": "late yes"}
    assert Signal.objects.get(run_id=handle.run_id).consumed_by_seq == 5


def test_the_recorded_winner_is_returned_on_replay_even_if_another_branch_could_settle_first(weft_env):
    handle = weft.start("branches.approval", 1)
    weft_env.drive()
    weft_env.advance(timedelta(days=1))  # the timer won; the run now waits for the late signal
    handle.signal("approval", "now")
    handle.suspend()
    handle.resume()  # a replay: the signal is there, but the race's record says the timer won
    weft_env.drive()
    assert handle.result() == {"winner": "timer", "late": "now"}


@concurrent
def test_the_activity_that_lost_a_race_is_asked_to_stop_and_its_result_is_discarded(weft_env):
    handle = weft.start("branches.activity_race", "ar")
    weft_env.drive()
    assert handle.result(timeout=0) == [1, "ar:winner"]
    assert [status for _, _, status in rows(handle)] == ["cancelled", "completed", "completed"]
    cancelled = bw.wait_for_mark("ar:loser:cancelled:")
    assert "lost the race of step 3" in cancelled


def test_a_child_that_lost_a_race_is_cancelled(weft_env):
    handle = weft.start("branches.child_race", "terminate")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=60))
    outcome = handle.result()
    assert outcome["index"] == 1
    child = weft.get_handle(outcome["child"]).refresh()
    assert child.status == RunStatus.CANCELLED


def test_an_abandoned_child_keeps_running_after_losing_a_race(weft_env):
    handle = weft.start("branches.child_race", "abandon")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=60))
    outcome = handle.result()
    assert outcome["index"] == 1
    assert weft.get_handle(outcome["child"]).refresh().status == RunStatus.WAITING


# --- map and the pool bound -----------------------------------------------------------------------------


@concurrent
def test_map_returns_results_in_item_order_with_at_most_max_parallel_at_once(weft_env):
    bw.concurrency.update(now=0, max=0)
    handle = weft.start("branches.map", {"n": 9, "max_parallel": 3})
    weft_env.drive()
    assert handle.result(timeout=0) == [i * 10 for i in range(9)]
    assert 1 <= bw.concurrency["max"] <= 3


@concurrent
@override_settings(WEFT_MAX_PARALLEL_ACTIVITIES=2)
def test_the_run_wide_bound_holds_for_a_gather(weft_env):
    bw.concurrency.update(now=0, max=0)
    handle = weft.start("branches.gather_counted", 6)
    weft_env.drive()
    assert handle.result(timeout=0) == [i * 10 for i in range(6)]
    assert 1 <= bw.concurrency["max"] <= 2


def test_gather_and_race_refuse_what_is_not_a_branch(weft_env):
    handle = weft.start("branches.bad_gather")
    weft_env.drive()
    empty, foreign = handle.result()
    assert "at least one branch" in empty and "not a branch" in foreign


# --- async def activities -------------------------------------------------------------------------------


@concurrent
def test_async_activities_in_one_gather_share_one_event_loop_and_run_at_the_same_time(weft_env):
    handle = weft.start("branches.async_fan_out", {"key": "aio", "n": 4})
    weft_env.drive()
    assert handle.result(timeout=0) == [f"aio:{seq}" for seq in range(1, 5)]
    assert len(bw.loops["aio"]) == 1


def test_async_activities_work_with_ctx_run_and_map(weft_env):
    handle = weft.start("branches.async_run", 21)
    weft_env.drive()
    assert handle.result() == [42, [2, 4, 6]]


@concurrent
def test_an_async_activity_that_passes_its_timeout_is_cancelled_and_retried(weft_env):
    handle = weft.start("branches.async_timeout", "at")
    weft_env.drive()
    assert handle.result(timeout=0) == "at:attempt 2"
    [step] = WorkflowStep.objects.filter(run_id=handle.run_id)
    assert (step.status, step.attempt) == (StepStatus.COMPLETED, 2)


# --- heartbeats and cancellation ------------------------------------------------------------------------


def test_heartbeat_details_reach_the_next_attempt(weft_env):
    handle = weft.start("branches.resumable", "hb")
    weft_env.drive()
    assert handle.result() == {"resumed_from": {"done": 3}, "key": f"{handle.run_id}:1"}
    beat = ActivityHeartbeat.objects.get(run_id=handle.run_id)
    assert (beat.seq, beat.attempt) == (1, 1)


def test_heartbeat_details_must_be_serialisable(weft_env):
    from django_weft.runtime.activities import ActivityInfo, current_activity

    token = current_activity.set(ActivityInfo(workflow_id="w", run_id=__import__("uuid").uuid4(), seq=1,
                                              attempt=1, activity="a"))
    try:
        with pytest.raises(weft.PayloadNotSerializable, match="heartbeat details"):
            from django_weft.runtime.heartbeats import AttemptControl

            AttemptControl(None, current_activity.get().run_id, 1, 1, timeout=None,
                           heartbeat_timeout=None).beat(object())
    finally:
        current_activity.reset(token)


def test_heartbeat_outside_an_activity_is_an_error():
    with pytest.raises(weft.WeftError, match="only available inside an activity"):
        weft.heartbeat()


@concurrent
def test_an_attempt_silent_past_its_heartbeat_timeout_fails_and_is_retried(weft_env):
    handle = weft.start("branches.silent", "quiet")
    weft_env.drive()
    assert handle.result(timeout=0) == "attempt 2"
    assert executions("quiet") == 2


@concurrent
def test_a_branch_silent_past_its_heartbeat_timeout_fails_and_is_retried(weft_env):
    handle = weft.start("branches.silent_branch", "quiet-branch")
    weft_env.drive()
    assert handle.result(timeout=0) == ["attempt 2"]


@concurrent
def test_heartbeat_raises_activity_cancelled_once_the_attempt_passed_its_timeout(weft_env):
    handle = weft.start("branches.beats_past_timeout", "bpt")
    weft_env.drive()
    assert handle.result(timeout=0) == "django_weft.exceptions.ActivityTimeout"
    assert "passed its timeout" in bw.wait_for_mark("bpt:cancelled:")


@concurrent
def test_heartbeat_raises_activity_cancelled_when_the_run_is_cancelled(weft_env):
    bw.started.clear()
    handle = weft.start("branches.cancel_me", "cx")
    def drive() -> None:
        try:
            weft_env.drive()
        finally:
            connections.close_all()

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        assert bw.started.wait(10)
        assert handle.cancel("operator said stop")
    finally:
        driver.join(30)
    assert not driver.is_alive()
    assert "the run's cancel was requested" in bw.wait_for_mark("cx:cancelled:")
    assert handle.refresh().status == RunStatus.CANCELLED


def test_idempotency_key_is_the_same_for_every_attempt(weft_env):
    handle = weft.start("branches.retrying_branch", "ik")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=10))
    assert handle.result()[0].endswith(f":{handle.run_id}:1")
    assert Execution.objects.filter(key="ik").count() == 2


@pytest.mark.parametrize("branch", [False, True], ids=["ctx.run", "start_activity"])
def test_a_retry_cut_short_by_a_crash_runs_again_after_its_backoff_timer_fired(weft_env, branch):
    key = f"cr-{branch}"
    handle = weft.start("branches.crash_in_retry", {"key": key, "branch": branch})
    weft_env.drive()
    with pytest.raises(bw.Crash):
        weft_env.advance(timedelta(seconds=5))  # the backoff timer fired, then attempt 2 died with its process
    Workflow.objects.filter(pk=handle.run_id).update(runnable_at=weft_env.now())  # its lease, expired
    weft_env.drive()
    # The attempt that died with its executor counts: the takeover's attempt is the third (design 9.1).
    assert handle.result() == f"{key}:attempt 3"
    assert executions(key) == 3
    history = list(StepAttempt.objects.filter(run_id=handle.run_id).values_list("attempt", "outcome"))
    assert history == [(1, "failed"), (2, "lost"), (3, "completed")]
