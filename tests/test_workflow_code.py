"""What workflow code can ask for besides cancellation (design 9.2): ctx.info, ctx.signal_workflow, activities
by registered name, retry policies without an attempt limit."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command

import django_weft as weft
from django_weft.models import Signal, Workflow, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)


calls: list[int] = []


@weft.activity(name="cx.flaky_forever", retry=weft.RetryPolicy(max_attempts=None, initial_backoff=1, max_backoff=5))
def flaky_forever() -> int:
    calls.append(weft.activity_info().attempt)
    if len(calls) < 12:
        raise RuntimeError("not yet")
    return len(calls)


@weft.workflow(name="cx.retry_forever")
def retry_forever(ctx: weft.Context) -> int:
    return ctx.run(flaky_forever)


def test_a_retry_policy_without_max_attempts_retries_until_the_activity_succeeds(weft_env):
    calls.clear()
    handle = weft.start(retry_forever)
    weft_env.advance(timedelta(minutes=2))
    assert handle.result() == 12 and calls == list(range(1, 13))
    with pytest.raises(weft.InvalidArgument, match="int >= 1 or None"):
        weft.RetryPolicy(max_attempts=0)


@weft.workflow(name="wc.child_info")
def child_info(ctx: weft.Context) -> dict:
    info = ctx.info
    return {"workflow_id": info.workflow_id, "parent": info.parent_workflow_id,
            "parent_run_id": str(info.parent_run_id), "attempt": info.attempt, "history": info.history_length,
            "schedule": info.schedule_id, "scheduled_for": info.scheduled_for}


@weft.workflow(name="wc.parent_info")
def parent_info(ctx: weft.Context) -> dict:
    ctx.side_effect(lambda: 1)
    mine = ctx.info
    child = ctx.run_child(child_info, workflow_id="wc-child")
    return {"mine": [mine.workflow_id, mine.parent_workflow_id, mine.history_length,
                     mine.continue_as_new_suggested], "child": child}


def test_ctx_info_names_the_run_its_parent_and_its_journal(weft_env):
    handle = weft.start(parent_info, workflow_id="wc-parent")
    result = handle.result()
    assert result["mine"] == ["wc-parent", None, 1, False]
    assert result["child"] == {"workflow_id": "wc-child", "parent": "wc-parent", "parent_run_id": str(handle.run_id),
                               "attempt": 1, "history": 0, "schedule": None, "scheduled_for": None}


@weft.workflow(name="wc.scheduled_info")
def scheduled_info(ctx: weft.Context) -> list:
    return [ctx.info.schedule_id, ctx.info.scheduled_for.isoformat()]


def test_ctx_info_of_a_scheduled_run_names_its_schedule_and_occurrence(weft_env):
    weft.create_schedule("wc-every-minute", scheduled_info, cron="* * * * *")
    weft_env.advance(timedelta(minutes=1))
    run = Workflow.objects.get(workflow_type="wc.scheduled_info")
    assert weft.get_handle(run.workflow_id).result() == ["wc-every-minute", run.scheduled_for.isoformat()]


@weft.workflow(name="wc.listener")
def listener(ctx: weft.Context) -> list:
    return [ctx.wait_for_signal("ping"), ctx.wait_for_signal("ping")]


@weft.workflow(name="wc.sender")
def sender(ctx: weft.Context, target: str) -> list:
    sent = [ctx.signal_workflow(target, "ping", "first"),
            ctx.signal_workflow(target, "ping", "again", signal_id="fixed"),
            ctx.signal_workflow(target, "ping", "duplicate", signal_id="fixed")]
    ctx.sleep(timedelta(seconds=5))  # the run parks and replays: nothing is sent twice
    try:
        ctx.signal_workflow("wc-nobody", "ping")
    except weft.WorkflowNotFound as exc:
        sent.append(str(exc))
    return sent


def test_signal_workflow_signals_another_run_exactly_once(weft_env):
    target = weft.start(listener, workflow_id="wc-target")
    handle = weft.start(sender, "wc-target")
    weft_env.advance(timedelta(seconds=10))
    assert handle.result() == [True, True, False, "no workflow with id 'wc-nobody'; nothing to signal"]
    assert target.result() == ["first", "again"]
    assert Signal.objects.filter(run_id=target.run_id).count() == 2
    steps = WorkflowStep.objects.filter(run_id=handle.run_id, kind="signal_sent")
    assert [s.status for s in steps.order_by("seq")] == ["completed", "completed", "completed", "failed"]


@weft.workflow(name="wc.sender_after_end")
def sender_after_end(ctx: weft.Context, target: str) -> str:
    try:
        ctx.signal_workflow(target, "ping")
    except weft.WorkflowClosed as exc:
        return str(exc)
    return "sent"


@weft.workflow(name="wc.quick")
def quick(ctx: weft.Context) -> str:
    return "done"


def test_signal_workflow_to_a_finished_run_raises_workflow_closed(weft_env):
    assert weft.start(quick, workflow_id="wc-done").result() == "done"
    closer = weft.start(sender_after_end, "wc-done")
    assert "cannot receive signal 'ping'" in closer.result()


buggy_calls: list[int] = []
DEPLOYED = {"fix": False}  # the code the next "deploy" brings


@weft.activity(name="wc.step_once")
def step_once(order_id: int) -> int:
    buggy_calls.append(order_id)
    return order_id


@weft.workflow(name="wc.buggy", on_error="hold")
def buggy(ctx: weft.Context, order: dict) -> int:
    ctx.run(step_once, order["id"])
    price = order.get("price", 10) if DEPLOYED["fix"] else order["price"]  # the bug: "price" may be missing
    return order["quantity"] * price


def test_on_error_hold_holds_a_run_whose_code_raises_and_a_deploy_lets_it_go_on(weft_env):
    buggy_calls.clear()
    DEPLOYED["fix"] = False
    handle = weft.start(buggy, {"id": 7, "quantity": 2})
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "running" and run.lease_owner == "" and run.code_errors == 1
    assert "held: the workflow's code raised KeyError" in run.wait_reason
    assert "test_workflow_code.py:" in run.wait_reason and "in buggy" in run.wait_reason
    weft_env.advance(timedelta(seconds=1))  # tried again after 1 s, then 2 s, 4 s, ...
    assert handle.refresh().code_errors == 2 and handle.status == "running"
    DEPLOYED["fix"] = True  # the fix is deployed and a process starts: held runs are tried again at once
    call_command("weft_maintenance", "--once", stdout=io.StringIO())
    assert handle.result() == 20
    assert buggy_calls == [7], "the activity ran once: each try replays it from the journal"


def test_a_celery_worker_that_starts_wakes_the_held_runs(weft_env):
    pytest.importorskip("celery")
    from celery.signals import worker_ready

    import django_weft.tasks  # noqa: F401 (connects the worker's signals)

    DEPLOYED["fix"] = False
    handle = weft.start(buggy, {"id": 8, "quantity": 3})
    weft_env.drive()
    held = handle.refresh()
    assert held.code_errors == 1 and held.runnable_at > weft_env.now()
    worker_ready.send(sender=None)
    assert handle.refresh().runnable_at == weft_env.now()


def test_on_error_fail_is_the_default_and_bad_values_are_refused(weft_env):
    with pytest.raises(weft.ConfigurationError, match="on_error must be one of fail, hold"):
        weft.workflow(name="wc.bad_on_error", on_error="retry")(lambda ctx: None)


@weft.workflow(name="wc.refuses_on_purpose", on_error="hold")
def refuses_on_purpose(ctx: weft.Context) -> None:
    raise weft.ApplicationError("the order is not payable")


def test_application_error_always_fails_the_run(weft_env):
    handle = weft.start(refuses_on_purpose)
    with pytest.raises(weft.WorkflowFailed, match="not payable"):
        handle.result()
