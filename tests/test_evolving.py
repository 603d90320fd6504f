"""Evolving workflows with open runs: patches, versions, the replay check before a deploy, exported histories,
continue-as-new, the history limit and poison runs."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, Schedule, Signal, Workflow, WorkflowStep
from django_weft.testing import replay
from tests.testapp import evolving_workflows as ev
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


@pytest.fixture
def deploy():
    """Flip the deployed code; back to deploy 1 afterwards."""
    def switch(version: int) -> None:
        ev.deployed["version"] = version

    yield switch
    ev.deployed["version"] = 1


def replay_check(*args: str) -> tuple[int, str]:
    """(exit code, output) of manage.py weft_replay_check."""
    from io import StringIO

    out = StringIO()
    try:
        call_command("weft_replay_check", *args, stdout=out)
    except CommandError as exc:
        return 1, out.getvalue() + str(exc)
    return 0, out.getvalue()


def kinds(handle) -> list[str]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq").values_list("kind", flat=True))


# --- a deploy, simulated --------------------------------------------------------------------------------


def test_a_deploy_the_replay_check_guards(weft_env, deploy, settings):
    settings.WEFT_STICKY_ROWS = 0  # a deploy restarts the process: no code stays parked across it
    # On deploy 1: runs of both workflows, parked before the change point ("first") and after it ("second").
    runs = {}
    for workflow in ("patched", "unguarded"):
        for where in ("before", "after"):
            handle = weft.start(f"evolve.{workflow}", f"{workflow}-{where}")
            runs[workflow, where] = handle
    weft_env.drive()
    for workflow in ("patched", "unguarded"):
        runs[workflow, "after"].signal("first")
    weft_env.drive()
    assert {h.refresh().wait_reason for h in runs.values()} == {"waiting for signal first",
                                                                 "waiting for signal second"}
    assert replay_check()[0] == 0  # nothing changed yet

    deploy(2)  # step b added: with a patch in one workflow, without in the other
    code, output = replay_check()
    assert code == 1
    lines = [line for line in output.splitlines() if line.startswith("run ")]
    assert len(lines) == 1, output  # exactly the unguarded run that passed the change point
    broken = runs["unguarded", "after"]
    assert str(broken.run_id) in lines[0]
    assert ("step 3: recorded activity 'tests.testapp.evolving_workflows.step', the code asks for activity "
            "'tests.testapp.evolving_workflows.added_step'") in lines[0]
    assert "4 run(s) replayed" in output and "1 would fail" in output
    assert replay_check("--type", "evolve.patched")[0] == 0
    assert not WorkflowStep.objects.filter(kind="patch").exists()  # the check wrote nothing

    # The patched runs complete: the one that had not reached the change takes the new code, the other the old.
    for where in ("before", "after"):
        handle = runs["patched", where]
        handle.signal("first")
        handle.signal("second")
    weft_env.drive()
    assert runs["patched", "before"].result() == ["patched-before:a", "patched-before:b", "patched-before:c"]
    assert runs["patched", "after"].result() == ["patched-after:a", "patched-after:c"]
    assert executions("patched-after:b") == 0
    assert kinds(runs["patched", "before"]) == ["activity", "signal", "patch", "activity", "activity", "signal"]
    # A new run on deploy 2 takes the new code; the unguarded run that the check named fails as it said.
    fresh = weft.start("evolve.patched", "fresh")
    weft_env.drive()
    fresh.signal("first")
    fresh.signal("second")
    weft_env.drive()
    assert fresh.result() == ["fresh:a", "fresh:b", "fresh:c"]
    broken.signal("second")
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match="NonDeterminismError"):
        broken.result()


def test_deprecate_patch_consumes_the_marker_where_a_run_has_one(weft_env, deploy):
    deploy(2)
    marked = weft.start("evolve.patched", "marked")
    weft_env.drive()
    marked.signal("first")
    weft_env.drive()  # records the marker, runs b and c, waits for "second"
    assert "patch" in kinds(marked)
    # The deprecated code replays the marked run: its marker is consumed, nothing is recorded for new runs.
    Workflow.objects.filter(pk=marked.run_id).update(workflow_type="evolve.deprecated")
    assert replay_check()[0] == 0
    fresh = weft.start("evolve.deprecated", "fresh-dep")
    weft_env.drive()
    fresh.signal("first")
    fresh.signal("second")
    weft_env.drive()
    assert fresh.result() == ["fresh-dep:a", "fresh-dep:b", "fresh-dep:c"]
    assert "patch" not in kinds(fresh)


def test_removing_a_patch_call_too_early_names_the_marker(weft_env, deploy):
    deploy(2)
    handle = weft.start("evolve.patched", "early")
    weft_env.drive()
    handle.signal("first")
    weft_env.drive()
    Workflow.objects.filter(pk=handle.run_id).update(workflow_type="evolve.unguarded")  # the patch call removed
    code, output = replay_check()
    assert code == 1 and "recorded patch 'add-b'" in output


def test_a_patch_id_is_checked(weft_env):
    @weft.workflow(name="evolve.bad_patch")
    def bad_patch(ctx: weft.Context) -> bool:
        return ctx.patched("")

    handle = weft.start("evolve.bad_patch")
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match="change_id must be a non-empty string"):
        handle.result()


# --- exported histories -------------------------------------------------------------------------------


def test_an_exported_history_replays_in_a_test(weft_env, deploy, tmp_path):
    handle = weft.start("evolve.unguarded", "exported")
    weft_env.drive()
    handle.signal("first")
    weft_env.drive()
    path = tmp_path / "history.json"
    call_command("weft_export_history", str(handle.run_id), "--output", str(path), stdout=open(tmp_path / "o", "w"))
    history = json.loads(path.read_text())
    assert [s["kind"] for s in history["steps"]] == ["activity", "signal", "activity", "signal"]
    replay(path)  # the code it was recorded with: clean
    deploy(2)
    with pytest.raises(weft.NonDeterminismError, match="step 3") as caught:
        replay(history)
    assert caught.value.seq == 3 and "activity" in caught.value.recorded


def test_export_history_names_an_unknown_run():
    with pytest.raises(CommandError, match="no workflow run"):
        call_command("weft_export_history", "00000000-0000-0000-0000-000000000000")


# --- versions --------------------------------------------------------------------------------------------


def test_new_runs_take_the_highest_version_and_each_run_keeps_its_own(weft_env):
    newest = weft.start("evolve.versioned", "new")
    assert newest.version == 2
    old = weft.start("evolve.versioned", "old")
    Workflow.objects.filter(pk=old.run_id).update(version=1)  # started before version 2 was deployed
    weft_env.drive()
    for handle in (newest, old):
        handle.signal("go")
    weft_env.drive()
    assert newest.result() == "new by version 2" and old.result() == "old by version 1"
    assert executions("new:v2 only") == 1 and executions("old:v2 only") == 0


def test_a_run_whose_version_is_gone_is_held_and_the_system_check_names_it(weft_env):
    handle = weft.start("evolve.versioned", "gone")
    Workflow.objects.filter(pk=handle.run_id).update(version=7)
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.RUNNING and run.finished_at is None  # held, not failed
    assert "version 7 of workflow 'evolve.versioned' is not registered (registered: 1, 2)" in run.wait_reason
    warnings = [w for w in run_checks(databases=["default"]) if w.id == "weft.W003"]
    assert len(warnings) == 1 and "evolve.versioned version 7 (1 open run(s)" in warnings[0].msg
    code, output = replay_check()
    assert code == 1 and "it would be held" in output


def test_a_version_must_be_a_positive_int():
    with pytest.raises(weft.ConfigurationError, match="positive int"):
        weft.workflow(name="evolve.bad_version", version=0)


def test_the_same_version_twice_by_another_function_is_refused():
    with pytest.raises(weft.WorkflowAlreadyRegistered, match=r"version 1 of workflow 'evolve\.versioned'"):
        @weft.workflow(name="evolve.versioned", version=1)
        def impostor(ctx: weft.Context) -> None:
            return None


# --- continue-as-new ----------------------------------------------------------------------------------


def test_continue_as_new_carries_on_with_an_empty_journal_and_unconsumed_signals(weft_env):
    handle = weft.start("evolve.counter", {"total": 0, "every": 3}, workflow_id="counter", tags=["t1"],
                        search_attributes={"plan": "gold"})
    for _ in range(5):
        handle.signal("tick", 2)
    weft_env.drive()
    first = handle.refresh()
    assert first.status == RunStatus.CONTINUED and first.finished_at is not None
    assert Workflow.objects.filter(workflow_id="counter").count() == 2
    second = Workflow.objects.get(restarted_from=first)
    assert (second.tags, second.search_attributes, second.version) == (["t1"], {"plan": "gold"}, 1)
    assert second.decoded_input == {"total": 6, "every": 3, "generation": 1}
    # The two ticks the first run did not consume moved to the second, which took them in order.
    assert Signal.objects.filter(run=second).count() == 2
    assert WorkflowStep.objects.filter(run=second, status="completed").count() == 2
    assert not Signal.objects.filter(run=second, consumed_at__isnull=True).exists()
    weft.signal("counter", "stop")
    weft_env.drive()
    assert handle.result() == {"total": 10, "generation": 1}  # the first run's handle follows the chain
    assert weft.get_handle("counter").run_id == second.pk


def test_a_continued_child_is_waited_for_through_its_chain(weft_env):
    @weft.workflow(name="evolve.parent_of_counter")
    def parent(ctx: weft.Context) -> object:
        return ctx.run_child("evolve.counter", {"total": 0, "every": 1}, workflow_id="child-counter")

    handle = weft.start("evolve.parent_of_counter")
    weft_env.drive()
    weft.signal("child-counter", "tick", 5)
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING  # the child continued; the parent still waits
    weft.signal("child-counter", "stop")
    weft_env.drive()
    assert handle.result() == {"total": 5, "generation": 1}


def test_a_schedule_sees_a_chain_as_one_open_run(weft_env):
    schedule = weft.create_schedule("ticker", "evolve.counter", {"total": 0, "every": 1}, every=60,
                                    overlap="skip")
    weft_env.advance(timedelta(seconds=60))
    first = Workflow.objects.get(schedule=schedule)
    weft.signal(first.workflow_id, "tick", 1)
    weft_env.drive()
    assert Workflow.objects.get(pk=first.pk).status == RunStatus.CONTINUED
    following = Workflow.objects.get(restarted_from=first)
    assert following.schedule_id == schedule.pk
    assert Schedule.objects.get(pk=schedule.pk).current_run_id == following.pk
    weft_env.advance(timedelta(seconds=60))  # the next occurrence: the chain is open, so it is skipped
    assert Workflow.objects.filter(schedule=schedule).count() == 2


# --- the history limit ----------------------------------------------------------------------------------


@override_settings(WEFT_MAX_HISTORY=5)
def test_the_step_that_would_pass_the_history_limit_times_the_run_out(weft_env):
    handle = weft.start("evolve.long", 8)
    weft_env.drive()
    run = handle.refresh()
    assert (run.status, run.termination_reason, run.failure_category) == (
        RunStatus.TIMED_OUT, "history_limit", "timeout")
    assert "WEFT_MAX_HISTORY (5 rows) at step 6" in run.error["message"]
    assert WorkflowStep.objects.filter(run_id=handle.run_id).count() == 5
    with pytest.raises(weft.WorkflowTimedOut):
        handle.result()


@override_settings(WEFT_MAX_HISTORY=5)
def test_a_run_within_the_history_limit_completes(weft_env):
    handle = weft.start("evolve.long", 5)
    weft_env.drive()
    assert handle.result() == 5


# --- poison runs ----------------------------------------------------------------------------------------


@override_settings(WEFT_MAX_RECOVERY_ATTEMPTS=3)
def test_a_run_whose_executors_keep_dying_at_one_step_fails_as_a_system_failure(weft_env):
    handle = weft.start("evolve.crashes", "poison")
    for _ in range(3):
        with pytest.raises(ev.Crash):
            weft_env.drive()
        Workflow.objects.filter(pk=handle.run_id).update(runnable_at=weft_env.now())  # its lease, expired
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.FAILED and run.failure_category == "system"
    assert "taken over 3 times at step 2 without progress" in run.error["message"]
    assert executions("poison") == 3 and executions("poison:before") == 1
    assert handle.failure_category == "system"


def test_a_handle_of_a_run_that_continued_signals_its_successor(weft_env):
    handle = weft.start("evolve.counter", {"total": 0, "every": 1}, workflow_id="follow")
    handle.signal("tick", 1)
    weft_env.drive()
    assert handle.refresh().status == RunStatus.CONTINUED
    assert handle.signal("tick", 4)  # the old handle: the chain's open run takes it
    handle.signal("stop")
    weft_env.drive()
    assert handle.result() == {"total": 5, "generation": 2}


def test_the_replay_check_passes_runs_parked_in_branches_retries_and_async_waits(weft_env):
    parked = [weft.start("branches.approval", 2), weft.start("branches.activity_and_timer", "rc-t"),
              weft.start("branches.retrying_branch", "rc-r"), weft.start("branches.async_branch", "rc-a"),
              weft.start("test.async", "rc-seq")]
    weft_env.drive()
    assert all(h.refresh().status == RunStatus.WAITING for h in parked)
    code, output = replay_check()
    assert code == 0, output
    assert "5 run(s) replayed" in output
    assert executions("rc-t") == 1  # nothing was executed again
