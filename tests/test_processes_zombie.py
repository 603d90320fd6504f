"""The zombie executor: a ``manage.py weft_maintenance`` process frozen (SIGSTOP) past its lease while a
second process takes its run over and completes it, then resumed (SIGCONT). The fence must refuse
everything the zombie tries to write, and it must start no further activity; it must then carry on as a
healthy executor.

SIGSTOP freezes every thread of the process, so its lease heartbeat stops too and the lease really runs
out, as in a long GC pause, a VM migration or a laptop lid. Two freezes: inside an activity (the test
sends SIGSTOP while the activity blocks on a file), and between steps (the workflow code stops its own
process right after an activity returned, before that step's result is committed: deterministic).

Like tests/test_processes.py (whose plumbing, tests/procs.py, this module reuses), every test commits its
data (``transaction=True``), every wait is bounded, every subprocess is killed when the test ends (SIGKILL
ends a stopped process too), and failure messages carry the processes' output. PostgreSQL only.
"""

from __future__ import annotations

import ast
import re
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import django_weft as weft
from django_weft.models import AsyncActivity, RunStatus, Signal, Timer, Workflow, WorkflowStep
from tests.procs import SHORT_LEASE, Proc, assert_ran_in, journal, outputs, pids_of, wait_until
from tests.testapp.models import Execution
from tests.testapp.workflows import executions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrent]

LEASE_SECONDS = float(SHORT_LEASE["WEFT_LEASE_SECONDS"])


# --- helpers ---------------------------------------------------------------------------------------------


def is_frozen(proc: Proc) -> bool:
    """Every thread of the process is stopped by a signal (state T in /proc/<pid>/task/*/stat)."""
    try:
        states = [stat.read_text().rsplit(")", 1)[1].split()[0]
                  for stat in Path(f"/proc/{proc.pid}/task").glob("*/stat")]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def run_row(run_id: object) -> dict:
    """Every column of the run, to compare before and after the zombie wakes."""
    return Workflow.objects.filter(pk=run_id).values().get()


def journal_rows(run_id: object) -> list[dict]:
    return [{**row, "result": bytes(row["result"]) if row["result"] is not None else None}
            for row in WorkflowStep.objects.filter(run_id=run_id).order_by("seq").values()]


def others(run_id: object) -> tuple[int, int, int]:
    return (Timer.objects.filter(run_id=run_id).count(), Signal.objects.filter(run_id=run_id).count(),
            AsyncActivity.objects.filter(run_id=run_id).count())


def execution_rows() -> list[tuple[int, str, int]]:
    return list(Execution.objects.order_by("id").values_list("id", "key", "pid"))


def outcomes_of(proc: Proc) -> dict[str, int]:
    """SIGTERM, a clean exit, and the run outcomes the process counted (its "stopped (...)" line)."""
    proc.send(signal.SIGTERM)
    code = proc.wait(30)
    assert code == 0, f"{proc.name} exited with {code}\n{proc.output()}"
    found = re.search(r"weft_maintenance: stopped \((\{.*\})\)", proc.stdout())
    assert found, proc.output()
    return ast.literal_eval(found.group(1))


def freeze_and_outlive_the_lease(a: Proc, run_id: object, *, send: bool) -> Workflow:
    """Freeze A (``send``: with SIGSTOP from here; else A stops itself) and wait until its lease has expired
    without being renewed; returns the run as A left it."""
    if send:
        a.send(signal.SIGSTOP)
    wait_until(lambda: is_frozen(a), f"{a.name} to be stopped", 30, [a])
    time.sleep(0.2)  # a lease renewal sent just before the stop has landed by now
    held = Workflow.objects.get(pk=run_id)
    assert held.status == RunStatus.RUNNING, (held.status, held.error, a.output())
    assert f":{a.pid}:" in held.lease_owner, (held.lease_owner, a.pid)
    # A renews every WEFT_HEARTBEAT_SECONDS while it runs; frozen, it cannot: the lease simply runs out.
    wait_until(lambda: timezone.now() > held.runnable_at + timedelta(seconds=0.5),
               f"the frozen {a.name}'s lease to expire", LEASE_SECONDS + 10, [a])
    assert run_row(run_id)["runnable_at"] == held.runnable_at, "a frozen process renewed its lease"
    assert is_frozen(a)
    return held


def take_over(maintenance: Callable[..., Proc], handle: weft.WorkflowHandle, a: Proc, held: Workflow) -> Proc:
    """B takes the expired run over and completes it; then B stops cleanly (so only A can execute later)."""
    b = maintenance("b", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "b to take the run over and complete it", 60, [a, b],
               describe=lambda: f"run: {handle.refresh().status}, journal: {journal(handle.run_id)}")
    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs([a, b]))
    assert run.fence == held.fence + 1, (run.fence, held.fence)  # one takeover, then fenced commits only
    assert run.lease_owner == "" and run.runnable_at is None and run.finished_at is not None
    assert is_frozen(a), "a woke up before it was sent SIGCONT"
    assert outcomes_of(b) == {"completed": 1}, b.output()
    return b


def resume_zombie(a: Proc, handle: weft.WorkflowHandle, woke: Callable[[], bool], what: str) -> list[str]:
    """SIGCONT A, let it finish what it was frozen in (``woke``), prove it is not wedged by having it take
    and complete a fresh run, and check it changed nothing of the taken-over run. Returns the keys of the
    executions A made after it woke, other than the fresh run's."""
    before = (run_row(handle.run_id), journal_rows(handle.run_id), others(handle.run_id))
    rows_before = execution_rows()
    last_id = rows_before[-1][0] if rows_before else 0

    a.send(signal.SIGCONT)
    wait_until(lambda: not is_frozen(a), f"{a.name} to resume", 10, [a])
    wait_until(woke, what, 30, [a])
    fresh = weft.start("test.steps", {"key": "zombie-fresh", "count": 2})
    # One executor thread: it can claim the fresh run only once the zombie execution has ended.
    wait_until(lambda: fresh.refresh().is_finished, f"{a.name} to complete a fresh run after waking", 30, [a],
               describe=lambda: f"fresh run: {fresh.refresh().status}")
    assert fresh.refresh().status == RunStatus.COMPLETED, (fresh.refresh().error, a.output())
    assert fresh.result(timeout=0) == ["ZOMBIE-FRESH:0", "ZOMBIE-FRESH:1"]
    assert_ran_in("zombie-fresh:0", a)
    assert_ran_in("zombie-fresh:1", a)

    # Not one write of the zombie got through: the run row (status, result, fence, lease, timestamps), its
    # journal (every column of every step) and its timers, signals and async records are as B left them.
    after = (run_row(handle.run_id), journal_rows(handle.run_id), others(handle.run_id))
    assert after[0] == before[0], f"the zombie changed the run\nbefore: {before[0]}\nafter:  {after[0]}"
    assert after[1] == before[1], f"the zombie changed the journal\nbefore: {before[1]}\nafter:  {after[1]}"
    assert after[2] == before[2], (before[2], after[2])
    assert Workflow.objects.count() == 2  # the run and the fresh one: the zombie started nothing

    new = [row for row in execution_rows() if row[0] > last_id]
    assert {pid for _, _, pid in new} == {a.pid}, new
    # The zombie counted the run as lost (its commit was refused by the fence, or its heartbeat found the
    # fence moved first): nothing raised out of the executor, and it went on to the fresh run.
    assert outcomes_of(a) == {"lost": 1, "completed": 1}, a.output()
    assert "Traceback" not in a.stderr(), a.output()
    return [key for _, key, _ in new if not key.startswith("zombie-fresh:")]


# --- 1. frozen inside an activity ------------------------------------------------------------------------


def test_process_frozen_inside_an_activity_commits_nothing_when_it_wakes(row_locks, maintenance, tmp_path):
    """A is SIGSTOPped while activity 2 blocks; its lease expires; B takes the run over and completes it;
    A, resumed, finishes activity 2 (its body was in flight: at-least-once), but records nothing and runs
    neither activity 3 nor 4."""
    release = tmp_path / "release"
    handle = weft.start("test.zombie.in_activity", {"key": "za", "path": str(release)})
    a = maintenance("a", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: executions("za:2:start") == 1, "a to enter the gate activity", 30, [a])
    assert pids_of("za:1") == [a.pid] and pids_of("za:2:start") == [a.pid]

    held = freeze_and_outlive_the_lease(a, handle.run_id, send=True)
    # Step 1 committed (before activity 2 began); step 2 is in flight in the frozen process.
    assert executions("za:2:end") == 0 and executions("za:3") == 0
    assert [(seq, status) for seq, _, _, status in journal(handle.run_id)] == [(1, "completed")]

    release.touch()  # B's attempt at the gate passes at once; A's is frozen mid-activity
    b = take_over(maintenance, handle, a, held)
    # B replayed step 1 (A's result) and ran the rest itself.
    assert handle.result(timeout=0) == [a.pid, b.pid, b.pid, b.pid]
    steps = journal(handle.run_id)
    assert [(seq, kind, status) for seq, kind, _, status in steps] == [
        (1, "activity", "completed"), (2, "activity", "completed"),
        (3, "activity", "completed"), (4, "activity", "completed"),
    ], steps
    assert_ran_in("za:1", a)
    assert_ran_in("za:2:start", a, b)
    assert_ran_in("za:2:end", b)
    assert_ran_in("za:3", b)
    assert_ran_in("za:4", b)

    woke = resume_zombie(a, handle, lambda: executions("za:2:end") == 2, "a's frozen gate activity to return")
    # After waking, A only finished the activity body it was frozen in; no further activity.
    assert woke == ["za:2:end"], woke
    assert_ran_in("za:1", a)
    assert_ran_in("za:2:end", b, a)
    assert_ran_in("za:3", b)
    assert_ran_in("za:4", b)
    assert handle.result(timeout=0) == [a.pid, b.pid, b.pid, b.pid]


# --- 2. frozen between an activity's return and its commit ----------------------------------------------


def test_process_frozen_before_committing_a_step_commits_nothing_when_it_wakes(row_locks, maintenance):
    """A stops itself right after activity 1 returned, before the step is committed; its lease expires;
    B takes the run over, runs step 1 again (it was never recorded) and completes the run. A, resumed,
    tries to commit its step 1 with its next step: refused; it runs neither activity 2 nor 3."""
    a = maintenance("a", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: "running with" in a.stdout(), "a to start", 30, [a])
    handle = weft.start("test.zombie.between_steps", {"key": "zb", "freeze_pid": a.pid})

    held = freeze_and_outlive_the_lease(a, handle.run_id, send=False)
    assert pids_of("zb:1") == [a.pid] and executions("zb:2") == 0
    assert journal(handle.run_id) == []  # step 1's result exists only in the frozen process's memory

    b = take_over(maintenance, handle, a, held)
    assert handle.result(timeout=0) == [b.pid, b.pid, b.pid]  # the journal holds B's step 1, not A's
    steps = journal(handle.run_id)
    assert [(seq, kind, status) for seq, kind, _, status in steps] == [
        (1, "activity", "completed"), (2, "activity", "completed"), (3, "activity", "completed"),
    ], steps
    assert_ran_in("zb:1", a, b)
    assert_ran_in("zb:2", b)
    assert_ran_in("zb:3", b)

    # A wakes in workflow code, with nothing left to finish: no execution at all until the fresh run.
    woke = resume_zombie(a, handle, lambda: True, "a to wake")
    assert woke == [], woke
    assert_ran_in("zb:1", a, b)
    assert_ran_in("zb:2", b)
    assert_ran_in("zb:3", b)
    assert handle.result(timeout=0) == [b.pid, b.pid, b.pid]
