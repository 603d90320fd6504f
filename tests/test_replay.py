"""Replay: recorded steps are returned, never executed again; the code must match the journal."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

import django_weft as weft
from django_weft.models import StepKind, Timer, WorkflowStep
from tests.testapp import workflows as wf
from tests.testapp.workflows import executions


def test_steps_run_once_across_a_durable_sleep(weft_env):
    handle = weft.start("test.steps", {"key": "s", "count": 4, "sleep": 30})
    weft_env.drive()
    assert handle.status == "waiting"
    assert [executions(f"s:{i}") for i in range(4)] == [1, 1, 0, 0]
    timer = Timer.objects.get(run_id=handle.run_id)
    assert timer.purpose == "sleep" and timer.fired_at is None

    weft_env.advance(timedelta(seconds=29))
    assert handle.status == "waiting", "the timer must not fire early"

    weft_env.advance(timedelta(seconds=2))
    assert handle.result() == ["S:0", "S:1", "S:2", "S:3"]
    assert [executions(f"s:{i}") for i in range(4)] == [1, 1, 1, 1]
    steps = list(WorkflowStep.objects.filter(run_id=handle.run_id).values_list("seq", "kind", "status"))
    assert steps == [
        (1, "activity", "completed"), (2, "activity", "completed"), (3, "sleep", "completed"),
        (4, "activity", "completed"), (5, "activity", "completed"),
    ]
    assert Timer.objects.get(run_id=handle.run_id).fired_at is not None


def test_steps_run_once_across_operator_suspend_and_resume(weft_env):
    handle = weft.start("test.steps", {"key": "r", "count": 4, "sleep": 5})
    weft_env.drive()
    handle.suspend("investigating")
    run = handle.refresh()
    assert run.status == "suspended" and run.runnable_at is None and run.wait_reason == "investigating"

    weft_env.advance(timedelta(seconds=60))
    assert handle.status == "suspended", "a suspended run must not execute even when its timer is due"
    assert executions("r:2") == 0

    handle.resume()
    weft_env.drive()
    assert handle.result() == ["R:0", "R:1", "R:2", "R:3"]
    assert [executions(f"r:{i}") for i in range(4)] == [1, 1, 1, 1]


def test_resume_refuses_a_run_that_is_not_suspended(weft_env):
    handle = weft.start("test.long_sleep")
    weft_env.drive()
    with pytest.raises(weft.TransitionNotAllowed, match="not suspended"):
        handle.resume()


def test_finished_runs_cannot_be_suspended(weft_env):
    handle = weft.start("test.steps", {"key": "fin", "count": 1})
    weft_env.drive()
    with pytest.raises(weft.TransitionNotAllowed, match="is completed; it cannot become suspended"):
        handle.suspend()
    assert handle.status == "completed"


def test_deterministic_values_are_recorded_and_replayed(weft_env):
    handle = weft.start("test.values")
    weft_env.drive()
    first = {
        step.kind: step for step in WorkflowStep.objects.filter(run_id=handle.run_id)
    }
    assert set(first) == {StepKind.NOW, StepKind.UUID, StepKind.RANDOM, StepKind.SIDE_EFFECT, StepKind.SLEEP}
    weft_env.advance(timedelta(seconds=11))
    result = handle.result()
    assert isinstance(result["now"], datetime) and result["now"] == weft_env.start_time
    assert isinstance(result["uuid"], uuid.UUID)
    assert 0 <= result["random"] < 1
    # The side effect ran once although the workflow function ran twice (before and after the sleep).
    assert executions("side") == 1
    assert result["side"] == 1


def test_changed_code_raises_non_determinism_error(weft_env, monkeypatch, settings):
    settings.WEFT_STICKY_ROWS = 0  # a deploy restarts the process: no code stays parked across it
    handle = weft.start("test.changing", "nd")
    weft_env.drive()
    assert handle.status == "waiting"
    monkeypatch.setitem(wf.DYNAMIC, "shape", "b")
    weft_env.advance(timedelta(seconds=61))
    run = handle.refresh()
    assert run.status == "failed"
    assert run.error["type"] == "django_weft.exceptions.NonDeterminismError"
    assert "step 1" in run.error["message"]
    assert "activity" in run.error["message"] and "sleep" in run.error["message"]
    with pytest.raises(weft.WorkflowFailed, match="NonDeterminismError"):
        handle.result()


def test_replay_of_recorded_steps_costs_no_query_per_step(weft_env):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    handle = weft.start("test.steps", {"key": "z", "count": 40, "sleep": 5})
    weft_env.drive()
    clock_before = weft_env.now()
    with CaptureQueriesContext(connection) as captured:
        weft_env.advance(timedelta(seconds=6))
    assert weft_env.now() > clock_before
    assert handle.status == "completed"
    step_reads = [q for q in captured.captured_queries
                  if q["sql"].lstrip().upper().startswith("SELECT") and "workflowstep" in q["sql"]]
    assert len(step_reads) == 1, step_reads


def test_sleep_rejects_a_negative_duration(weft_env):
    @weft.workflow(name="test.negative_sleep")
    def negative(ctx):
        ctx.sleep(-1)

    handle = weft.start("test.negative_sleep")
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match=r"ctx\.sleep duration must be >= 0"):
        handle.result()
