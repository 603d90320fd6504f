"""Where branches meet the rest of the engine: a retry of a branch nobody waits for, an async attempt after a
retry, attempts that queue for a slot, an attempt that went on after its timeout, async heartbeats inside
the test's transaction, and an operator's retry of a run a branch failed. Each of these was a bug once."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from django.test import override_settings

import django_weft as weft
from django_weft.models import ActivityHeartbeat, AsyncActivity, RunStatus, StepStatus, WorkflowStep
from tests.test_admin import act  # the admin's retry action
from tests.testapp.branch_workflows import _mark
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db
concurrent = pytest.mark.django_db(transaction=True)


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=1))
def send_request(key: str) -> str:
    _mark(key)
    if weft.activity_info().attempt == 1:
        raise ConnectionError("503")
    return "sent"


@weft.workflow(name="edges.request_reply")
def request_reply(ctx: weft.Context, key: str) -> list:
    request = ctx.start_activity(send_request, key)
    reply = ctx.wait_for_signal("reply")  # the outside system answers once the request was sent
    return [request.result(), reply]


@pytest.mark.parametrize("transactional", [False, True], ids=["in the test's transaction", "threads"])
def test_a_retry_of_a_branch_nobody_waits_for_wakes_the_run(request, transactional):
    if transactional:
        request.getfixturevalue("transactional_db")
    weft_env = request.getfixturevalue("weft_env")
    key = f"rr-{transactional}"
    handle = weft.start("edges.request_reply", key)
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and run.runnable_at is not None  # woken for the retry
    weft_env.advance(timedelta(seconds=1))
    assert executions(key) == 2
    handle.signal("reply", "pong")
    weft_env.drive()
    assert handle.result() == ["sent", "pong"]


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=1))
def fail_then_complete_async(key: str) -> None:
    if weft.activity_info().attempt == 1:
        raise ValueError("first attempt fails")
    weft.complete_async()


@weft.workflow(name="edges.async_after_retry")
def async_after_retry(ctx: weft.Context, key: str) -> list:
    pending = ctx.start_activity(fail_then_complete_async, key)
    ctx.sleep(5)
    return ctx.gather(pending, ctx.start_timer(60))


def test_an_async_attempt_after_a_retry_parks_on_its_token(weft_env):
    handle = weft.start("edges.async_after_retry", "aar")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=6))
    run = handle.refresh()
    assert run.status == RunStatus.WAITING, run.error
    record = AsyncActivity.objects.get(run_id=handle.run_id)
    assert record.attempt == 2
    weft.complete_async_activity(record.token, "done")
    weft_env.advance(timedelta(seconds=60))
    assert handle.result() == ["done", None]


@weft.activity(retry=weft.RetryPolicy(max_attempts=1), timeout=5)
def slow(key: str) -> str:
    _mark(f"{key}:start")
    time.sleep(1)
    return key


@weft.activity(retry=weft.RetryPolicy(max_attempts=1), timeout=0.5)
def fast(key: str) -> str:
    _mark(f"{key}:start")
    return key


@weft.workflow(name="edges.queued")
def queued(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(slow, f"{key}:a"), ctx.start_activity(fast, f"{key}:b"))


@concurrent
@override_settings(WEFT_MAX_PARALLEL_ACTIVITIES=1)
def test_an_attempt_waiting_for_a_slot_has_not_started_its_timeout(weft_env):
    handle = weft.start("edges.queued", "q")
    weft_env.drive()
    assert handle.result(timeout=0) == ["q:a", "q:b"]  # b waited 1 s for a's slot; its timeout is 0.5 s


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def stubborn_loser(key: str) -> str:
    _mark(f"{key}:start")
    time.sleep(1)
    return key


@weft.workflow(name="edges.queued_loser")
def queued_loser(ctx: weft.Context, key: str) -> list:
    first = ctx.start_activity(stubborn_loser, f"{key}:running")
    never = ctx.start_activity(stubborn_loser, f"{key}:queued")
    index, _ = ctx.race(first, never, ctx.start_wait_for_signal("go"))
    ctx.run(sleeper, 1.5)  # the execution goes on: the running loser ends and frees its slot meanwhile
    return [index]


@concurrent
@override_settings(WEFT_MAX_PARALLEL_ACTIVITIES=1)
def test_a_queued_attempt_that_lost_a_race_never_runs(weft_env):
    handle = weft.start("edges.queued_loser", "ql")
    handle.signal("go")  # already there: the signal wait wins while the first activity runs
    weft_env.drive()
    assert handle.result(timeout=0) == [2]
    assert executions("ql:running:start") == 1 and executions("ql:queued:start") == 0


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=0), timeout=0.5)
def resumable(key: str) -> object:
    info = weft.activity_info()
    if info.attempt == 1:
        time.sleep(1.0)
        weft.heartbeat({"from": 1})  # a zombie: its attempt timed out at 0.5 s, the next one has begun
        return "late"
    if info.attempt == 2:
        weft.heartbeat({"from": 2})
        time.sleep(1.5)
        return "late"
    return info.heartbeat_details


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def sleeper(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@weft.workflow(name="edges.zombie_details")
def zombie_details(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(resumable, key), ctx.start_activity(sleeper, 3))


@concurrent
def test_an_attempt_past_its_timeout_cannot_overwrite_the_next_attempts_details(weft_env):
    handle = weft.start("edges.zombie_details", "z")
    weft_env.drive()
    assert handle.result(timeout=0) == [{"from": 2}, 3]
    assert ActivityHeartbeat.objects.get(run_id=handle.run_id, seq=1).attempt == 2


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=0))
async def async_beats(key: str) -> object:
    info = weft.activity_info()
    for i in range(3):
        weft.heartbeat({"beat": i})
        await asyncio.sleep(0)
    if info.attempt == 1:
        raise ValueError("again")
    return info.heartbeat_details


@weft.workflow(name="edges.async_beats")
def async_beats_workflow(ctx: weft.Context, key: str) -> object:
    return ctx.run(async_beats, key)


def test_async_heartbeats_work_inside_the_tests_transaction(weft_env):
    handle = weft.start("edges.async_beats", "ab")
    weft_env.drive()
    assert handle.result() == {"beat": 2}


failing = {"on": True}


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def flaky(key: str) -> str:
    _mark(key)
    if failing["on"]:
        raise ValueError("down")
    return key


@weft.activity
def fine(key: str) -> str:
    _mark(key)
    return key


@weft.workflow(name="edges.gather_retry")
def gather_retry(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(flaky, key), ctx.start_activity(fine, f"{key}:fine"))


def test_an_operators_retry_runs_again_the_failed_branch_and_keeps_the_settled_ones(staff_client, weft_env):
    handle = weft.start("edges.gather_retry", "gr")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.FAILED and run.error["step"] == 1
    failing["on"] = False
    try:
        page = act(staff_client, "retry_selected", [handle.run_id])  # the admin's retry action
        assert page.status_code == 200
        weft_env.drive()
    finally:
        failing["on"] = True
    assert handle.result() == ["gr", "gr:fine"]
    assert executions("gr") == 2 and executions("gr:fine") == 1
    assert list(WorkflowStep.objects.filter(run_id=handle.run_id).values_list("status", flat=True)) == [
        StepStatus.COMPLETED, StepStatus.COMPLETED]


replays = {"n": 0}


@weft.workflow(name="edges.unawaited_timer")
def unawaited_timer(ctx: weft.Context) -> object:
    replays["n"] += 1
    if replays["n"] > 20:
        raise RuntimeError("replayed in a loop")  # ends the loop of a regression: the run fails
    ctx.start_timer(1)  # a branch the code does not wait for (yet)
    return ctx.wait_for_signal("go")


def test_a_timer_nobody_waits_for_does_not_wake_the_run(weft_env):
    replays["n"] = 0
    handle = weft.start("edges.unawaited_timer")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=2))
    assert replays["n"] == 1 and handle.refresh().status == RunStatus.WAITING
    handle.signal("go", "went")
    weft_env.drive()
    assert handle.result() == "went"


@weft.workflow(name="edges.empty_map")
def empty_map(ctx: weft.Context) -> list:
    return ctx.map(fine, [])


def test_map_over_no_items_returns_an_empty_list(weft_env):
    handle = weft.start("edges.empty_map")
    weft_env.drive()
    assert handle.result() == []


@weft.workflow(name="edges.done_before_a_wait")
def done_before_a_wait(ctx: weft.Context) -> list:
    timer = ctx.start_timer(10)
    ctx.wait_for_signal("go")
    seen = [timer.done]  # not waited for yet: False, also on replay, however late the replay comes
    ctx.gather(timer)
    seen.append(timer.done)
    ctx.sleep(5)
    return seen


def test_done_is_the_same_on_replay(weft_env):
    handle = weft.start("edges.done_before_a_wait")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=2))
    handle.signal("go")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=20))  # the replays find the timer's row completed
    assert handle.result() == [False, True]


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def slow_item(item: int) -> int:
    _mark(f"slow:{item}:start")
    time.sleep(0.6)
    _mark(f"slow:{item}:end")
    return item


@weft.workflow(name="edges.budgeted_map")
def budgeted_map(ctx: weft.Context, n: int) -> list:
    return ctx.map(slow_item, list(range(n)), max_parallel=3)


@concurrent
@override_settings(WEFT_CELERY_TASK_SECONDS=0.3)
def test_a_celery_task_out_of_time_lets_running_branches_finish_before_it_hands_the_run_on(weft_env):
    from django_weft.worker import celery_drive

    handle = weft.start("edges.budgeted_map", 6)
    for _ in range(20):
        if handle.refresh().is_finished:
            break
        celery_drive.drive_runs(handle.run_id)  # one django_weft.drive task
    assert handle.result(timeout=0) == list(range(6))
    time.sleep(0.8)  # an attempt abandoned by a hand-back would finish now
    assert [executions(f"slow:{i}:start") for i in range(6)] == [1] * 6


# --- a race's loser, and an attempt past its timeout (issue 29, items 4 and 7) ----------------------------


@weft.workflow(name="edges.race_with_a_due_timer")
def race_with_a_due_timer(ctx: weft.Context, spec: dict) -> object:
    timer, activity = ctx.start_timer(0), ctx.start_activity(fine, spec["key"])
    branches = (activity, timer) if spec["activity_first"] else (timer, activity)
    return ctx.race(*branches)[0]


@pytest.mark.parametrize("activity_first", [False, True], ids=["timer first", "activity first"])
@pytest.mark.parametrize("transactional", [False, True], ids=["in the test's transaction", "threads"])
def test_an_activity_that_loses_a_race_before_it_began_never_begins(request, transactional, activity_first):
    if transactional:
        request.getfixturevalue("transactional_db")
    weft_env = request.getfixturevalue("weft_env")
    key = f"unbegun-{transactional}-{activity_first}"
    handle = weft.start("edges.race_with_a_due_timer", {"key": key, "activity_first": activity_first})
    weft_env.drive()
    assert handle.result(timeout=0) == (1 if activity_first else 0)
    time.sleep(0.3)  # a loser begun in a thread of its own would have marked by now
    assert executions(key) == 0
    activity = WorkflowStep.objects.get(run_id=handle.run_id, kind="activity")
    assert activity.status == StepStatus.CANCELLED


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def slow_loser(key: str) -> str:
    _mark(f"{key}:start")
    weft.signal(weft.activity_info().workflow_id, "go")  # the race's other branch wins while this runs on
    time.sleep(0.8)  # never beats: it cannot learn that it lost
    _mark(f"{key}:end")
    return "late"


@weft.workflow(name="edges.race_with_a_running_loser")
def race_with_a_running_loser(ctx: weft.Context, key: str) -> object:
    return ctx.race(ctx.start_wait_for_signal("go"), ctx.start_activity(slow_loser, key))[0]


@concurrent
def test_a_run_does_not_finish_while_the_attempt_that_lost_its_race_still_runs(weft_env):
    handle = weft.start("edges.race_with_a_running_loser", "running-loser")
    weft_env.drive()
    assert handle.result(timeout=0) == 0
    # The loser had begun: it was asked to stop, and the run finished only once it ended.
    assert (executions("running-loser:start"), executions("running-loser:end")) == (1, 1)
    activity = WorkflowStep.objects.get(run_id=handle.run_id, kind="activity")
    assert activity.status == StepStatus.CANCELLED


@weft.activity(retry=weft.RetryPolicy(max_attempts=1), timeout=0.3)
def beats_past_its_timeout(key: str) -> str:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        weft.heartbeat()  # raises ActivityCancelled once the attempt passed its timeout
        time.sleep(0.01)
    return "never told to stop"


@weft.workflow(name="edges.branch_past_its_timeout")
def branch_past_its_timeout(ctx: weft.Context, key: str) -> object:
    try:
        return ctx.start_activity(beats_past_its_timeout, key).result()
    except weft.ActivityError as exc:
        return exc.error_type


@concurrent
def test_a_branch_that_passed_its_timeout_fails_with_activity_timeout_whoever_noticed_first(weft_env):
    """The attempt's own heartbeat sees the deadline first (it beats every 10 ms, the engine looks every 200 ms):
    it raises ActivityCancelled, and the step still fails with ActivityTimeout."""
    handle = weft.start("edges.branch_past_its_timeout", "bpt-branch")
    weft_env.drive()
    assert handle.result(timeout=0) == "django_weft.exceptions.ActivityTimeout"
