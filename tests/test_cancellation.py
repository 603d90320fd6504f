"""Cancellation delivered to workflow code (design 9.2): handle.cancel() is a request, the code sees
weft.CancelledError where it waits (or at its next durable call), cleans up inside ``with ctx.cleanup():`` within
its cleanup_timeout, and a saga compensates in reverse order."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connections

import django_weft as weft
from django_weft.models import RunStatus, StepStatus, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)

# What the activities of this module did, in order (runs are driven in this process).
done: list[str] = []


@pytest.fixture(autouse=True)
def _clear():
    done.clear()
    yield
    done.clear()


@weft.activity(name="cx.step")
def step(label: str) -> str:
    done.append(label)
    return label


@weft.activity(name="cx.undo")
def undo(label: str) -> str:
    done.append(f"undo {label}")
    return f"undo {label}"


@weft.workflow(name="cx.reserve", cleanup_timeout=timedelta(minutes=5))
def reserve(ctx: weft.Context, order: str) -> str:
    saga = ctx.saga()
    try:
        ctx.run(step, f"hold {order}")
        saga.add(undo, f"hold {order}")
        ctx.run(step, f"charge {order}")
        saga.add("cx.undo", f"charge {order}")  # by registered name
        ctx.wait_for_signal("shipped", timeout=timedelta(days=3))
    except weft.CancelledError:
        with ctx.cleanup():
            saga.compensate()
        raise
    return "shipped"


def test_a_cancelled_run_compensates_in_reverse_order_once_and_ends_cancelled(weft_env):
    handle = weft.start(reserve, "o1")
    weft_env.drive()
    assert handle.status == RunStatus.WAITING and not handle.cancel_requested
    assert handle.cancel("customer asked") is True
    assert handle.cancel_requested and handle.status == RunStatus.WAITING  # a request: the code runs the cleanup
    assert handle.cancel("again") is False, "a second cancel changes nothing: the first reason stands"
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.CANCELLED
    assert run.failure_category == "cancellation" and run.termination_reason == "cancel_requested"
    assert run.error["message"] == "customer asked"
    assert done == ["hold o1", "charge o1", "undo charge o1", "undo hold o1"]
    with pytest.raises(weft.WorkflowCancelled, match="customer asked"):
        handle.result()
    kinds = list(WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq").values_list("name", "status"))
    assert kinds == [("cx.step", "completed"), ("cx.step", "completed"), ("shipped", StepStatus.CANCELLED),
                     ("cx.undo", "completed"), ("cx.undo", "completed")]
    weft_env.advance(timedelta(days=4))
    assert len(done) == 4, "nothing runs after the run ended"
    assert handle.cancel() is False
    out = io.StringIO()
    call_command("weft_replay_check", "--type", "cx.reserve", "--since", "2000-01-01", stdout=out)
    assert "1 run(s) replayed" in out.getvalue() and "0 would fail" in out.getvalue(), out.getvalue()


def test_a_run_that_is_not_cancelled_completes_without_compensating(weft_env):
    handle = weft.start(reserve, "o2")
    weft_env.drive()
    weft.signal(handle.workflow_id, "shipped")
    assert handle.result() == "shipped"
    assert done == ["hold o2", "charge o2"]


@weft.workflow(name="cx.plain")
def plain(ctx: weft.Context) -> None:
    ctx.run(step, "a")
    try:
        ctx.sleep(timedelta(hours=1))
    finally:
        done.append("finally ran" + (" while parking" if ctx.is_parking else ""))


def test_uncaught_the_run_ends_cancelled_and_its_finally_runs_once_for_real(weft_env, settings):
    settings.WEFT_STICKY_ROWS = 0  # the code unwinds at each park
    handle = weft.start(plain)
    weft_env.drive()
    assert done == ["a", "finally ran while parking"]
    handle.cancel("stop")
    weft_env.drive()
    assert handle.status == RunStatus.CANCELLED
    assert done == ["a", "finally ran while parking", "finally ran"]


@weft.workflow(name="cx.swallow")
def swallow(ctx: weft.Context) -> str:
    try:
        ctx.sleep(timedelta(hours=1))
    except weft.CancelledError:
        pass
    try:
        ctx.run(step, "after the cancel, outside cleanup")
    except weft.CancelledError as exc:
        return f"refused: {exc.reason}"
    return "ran"


def test_outside_cleanup_every_durable_call_raises_the_cancel_again(weft_env):
    handle = weft.start(swallow)
    weft_env.drive()
    handle.cancel("why")
    weft_env.drive()
    assert handle.result() == "refused: why", "code that handles the cancel may still return"
    assert done == []


@weft.workflow(name="cx.slow_cleanup", cleanup_timeout=timedelta(seconds=30))
def slow_cleanup(ctx: weft.Context) -> None:
    try:
        ctx.sleep(timedelta(hours=1))
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.run(step, "cleanup began")
            ctx.sleep(timedelta(minutes=10))
            ctx.run(step, "cleanup ended")
        raise


def test_a_cleanup_past_its_cleanup_timeout_is_terminated(weft_env):
    handle = weft.start(slow_cleanup)
    weft_env.drive()
    handle.cancel()
    weft_env.drive()
    assert handle.status == RunStatus.WAITING and done == ["cleanup began"]
    weft_env.advance(timedelta(minutes=11))
    run = handle.refresh()
    assert run.status == RunStatus.TIMED_OUT and run.termination_reason == "cleanup_timeout"
    assert run.failure_category == "cancellation" and "cleanup_timeout" in run.error["message"]
    assert done == ["cleanup began"]


def test_terminate_stays_the_hard_stop_no_workflow_code_runs(weft_env):
    handle = weft.start(reserve, "o3")
    weft_env.drive()
    handle.terminate("now")
    weft_env.drive()
    assert handle.status == RunStatus.TIMED_OUT and done == ["hold o3", "charge o3"]


def test_a_run_that_has_not_started_is_cancelled_at_once(weft_env):
    handle = weft.start(reserve, "o4", start_after=timedelta(hours=1))
    assert handle.cancel("never mind") is True
    assert handle.status == RunStatus.CANCELLED
    weft_env.advance(timedelta(hours=2))
    assert done == []


@weft.workflow(name="cx.branches")
def branches(ctx: weft.Context) -> None:
    timer = ctx.start_timer(timedelta(hours=1))
    signal = ctx.start_wait_for_signal("go")
    try:
        ctx.gather(timer, signal)
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.run(step, f"timer cancelled: {timer.done}")
            try:
                signal.result()
            except weft.CancelledError:
                ctx.run(step, "the signal branch was cancelled too")
        raise


def test_a_cancel_while_the_code_waits_in_a_gather_cancels_its_branches(weft_env):
    handle = weft.start(branches)
    weft_env.drive()
    handle.cancel()
    weft_env.drive()
    assert handle.status == RunStatus.CANCELLED
    assert done == ["timer cancelled: True", "the signal branch was cancelled too"]
    statuses = dict(WorkflowStep.objects.filter(run_id=handle.run_id, seq__in=[1, 2]).values_list("seq", "status"))
    assert statuses == {1: StepStatus.CANCELLED, 2: StepStatus.CANCELLED}
    weft.signal  # noqa: B018 (the signal branch consumed nothing)


@weft.activity(name="cx.cancel_myself", heartbeat_timeout=30, retry=weft.RetryPolicy(max_attempts=1))
def cancel_myself(workflow_id: str) -> str:
    def request() -> None:
        try:
            weft.cancel(workflow_id, "from outside, while an activity runs")
        finally:
            connections.close_all()

    thread = threading.Thread(target=request)
    thread.start()
    thread.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        weft.heartbeat()  # raises ActivityCancelled once the engine asks the attempt to stop
        time.sleep(0.05)
    done.append("the attempt was never asked to stop")
    return "finished"


@weft.workflow(name="cx.running_activity")
def running_activity(ctx: weft.Context) -> None:
    try:
        ctx.run(cancel_myself, ctx.workflow_id)
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.run(step, "compensated")
        raise


def test_a_cancel_while_an_activity_runs_asks_it_to_stop_and_the_call_raises(weft_env):
    handle = weft.start(running_activity)
    weft_env.drive()
    assert handle.status == RunStatus.CANCELLED
    assert done == ["compensated"]
    row = WorkflowStep.objects.get(run_id=handle.run_id, seq=1)
    assert row.status == StepStatus.CANCELLED


@weft.workflow(name="cx.parallel_saga")
def parallel_saga(ctx: weft.Context) -> list:
    saga = ctx.saga()
    for label in ("a", "b", "c"):
        ctx.run(step, label)
        saga.add(undo, label)
    return sorted(saga.compensate(parallel=True))


def test_compensate_in_parallel_gathers_the_compensations(weft_env):
    handle = weft.start(parallel_saga)
    assert handle.result() == ["undo a", "undo b", "undo c"]
    assert sorted(done[3:]) == ["undo a", "undo b", "undo c"]


def test_bad_cleanup_timeout_and_unknown_activity_names_are_refused():
    with pytest.raises(weft.ConfigurationError, match="cleanup_timeout"):
        weft.workflow(name="cx.bad", cleanup_timeout=-1)(lambda ctx: None)

    @weft.workflow(name="cx.unknown_activity")
    def unknown(ctx: weft.Context) -> None:
        ctx.run("cx.no_such_activity")

    handle = weft.start(unknown)
    with pytest.raises(weft.WorkflowFailed, match=r"no activity is registered as 'cx\.no_such_activity'"):
        weft.run_maintenance()
        handle.result(timeout=5)



@weft.workflow(name="cx.sleepy_cleanup", cleanup_timeout=timedelta(minutes=5))
def sleepy_cleanup(ctx: weft.Context) -> None:
    ctx.set_query_handler("cleaning", lambda: ctx.cancel_requested)
    try:
        ctx.wait_for_signal("never")
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.sleep(timedelta(minutes=1))
        raise


def test_the_admin_and_weft_runs_show_a_run_that_cleans_up(weft_env, admin_client):
    handle = weft.start(sleepy_cleanup)
    weft_env.drive()
    handle.cancel("stop it")
    weft_env.drive()
    assert handle.status == RunStatus.WAITING and handle.cancel_requested
    page = admin_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
    assert "cancel requested: cleaning up" in page
    assert "cancel requested: cleaning up" in admin_client.get("/admin/django_weft/workflow/").content.decode()
    out = io.StringIO()
    call_command("weft_runs", "show", str(handle.run_id), "--json", stdout=out)
    shown = json.loads(out.getvalue())["run"]
    assert shown["cancel_reason"] == "stop it" and shown["cancel_requested_at"]
    assert handle.query("cleaning") is True, "a query replays the run to its cleanup"
    out = io.StringIO()
    call_command("weft_replay_check", "--type", "cx.sleepy_cleanup", stdout=out)
    assert "1 run(s) replayed" in out.getvalue() and "0 would fail" in out.getvalue(), out.getvalue()
    weft_env.advance(timedelta(minutes=1))
    assert handle.status == RunStatus.CANCELLED
    page = admin_client.get(f"/admin/django_weft/workflow/{handle.run_id}/change/").content.decode()
    assert "cleaning up" not in page
