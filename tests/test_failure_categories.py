"""Why a run ended (issue 15): every way a run ends other than completed or continued sets its
failure_category (and, where the engine ended it, a termination_reason); every failed step says its category
too; the admin shows both and filters runs by category."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import DataError
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.models import RunStatus, StepKind, StepStatus, Workflow, WorkflowStep
from django_weft.store import transitions
from tests.test_admin import act  # the admin's cancel and retry actions
from tests.testapp import evolving_workflows as ev

pytestmark = pytest.mark.django_db
concurrent = pytest.mark.django_db(transaction=True)

SHAPE = {"step": "a"}  # the code a test 'deploys': which activity fc.changing runs first


@pytest.fixture(autouse=True)
def _first_shape():
    SHAPE["step"] = "a"
    yield
    SHAPE["step"] = "a"


@weft.activity
def fine(key: str) -> str:
    return key


@weft.activity
def other(key: str) -> str:
    return key


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=1))
def broken(key: str) -> None:
    raise ValueError(f"broken {key}")


@weft.activity(retry=weft.RetryPolicy(max_attempts=1), timeout=0.1)
def sluggish(key: str) -> str:
    time.sleep(0.4)
    return key


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def huge(key: str) -> str:
    return key * 2000


@weft.activity(retry=weft.RetryPolicy(max_attempts=1), schedule_to_close_timeout=timedelta(minutes=5))
def ask_outside(key: str) -> str:
    weft.complete_async()


@weft.activity
def cancel_run(workflow_id: str) -> None:
    weft.cancel(workflow_id, reason="from inside a child")


@weft.workflow(name="fc.raises")
def raises(ctx: weft.Context, key: str) -> None:
    ctx.run(fine, key)
    raise RuntimeError(f"the workflow gave up on {key}")


@weft.workflow(name="fc.two_steps")
def two_steps(ctx: weft.Context, key: str) -> list:
    return [ctx.run(fine, key), ctx.run(other, key)]


@weft.workflow(name="fc.activity")
def activity_fails(ctx: weft.Context, key: str) -> None:
    ctx.run(broken, key)


@weft.workflow(name="fc.slow")
def slow(ctx: weft.Context, key: str) -> str:
    return ctx.run(sluggish, key)


@weft.workflow(name="fc.slow_branch")
def slow_branch(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(sluggish, key))


@weft.workflow(name="fc.branch")
def branch(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(broken, key))


@weft.workflow(name="fc.async")
def async_deadline(ctx: weft.Context, key: str) -> str:
    return ctx.run(ask_outside, key)


@weft.workflow(name="fc.huge")
def huge_result(ctx: weft.Context, key: str) -> str:
    return key * 2000


@weft.workflow(name="fc.huge_activity")
def huge_activity(ctx: weft.Context, key: str) -> str:
    return ctx.run(huge, key)


@weft.workflow(name="fc.wait")
def wait(ctx: weft.Context, seconds: float | None = None) -> object:
    return ctx.wait_for_signal("go", timeout=seconds)


@weft.workflow(name="fc.changing")
def changing(ctx: weft.Context, key: str) -> None:
    ctx.run(fine if SHAPE["step"] == "a" else other, key)
    ctx.wait_for_signal("go")


@weft.workflow(name="fc.child")
def child(ctx: weft.Context, spec: dict) -> None:
    if spec.get("cancel"):  # closes its own parent while it executes
        ctx.run(cancel_run, spec["cancel"])
    if spec.get("continue"):
        ctx.continue_as_new({"key": spec["key"]})
    ctx.wait_for_signal("never", timeout=spec.get("timeout"))


@weft.workflow(name="fc.parent")
def parent(ctx: weft.Context, spec: dict) -> object:
    key = spec["key"]
    spec = {**spec, "cancel": key} if spec.get("cancel") else spec
    handle = ctx.start_child("fc.child", spec, workflow_id=f"{key}-child", parent_close_policy=spec["policy"])
    if spec.get("wait"):
        return handle.result()
    if spec.get("race"):
        return ctx.race(handle, ctx.start_timer(60))[0]
    ctx.wait_for_signal("finish")
    return "done"


def ended(handle) -> tuple[str, str, str]:
    run = handle.refresh()
    return run.status, run.failure_category, run.termination_reason


def failed_steps(handle) -> list[tuple[str, str]]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id, status=StepStatus.FAILED)
                .order_by("seq").values_list("kind", "failure_category"))


def child_of(workflow_id: str) -> Workflow:
    return Workflow.objects.get(workflow_id=f"{workflow_id}-child")


# --- application ----------------------------------------------------------------------------------------


def test_a_workflow_exception_is_an_application_failure(weft_env):
    handle = weft.start("fc.raises", "r")
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "application", "")
    assert failed_steps(handle) == []
    assert handle.failure_category == "application"


def test_an_activity_that_fails_after_its_retries_is_an_application_failure(weft_env):
    handle = weft.start("fc.activity", "a")
    weft_env.drive()
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=1)
    assert (step.status, step.failure_category) == (StepStatus.WAITING, "")  # waiting out its backoff
    weft_env.advance(timedelta(seconds=2))
    assert ended(handle) == (RunStatus.FAILED, "application", "")
    assert failed_steps(handle) == [(StepKind.ACTIVITY, "application")]


def test_a_failed_branch_is_an_application_failure(weft_env):
    handle = weft.start("fc.branch", "b")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=2))
    assert ended(handle) == (RunStatus.FAILED, "application", "")
    assert failed_steps(handle) == [(StepKind.ACTIVITY, "application")]


def test_an_operators_retry_clears_the_category(staff_client, weft_env):
    handle = weft.start("fc.raises", "retried")
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "application", "")
    act(staff_client, "retry_selected", [handle.run_id])
    assert ended(handle) == (RunStatus.RUNNING, "", "")


# --- timeout ----------------------------------------------------------------------------------------------


def test_an_activity_that_timed_out_on_its_last_attempt_is_a_timeout(weft_env):
    handle = weft.start("fc.slow", "s")
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "timeout", "")
    assert failed_steps(handle) == [(StepKind.ACTIVITY, "timeout")]


@concurrent
def test_a_branch_that_ran_past_its_timeout_is_a_timeout(weft_env):
    handle = weft.start("fc.slow_branch", "sb")
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "timeout", "")
    assert failed_steps(handle) == [(StepKind.ACTIVITY, "timeout")]


def test_an_async_activity_past_its_schedule_to_close_timeout_is_a_timeout(weft_env):
    handle = weft.start("fc.async", "as")
    weft_env.drive()
    weft_env.advance(timedelta(minutes=6))
    assert ended(handle) == (RunStatus.FAILED, "timeout", "")
    assert failed_steps(handle) == [(StepKind.ACTIVITY, "timeout")]


def test_a_signal_wait_that_timed_out_is_a_timeout(weft_env):
    handle = weft.start("fc.wait", 30)
    weft_env.drive()
    weft_env.advance(timedelta(seconds=31))
    assert ended(handle) == (RunStatus.FAILED, "timeout", "")
    assert failed_steps(handle) == [(StepKind.SIGNAL, "timeout")]


def test_the_execution_timeout_is_a_timeout(weft_env):
    handle = weft.start("fc.wait", execution_timeout=timedelta(minutes=1))
    weft_env.drive()
    weft_env.advance(timedelta(minutes=2))
    assert ended(handle) == (RunStatus.TIMED_OUT, "timeout", "execution_timeout")
    assert handle.failure_category == "timeout"


@override_settings(WEFT_MAX_HISTORY=1)
def test_the_history_limit_is_a_timeout(weft_env):
    handle = weft.start("fc.changing", "h")  # its second step would pass the limit
    weft_env.drive()
    assert ended(handle) == (RunStatus.TIMED_OUT, "timeout", "history_limit")


# --- cancellation -----------------------------------------------------------------------------------------


def test_handle_cancel_and_weft_cancel_are_cancellations(weft_env):
    first = weft.start("fc.wait", workflow_id="c1")
    second = weft.start("fc.wait", workflow_id="c2")
    weft_env.drive()
    assert first.cancel("not needed")
    assert weft.cancel("c2")
    weft_env.drive()  # their code sees the cancel
    assert ended(first) == ended(second) == (RunStatus.CANCELLED, "cancellation", "cancel_requested")


def test_an_admin_cancel_is_a_cancellation(staff_client, weft_env):
    handle = weft.start("fc.wait", workflow_id="c-admin")
    act(staff_client, "cancel_selected", [handle.run_id])
    assert ended(handle) == (RunStatus.CANCELLED, "cancellation", "cancel_requested")


@pytest.mark.parametrize("policy", ["terminate", "request_cancel"])
def test_a_child_its_parent_closed_on_is_a_cancellation(weft_env, policy):
    handle = weft.start("fc.parent", {"key": f"pc-{policy}", "policy": policy}, workflow_id=f"pc-{policy}")
    weft_env.drive()
    handle.signal("finish")
    weft_env.drive()
    assert handle.result() == "done"
    kid = child_of(f"pc-{policy}")
    assert (kid.status, kid.failure_category, kid.termination_reason) == (
        RunStatus.CANCELLED, "cancellation", "parent_closed")


def test_a_cancel_its_parent_requested_while_it_executed_is_a_cancellation(weft_env):
    handle = weft.start("fc.parent", {"key": "pcr", "policy": "request_cancel", "cancel": True}, workflow_id="pcr")
    weft_env.drive()
    assert ended(handle) == (RunStatus.CANCELLED, "cancellation", "cancel_requested")
    kid = child_of("pcr")  # it was executing its activity when the parent closed: its next call saw the cancel
    assert (kid.status, kid.failure_category, kid.termination_reason) == (
        RunStatus.CANCELLED, "cancellation", "parent_closed")
    assert kid.error["message"].startswith("cancel requested: parent run")


def test_a_cancel_its_parent_requested_holds_for_the_childs_next_run(weft_env):
    weft.start("fc.parent", {"key": "pcn", "policy": "request_cancel", "cancel": True, "continue": True},
               workflow_id="pcn")
    weft_env.drive()
    continued = Workflow.objects.get(workflow_id="pcn-child", status=RunStatus.CONTINUED)
    following = Workflow.objects.get(workflow_id="pcn-child", restarted_from=continued)
    assert (continued.failure_category, continued.termination_reason) == ("", "")
    assert (following.status, following.failure_category, following.termination_reason) == (
        RunStatus.CANCELLED, "cancellation", "parent_closed")  # its code saw the cancel when it was claimed
    assert following.error["message"].startswith("cancel requested: parent run")


def test_a_child_whose_branch_lost_a_race_is_a_cancellation(weft_env):
    handle = weft.start("fc.parent", {"key": "race", "policy": "terminate", "race": True}, workflow_id="race")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=61))
    assert handle.result() == 1  # the timer won
    kid = child_of("race")
    assert (kid.status, kid.failure_category, kid.termination_reason) == (
        RunStatus.CANCELLED, "cancellation", "race_lost")
    lost = WorkflowStep.objects.get(run_id=handle.run_id, kind=StepKind.CHILD_RESULT)
    assert (lost.status, lost.failure_category) == (StepStatus.CANCELLED, "cancellation")


def test_a_run_its_schedule_cancels_for_the_next_is_a_cancellation(weft_env):
    schedule = weft.create_schedule("fc-overlap", "fc.wait", every=60, overlap="cancel_other")
    weft_env.advance(timedelta(seconds=150))
    first, *_ = Workflow.objects.filter(schedule=schedule).order_by("scheduled_for")
    assert (first.status, first.failure_category, first.termination_reason) == (
        RunStatus.CANCELLED, "cancellation", "schedule_overlap")


# --- a child's failure, in its parent -----------------------------------------------------------------------


def test_a_parent_failed_by_its_child_takes_the_childs_category(weft_env):
    handle = weft.start("fc.parent", {"key": "pf", "policy": "terminate", "wait": True, "timeout": 30},
                        workflow_id="pf")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=31))
    kid = child_of("pf")
    assert (kid.status, kid.failure_category) == (RunStatus.FAILED, "timeout")  # its signal wait timed out
    assert ended(handle) == (RunStatus.FAILED, "timeout", "")
    assert failed_steps(handle) == [(StepKind.CHILD_RESULT, "timeout")]


# --- resource -----------------------------------------------------------------------------------------------


@override_settings(WEFT_MAX_PAYLOAD_BYTES=1000)
def test_a_result_too_large_to_store_is_a_resource_failure(weft_env):
    handle = weft.start("fc.huge", "x")
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "resource", "payload_too_large")
    activity = weft.start("fc.huge_activity", "y")  # an activity's result: its step fails, and the run with it
    weft_env.drive()
    assert ended(activity) == (RunStatus.FAILED, "resource", "")
    assert failed_steps(activity) == [(StepKind.ACTIVITY, "resource")]


def test_a_step_the_database_refuses_is_a_resource_failure(weft_env, monkeypatch):
    handle = weft.start("fc.two_steps", "db")

    def refuse(*args, **kwargs):
        raise DataError("value too long for type character varying(255)")

    monkeypatch.setattr(transitions, "commit", refuse)  # the commit of step 1, before step 2 runs
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "resource", "database_refused")
    assert "the database refused to store step" in handle.refresh().error["message"]


def test_an_outcome_the_database_refuses_is_a_resource_failure(weft_env, monkeypatch):
    handle = weft.start("fc.wait", 0)  # times out at once: its failure is what the database refuses
    finish = transitions.finish

    def refuse_failures(claim, now, status, **kwargs):
        if kwargs.get("failure_category") == "timeout":
            raise DataError("value too long for type character varying(255)")
        return finish(claim, now, status, **kwargs)

    monkeypatch.setattr(transitions, "finish", refuse_failures)
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "resource", "database_refused")
    assert "the database refused to store the run's failed outcome" in handle.refresh().error["message"]


# --- system ---------------------------------------------------------------------------------------------------


def test_code_that_no_longer_matches_the_journal_is_a_system_failure(weft_env, settings):
    settings.WEFT_STICKY_ROWS = 0  # a deploy restarts the process: no code stays parked across it
    handle = weft.start("fc.changing", "nd")
    weft_env.drive()
    SHAPE["step"] = "b"  # a deploy changed the first step without ctx.patched
    handle.signal("go")
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "system", "non_determinism")
    assert handle.refresh().error["type"] == "django_weft.exceptions.NonDeterminismError"


@override_settings(WEFT_MAX_RECOVERY_ATTEMPTS=2)
def test_a_run_whose_executors_keep_dying_is_a_system_failure(weft_env):
    handle = weft.start("evolve.crashes", "fc-poison")
    for _ in range(2):
        with pytest.raises(ev.Crash):
            weft_env.drive()
        Workflow.objects.filter(pk=handle.run_id).update(runnable_at=weft_env.now())  # its lease, expired
    weft_env.drive()
    assert ended(handle) == (RunStatus.FAILED, "system", "recovery_limit")


# --- completed runs, and the admin -------------------------------------------------------------------------


def test_a_completed_run_has_no_category(weft_env):
    handle = weft.start("fc.wait")
    weft_env.drive()
    handle.signal("go", 1)
    weft_env.drive()
    assert ended(handle) == (RunStatus.COMPLETED, "", "")


RUNS = "admin:django_weft_workflow_changelist"


def test_the_admin_filters_runs_by_category_and_shows_it(staff_client, weft_env):
    slow_run = weft.start("fc.slow", "adm-s", workflow_id="adm-timeout")
    failed = weft.start("fc.raises", "adm-r", workflow_id="adm-application")
    weft.start("fc.wait", workflow_id="adm-open")
    weft_env.drive()
    for query in ("failure_category=timeout", "failure_category__exact=timeout"):
        page = staff_client.get(f"{reverse(RUNS)}?{query}")
        assert page.status_code == 200
        shown = [run.workflow_id for run in page.context["cl"].result_list]
        assert shown == ["adm-timeout"], (query, shown)
    page = staff_client.get(reverse(RUNS))
    assert "failure_category__exact=application" in page.content.decode()  # the filter's choices
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[slow_run.run_id])).content.decode()
    assert "Failure category" in body and "Timeout" in body
    assert "Failed (Timeout)" in body  # the failed step, on the timeline
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[failed.run_id])).content.decode()
    assert "Application" in body


def test_the_admin_shows_the_termination_reason(staff_client, weft_env):
    handle = weft.start("fc.wait", workflow_id="adm-cancel")
    handle.cancel()
    body = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "Termination reason" in body and "cancel_requested" in body and "Cancellation" in body
