"""Parallel branches with real processes on PostgreSQL: a run fanning out to 20 activities whose executor
(a ``manage.py weft_maintenance`` process) is SIGKILLed mid-gather completes in a second process with each
branch's result recorded once; the branches that had settled before the kill never run again, the ones in
flight run again.

Half the branches return at once, the others block on a file that only appears after the kill. The run's
attempt pool runs WEFT_MAX_PARALLEL_ACTIVITIES attempts at once, in start order, so which branches settle,
which are in flight and which are still queued when the kill comes follows from that limit; the blocked
ones are spread so that there are some of each.

Like tests/test_processes.py (whose plumbing, tests/procs.py, this module reuses), every test commits its
data (``transaction=True``), every wait is bounded, every subprocess is killed when the test ends, and
failure messages carry the processes' output.
"""

from __future__ import annotations

import signal

import pytest

import django_weft as weft
from django_weft.conf import weft_settings
from django_weft.models import RunStatus, StepStatus, Workflow, WorkflowStep
from tests.procs import SHORT_LEASE, assert_ran_in, journal, outputs, pids_of, wait_until
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrent]

BRANCHES = 20
BLOCKED = frozenset({1, 4, 6, 9, 11, 14, 16, 17, 18, 19})  # the other ten return at once


def expected_at_the_kill(limit: int) -> tuple[list[int], list[int], list[int]]:
    """(settled, in flight, never started) once the first process has done all it can: the pool starts
    attempts in start order, at most ``limit`` at once; a quick one frees its slot, a blocked one keeps it,
    so branch ``i`` starts exactly when fewer than ``limit`` blocked branches come before it."""
    started = [i for i in range(BRANCHES) if len([b for b in BLOCKED if b < i]) < limit]
    settled = [i for i in started if i not in BLOCKED]
    in_flight = [i for i in started if i in BLOCKED]
    queued = [i for i in range(BRANCHES) if i not in started]
    return settled, in_flight, queued


def step_rows(run_id: object) -> list[dict]:
    """Every column of every journal row of the run, in seq order."""
    return [{**row, "result": bytes(row["result"]) if row["result"] is not None else None}
            for row in WorkflowStep.objects.filter(run_id=run_id).order_by("seq").values()]


def test_a_fan_out_whose_executor_is_killed_mid_gather_keeps_every_settled_branch(
        row_locks, maintenance, tmp_path):
    limit = int(weft_settings.MAX_PARALLEL_ACTIVITIES)
    settled, in_flight, queued = expected_at_the_kill(limit)
    assert settled and in_flight, f"WEFT_MAX_PARALLEL_ACTIVITIES={limit} leaves nothing to kill mid-gather"
    gate = tmp_path / "gate"
    handle = weft.start("branchproc.fan_out", {"key": "fan", "n": BRANCHES, "blocked": sorted(BLOCKED),
                                               "gate": str(gate)})
    keys = [f"fan:{i}" for i in range(BRANCHES)]  # marked by each execution of branch i as it begins

    def state() -> str:
        return (f"run: {handle.refresh().status} {handle.refresh().wait_reason!r}\njournal: {journal(handle.run_id)}\n"
                f"executions: {list(Execution.objects.order_by('id').values_list('key', 'pid'))}")

    def completed_seqs() -> list[int]:
        return list(WorkflowStep.objects.filter(run_id=handle.run_id, status=StepStatus.COMPLETED)
                    .order_by("seq").values_list("seq", flat=True))

    def started_blocked() -> list[int]:
        return sorted(i for i in BLOCKED if Execution.objects.filter(key=keys[i]).exists())

    # Branch i is step i + 1 (the gather itself is no step).
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: completed_seqs() == [i + 1 for i in settled] and started_blocked() == in_flight,
               f"the first process to settle branches {settled} and to be inside branches {in_flight}",
               60, [first], describe=state)

    # Mid-gather: the settled branches are committed, one row each; the in-flight ones have no row yet
    # (an activity branch's row is written when it settles); the queued ones have not begun.
    run = Workflow.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.RUNNING and f":{first.pid}:" in run.lease_owner, (run.status, run.lease_owner)
    assert journal(handle.run_id) == [(i + 1, "activity", "branchproc.branch", "completed") for i in settled]
    assert all(pids_of(keys[i]) == [] for i in queued), state()
    first.send(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL, first.output()
    kept = step_rows(handle.run_id)
    assert not Execution.objects.filter(key__endswith=":end").exists(), state()  # nothing passed the gate

    gate.touch()  # the blocked branches pass at once from now on
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "the second process to take the run over and complete it",
               60, [second], describe=state)
    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs([first, second]))

    # The 20 values in order; the settled branches kept the first process's result, the others the second's.
    redone = set(in_flight) | set(queued)
    assert handle.result(timeout=0) == [
        {"index": i, "pid": second.pid if i in redone else first.pid} for i in range(BRANCHES)]
    # Each branch recorded once: one completed row per seq, and the rows committed before the kill are the
    # very rows the run ended with (every column), not rewritten by the second process.
    assert journal(handle.run_id) == [(i + 1, "activity", "branchproc.branch", "completed") for i in range(BRANCHES)]
    rows = step_rows(handle.run_id)
    assert [row for row in rows if row["seq"] - 1 in settled] == kept
    for i in settled:  # never ran again
        assert_ran_in(keys[i], first)
    for i in in_flight:  # cut short by the kill, run again (at least once: once per process here)
        assert_ran_in(keys[i], first, second)
        assert_ran_in(keys[i] + ":end", second)
    for i in queued:  # never begun in the first process
        assert_ran_in(keys[i], second)
        assert_ran_in(keys[i] + ":end", second)
    assert all(len(pids_of(key)) <= 2 for key in keys)
    assert Execution.objects.count() == len(settled) + 2 * len(in_flight) + len(queued) + len(redone)


def test_heartbeat_details_reach_the_next_attempt_after_the_process_died(row_locks, maintenance):
    handle = weft.start("branchproc.resume_after_kill", "hb-kill")
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    assert first.wait(30) == -signal.SIGKILL, first.output()  # the activity killed its own process
    assert journal(handle.run_id) == []  # the attempt never settled
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "the second process to finish the run", 60, [second])
    outcome = handle.result(timeout=0)
    assert outcome == {"resumed_from": {"rows_done": 500}, "pid": second.pid}, outputs([first, second])
    assert_ran_in("hb-kill", first, second)
