"""Where continue-as-new, patches and the replay check meet the rest of the engine (each was a bug once)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, Workflow, WorkflowStep
from tests.testapp import evolving_edge_workflows as wf

pytestmark = pytest.mark.django_db


def check():
    out = StringIO()
    try:
        call_command("weft_replay_check", stdout=out)
    except CommandError as exc:
        return 1, out.getvalue() + str(exc)
    return 0, out.getvalue()


def test_patched_is_false_in_a_gap_an_unsettled_branch_left(weft_env):
    wf.state["v"] = 1
    h = weft.start("evolve_edge.gap", "g")
    weft_env.drive()
    assert h.refresh().wait_reason == "waiting for signal go"
    # what a crash leaves while 'slow' (seq 1) runs and 'fast' (seq 2) settled and committed
    WorkflowStep.objects.filter(run_id=h.run_id, seq__in=[1, 3]).delete()
    Workflow.objects.filter(pk=h.run_id).update(status="running", lease_owner="dead", runnable_at=weft_env.now())
    wf.state["v"] = 2
    code, out = check()
    assert code == 0, out  # the old path replays: the patch is not taken in the gap
    weft_env.drive()
    run = h.refresh()
    wf.state["v"] = 1
    assert run.status == RunStatus.WAITING, run.error


def test_a_signal_id_deduplicates_across_a_continuation(weft_env):
    h = weft.start("evolve.counter", {"total": 0, "every": 1}, workflow_id="dd")
    assert h.signal("tick", 2, signal_id="s1")
    weft_env.drive()
    assert h.refresh().status == RunStatus.CONTINUED
    again = weft.signal("dd", "tick", 2, signal_id="s1")  # the sender's retry of the same signal
    weft.signal("dd", "stop")
    weft_env.drive()
    assert again is False


def test_start_or_signal_by_idempotency_key_signals_the_chain(weft_env):
    r = weft.start_or_signal("evolve.counter", {"total": 0, "every": 1}, signal="tick", payload=1,
                             idempotency_key="k1")
    weft_env.drive()
    assert r.handle.refresh().status == RunStatus.CONTINUED
    again = weft.start_or_signal("evolve.counter", {"total": 0, "every": 1}, signal="tick", payload=1,
                                 idempotency_key="k1")
    assert again.outcome == "signalled" and again.handle.run_id != r.handle.run_id  # the chain's open run


def test_an_old_handle_cancels_the_chain(weft_env):
    h = weft.start("evolve.counter", {"total": 0, "every": 1}, workflow_id="hc")
    h.signal("tick", 1)
    weft_env.drive()
    assert h.refresh().status == RunStatus.CONTINUED
    assert h.cancel("stop it")  # the old handle cancels the chain's open run
    weft_env.drive()
    assert not Workflow.objects.open().filter(workflow_id="hc").exists()


def test_a_race_loser_child_that_continued_is_cancelled_through_its_chain(weft_env):
    weft.start("evolve_edge.race_child")
    weft_env.drive()
    weft.signal("rc-child", "tick", 1)
    weft_env.drive()
    weft_env.advance(timedelta(seconds=61))
    assert not Workflow.objects.open().filter(workflow_id="rc-child").exists()


def test_a_cancel_request_holds_for_the_chain(weft_env):
    @weft.workflow(name="evolve_edge.parent_rc")
    def parent(ctx):
        ctx.start_child("evolve_edge.continuing_child", 0, workflow_id="crc", parent_close_policy="request_cancel")
        ctx.wait_for_signal("never")
    weft.start("evolve_edge.parent_rc")
    weft_env.drive()
    assert not Workflow.objects.open().filter(workflow_id="crc").exists()


def test_a_parent_waits_through_a_chain_whose_first_run_retention_deleted(weft_env):
    h = weft.start("evolve.parent_of_counter2") if False else None
    @weft.workflow(name="evolve_edge.parent_of_counter")
    def parent(ctx):
        return ctx.run_child("evolve.counter", {"total": 0, "every": 1}, workflow_id="ret-child")
    h = weft.start("evolve_edge.parent_of_counter")
    weft_env.drive()
    weft.signal("ret-child", "tick", 5)
    weft_env.drive()
    weft_env.advance(timedelta(days=8))  # WEFT_RETENTION["continued"] is 7 days
    weft.signal("ret-child", "stop")
    weft_env.drive()
    assert h.refresh().status == RunStatus.COMPLETED


def test_the_replay_check_reports_an_open_run_whose_code_raises_while_replaying(weft_env):
    wf.state["v"] = 1
    h = weft.start("evolve_edge.bad_read")
    weft_env.drive()
    wf.state["v"] = 2
    code, output = check()
    assert "its code raises TypeError" in output
    h.signal("go")
    weft_env.drive()
    wf.state["v"] = 1
    assert code == 1


def test_the_replay_check_of_a_parked_run_past_a_lowered_history_limit(weft_env):
    @weft.workflow(name="evolve_edge.long_wait")
    def lw(ctx):
        for _ in range(6):
            ctx.now()
        ctx.wait_for_signal("go")
    weft.start("evolve_edge.long_wait")
    weft_env.drive()
    with override_settings(WEFT_MAX_HISTORY=5):
        code, out = check()
    assert code == 0, out  # past the limit, but every step up to where it waits is recorded: no new step


def test_the_replay_check_reports_a_running_run_whose_next_step_passes_the_history_limit(weft_env):
    @weft.workflow(name="evolve_edge.long_wait2")
    def lw(ctx):
        for _ in range(6):
            ctx.now()
        ctx.wait_for_signal("go")
    h = weft.start("evolve_edge.long_wait2")
    weft_env.drive()
    # the run is RUNNING right now, between its 6th step and its next one
    WorkflowStep.objects.filter(run_id=h.run_id, seq=7).delete()
    Workflow.objects.filter(pk=h.run_id).update(status="running", lease_owner="w1")
    with override_settings(WEFT_MAX_HISTORY=6):
        code, out = check()
    assert code == 1 and "would time out" in out


def test_an_old_handle_suspends_the_chain(weft_env):
    h = weft.start("evolve.counter", {"total": 0, "every": 1}, workflow_id="sus")
    h.signal("tick", 1)
    weft_env.drive()
    assert h.refresh().status == RunStatus.CONTINUED
    h.suspend()  # the chain's open run is suspended
    assert list(Workflow.objects.filter(workflow_id="sus").values_list("status", flat=True).order_by("status")) == [
        RunStatus.CONTINUED, RunStatus.SUSPENDED]
