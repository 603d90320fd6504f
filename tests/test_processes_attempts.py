"""A takeover is an attempt (design 9.1), with real processes: an activity attempt in flight when its
``weft_maintenance`` is SIGKILLed counts, so the attempt that repeats it has the next number (as
``activity_info().attempt`` and the retry policy see it), and the step keeps its history.

Before the fix, the re-run was attempt 1 again, with nothing saying a side effect may have run twice."""

from __future__ import annotations

import signal

import pytest

import django_weft as weft
from django_weft.models import AttemptOutcome, FailureCategory, RunStatus, StepAttempt, WorkflowStep
from tests.procs import SHORT_LEASE, wait_until
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)


def kill(proc) -> None:
    proc.popen.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def history(handle: weft.WorkflowHandle, seq: int) -> list[tuple[int, str]]:
    return list(StepAttempt.objects.filter(run_id=handle.run_id, seq=seq).order_by("attempt")
                .values_list("attempt", "outcome"))


def test_an_attempt_killed_twice_counts_twice_and_the_step_keeps_its_history(row_locks, maintenance, tmp_path):
    release = tmp_path / "release"
    spec = {"key": "lost", "path": str(release)}
    handle = weft.start("attempts.held", spec)
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: executions("lost:attempt:1") == 1, "attempt 1 to begin", 30, [first])
    kill(first)
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: executions("lost:attempt:2") == 1, "the takeover to begin attempt 2", 60, [second])
    # The lost attempt's row committed before attempt 2 began: a second loss counts too.
    assert history(handle, 2) == [(1, AttemptOutcome.LOST)]
    kill(second)
    release.touch()
    third = maintenance("third", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().status == RunStatus.COMPLETED, "the run to finish", 60, [third])

    assert handle.result(timeout=0) == "lost released at attempt 3"
    assert [executions(f"lost:attempt:{n}") for n in (1, 2, 3, 4)] == [1, 1, 1, 0]
    assert executions("lost:before") == 1
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=2)
    assert (step.status, step.attempt) == ("completed", 3)
    rows = list(StepAttempt.objects.filter(run_id=handle.run_id, seq=2).order_by("attempt"))
    assert [(r.attempt, r.outcome) for r in rows] == [
        (1, AttemptOutcome.LOST), (2, AttemptOutcome.LOST), (3, AttemptOutcome.COMPLETED)]
    assert rows[0].executor.split(":")[1] == str(first.pid)  # host:pid:thread of the executor that died
    assert rows[1].executor.split(":")[1] == str(second.pid)
    assert "lost: executor" in rows[0].error["message"] and "lease expired" in rows[0].error["message"]
    assert rows[2].executor.split(":")[1] == str(third.pid) and rows[2].started_at is not None
    assert WorkflowStep.objects.get(run_id=handle.run_id, seq=1).attempt == 1
    assert history(handle, 1) == []  # a step done on its first try has no attempt rows


def test_a_lost_attempt_counts_against_max_attempts(row_locks, maintenance, tmp_path):
    spec = {"key": "once", "path": str(tmp_path / "never"), "max_wait": 60}
    handle = weft.start("attempts.held_once", spec)
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: executions("once:attempt:1") == 1, "attempt 1 to begin", 30, [first])
    kill(first)
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "the run to finish", 60, [second])

    # max_attempts=1: the one attempt allowed was lost, so the step fails without running the activity again.
    assert handle.result(timeout=0) == {"error_type": "AttemptLost", "attempts": 1}
    assert executions("once:attempt:1") == 1 and executions("once:attempt:2") == 0
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=1)
    assert (step.status, step.attempt, step.failure_category) == ("failed", 1, FailureCategory.SYSTEM)
    assert history(handle, 1) == [(1, AttemptOutcome.LOST)]


def test_each_branch_in_flight_when_its_executor_died_counts_one_lost_attempt(row_locks, maintenance, tmp_path):
    release = tmp_path / "release"
    spec = {"key": "fan", "path": str(release), "branches": 3}
    handle = weft.start("attempts.held_branches", spec)
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: all(executions(f"fan:{i}:attempt:1") == 1 for i in range(3)), "the branches to begin", 30,
               [first])
    kill(first)
    release.touch()
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().status == RunStatus.COMPLETED, "the run to finish", 60, [second])

    assert handle.result(timeout=0) == [f"fan:{i} released at attempt 2" for i in range(3)]
    for seq in (1, 2, 3):
        assert history(handle, seq) == [(1, AttemptOutcome.LOST), (2, AttemptOutcome.COMPLETED)]
