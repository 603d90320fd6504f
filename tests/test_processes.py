"""The engine's guarantees with real OS processes and threads against a real database.

Each test commits its data (``transaction=True``) so that ``manage.py weft_maintenance`` subprocesses and
extra threads, each on its own connection, see it. Every wait is bounded by a deadline, and every
subprocess is killed when the test ends, whatever happened. Failure messages carry the subprocesses'
output.
"""

import signal
import threading
import time
import traceback
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

import django_weft as weft
from django_weft.models import RunStatus, Timer, Workflow, WorkflowStep
from tests.procs import (
    SHORT_LEASE,
    assert_ran_in,
    journal,
    outputs,
    run_once,
    wait_until,
)
from tests.testapp.models import Execution
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)


def crash_spec(key: str, release: Path, max_wait: float = 60) -> dict:
    return {"key": key, "path": str(release), "max_wait": max_wait}


# --- 1. crash recovery -----------------------------------------------------------------------------------


def test_killed_process_run_is_recovered_by_another_process(row_locks, maintenance, tmp_path):
    """SIGKILL mid-activity: a second process takes the run over once the lease expires and finishes it;
    recorded steps are not executed again, only the step in flight is (at-least-once)."""
    release = tmp_path / "release"
    handle = weft.start("test.crash", crash_spec("crash", release), workflow_id="takeover-crash")
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: executions("crash:start") == 1, "wait_for_file to start in the first process", 30,
               [first])

    first.popen.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL, first.output()
    # The activity in flight committed nothing: only step 1 is recorded and the run is still claimed.
    assert [row[0] for row in journal(handle.run_id)] == [1], journal(handle.run_id)
    assert handle.status == RunStatus.RUNNING
    assert executions("crash:end") == 0

    release.touch()
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "the second process to finish the run", 60, [second],
               describe=lambda: f"run: {handle.refresh().status}, journal: {journal(handle.run_id)}")

    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs([first, second]))
    assert handle.result(timeout=0) == "released"
    assert run.finished_at is not None and run.lease_owner == "" and run.runnable_at is None
    assert Workflow.objects.count() == 1
    steps = journal(handle.run_id)
    assert [(seq, kind, status) for seq, kind, _, status in steps] == [
        (1, "activity", "completed"), (2, "activity", "completed"), (3, "activity", "completed"),
    ], steps
    # Recorded before the crash: never again. In flight at the crash: started twice, finished once.
    assert_ran_in("crash:before", first)
    assert_ran_in("crash:start", first, second)
    assert_ran_in("crash:end", second)
    assert_ran_in("crash:after", second)
    # The takeover was announced (signals.workflow_taken_over, received in the second process).
    assert_ran_in(f"taken_over:{handle.workflow_id}:True", second)


# --- 2. across a process restart ------------------------------------------------------------------------


def test_durable_sleep_survives_a_process_restart(db, tmp_path):
    """One process runs the first half and parks on a durable sleep; a fresh process, after the sleep is
    due, replays the recorded half and runs the rest. Every activity runs exactly once."""
    handle = weft.start("test.steps", {"key": "restart", "count": 4, "sleep": 1.5})
    first = run_once("first", tmp_path)

    run = handle.refresh()
    assert run.status == RunStatus.WAITING, (run.status, run.error, first.output())
    assert run.runnable_at is not None and "sleeping" in run.wait_reason
    assert [executions(f"restart:{i}") for i in range(4)] == [1, 1, 0, 0], first.output()
    assert [kind for _, kind, _, _ in journal(handle.run_id)] == ["activity", "activity", "sleep"]

    due = run.runnable_at
    wait_until(lambda: timezone.now() > due, "the durable sleep to fall due", 30)
    second = run_once("second", tmp_path)

    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs([first, second]))
    assert handle.result(timeout=0) == ["RESTART:0", "RESTART:1", "RESTART:2", "RESTART:3"]
    assert [executions(f"restart:{i}") for i in range(4)] == [1, 1, 1, 1]
    # The first half ran in the first process, the second half in the second one.
    for i, proc in enumerate([first, first, second, second]):
        assert_ran_in(f"restart:{i}", proc)
    steps = journal(handle.run_id)
    assert [(seq, kind, status) for seq, kind, _, status in steps] == [
        (1, "activity", "completed"), (2, "activity", "completed"), (3, "sleep", "completed"),
        (4, "activity", "completed"), (5, "activity", "completed"),
    ], steps
    assert not Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).exists()


# --- 3. several processes at once -----------------------------------------------------------------------


def test_three_processes_share_300_runs_without_duplicates(row_locks, maintenance):
    """Three weft_maintenance processes (two executor threads each) on 300 runs: every run completes once,
    every activity runs once, every run has exactly its three steps, and the work is shared."""
    total, count = 300, 3
    procs = [maintenance(f"proc{i}", "--workers", "2", "--interval", "0.2") for i in range(3)]
    # All three are up before there is any work, so no process can take everything alone by starting first.
    wait_until(lambda: all("running with" in proc.stdout() for proc in procs),
               "the three processes to start", 30, procs)
    with transaction.atomic():  # the runs appear at once, when this commits
        handles = [weft.start("test.steps", {"key": f"many{n}", "count": count}) for n in range(total)]

    open_runs = Workflow.objects.filter(status__in=RunStatus.open_values())
    wait_until(lambda: not open_runs.exists(), f"all {total} runs to finish", 120, procs,
               describe=lambda: f"{open_runs.count()} run(s) still open")

    by_status = dict(Workflow.objects.values_list("status").annotate(n=Count("pk")))
    assert by_status == {RunStatus.COMPLETED: total}, (
        by_status, list(Workflow.objects.exclude(status=RunStatus.COMPLETED).values_list("error")[:3]),
        outputs(procs),
    )
    assert Workflow.objects.count() == total
    for n in (0, total // 2, total - 1):
        assert handles[n].result(timeout=0) == [f"MANY{n}:{i}" for i in range(count)]

    expected_keys = {f"many{n}:{i}" for n in range(total) for i in range(count)}
    counts = dict(Execution.objects.values_list("key").annotate(n=Count("id")))
    assert set(counts) == expected_keys
    duplicated = {key: n for key, n in counts.items() if n != 1}
    assert not duplicated, f"activities executed more than once: {sorted(duplicated.items())[:20]}"

    steps_per_run = dict(WorkflowStep.objects.values_list("run_id").annotate(n=Count("id")))
    assert len(steps_per_run) == total
    wrong = {run_id: n for run_id, n in steps_per_run.items() if n != count}
    assert not wrong, f"runs without exactly {count} steps: {list(wrong.items())[:10]}"
    assert not WorkflowStep.objects.exclude(status="completed").exists()

    pids = set(Execution.objects.values_list("pid", flat=True))
    assert pids <= {proc.pid for proc in procs}, pids
    assert len(pids) > 1, f"only one process did any work: {pids}\n{outputs(procs)}"


# --- 4. concurrent idempotent starts --------------------------------------------------------------------


def test_concurrent_starts_with_one_idempotency_key_make_one_run(row_locks):
    """16 threads start with the same idempotency key at the same moment: one run, one run_id for all."""
    threads_count = 16
    barrier = threading.Barrier(threads_count)
    handles: list[weft.WorkflowHandle] = []
    errors: list[str] = []
    lock = threading.Lock()

    def starter() -> None:
        try:
            connection.ensure_connection()  # connect first, so the starts themselves race
            barrier.wait(timeout=30)
            handle = weft.start("test.steps", {"key": "idem", "count": 1}, idempotency_key="order-42")
            with lock:
                handles.append(handle)
        except BaseException:
            with lock:
                errors.append(traceback.format_exc())
        finally:
            connection.close()

    threads = [threading.Thread(target=starter, name=f"starter-{i}", daemon=True)
               for i in range(threads_count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "starter threads did not finish within 60s"

    assert not errors, "\n".join(errors)
    assert len(handles) == threads_count
    rows = list(Workflow.objects.values_list("run_id", "workflow_id", "idempotency_key"))
    assert len(rows) == 1, rows
    run_id, workflow_id, key = rows[0]
    assert key == "order-42"
    assert {h.run_id for h in handles} == {run_id}
    assert {h.workflow_id for h in handles} == {workflow_id}


# --- 5. graceful shutdown -------------------------------------------------------------------------------


def test_sigterm_finishes_the_current_step_then_hands_the_run_back(row_locks, maintenance, tmp_path):
    """SIGTERM during an activity: the process records that step, gives the run back without starting the
    next step, and exits with 0; another process finishes the run without repeating anything."""
    release = tmp_path / "release"
    handle = weft.start("test.crash", crash_spec("term", release))
    first = maintenance("first", "--interval", "0.2")
    wait_until(lambda: executions("term:start") == 1, "wait_for_file to start", 30, [first])

    first.send(signal.SIGTERM)
    # Only once the process has seen the signal is the activity let go.
    wait_until(lambda: "finishing current steps" in first.stderr(), "the process to acknowledge SIGTERM",
               30, [first])
    release.touch()
    code = first.wait(30)
    assert code == 0, f"exit code {code}\n{first.output()}"

    # The step in flight was recorded once; the next one was not started; the run is runnable, unowned.
    steps = journal(handle.run_id)
    assert [(seq, status) for seq, _, _, status in steps] == [(1, "completed"), (2, "completed")], (
        steps, first.output())
    assert executions("term:end") == 1 and executions("term:after") == 0
    run = handle.refresh()
    assert run.status == RunStatus.RUNNING, (run.status, run.error, first.output())
    assert run.lease_owner == ""
    assert run.runnable_at is not None and run.runnable_at <= timezone.now()

    second = run_once("second", tmp_path)
    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs([first, second]))
    assert handle.result(timeout=0) == "released"
    assert [seq for seq, _, _, _ in journal(handle.run_id)] == [1, 2, 3]
    assert_ran_in("term:before", first)
    assert_ran_in("term:start", first)  # not executed again: its step was recorded
    assert_ran_in("term:end", first)
    assert_ran_in("term:after", second)


@pytest.mark.parametrize("second_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_exits_at_once(row_locks, maintenance, tmp_path, second_signal):
    """After SIGTERM, a second signal ends the process at once, with a non-zero code, without waiting for
    the activity (which would block for a minute) and without recording it."""
    handle = weft.start("test.crash", crash_spec("twice", tmp_path / "never-created", max_wait=60))
    proc = maintenance("proc", "--interval", "0.2")
    wait_until(lambda: executions("twice:start") == 1, "wait_for_file to start", 30, [proc])

    proc.send(signal.SIGTERM)
    wait_until(lambda: "finishing current steps" in proc.stderr(), "the process to acknowledge SIGTERM",
               30, [proc])
    proc.send(second_signal)
    code = proc.wait(15)  # the activity would keep it busy for 60 s
    assert code not in (0, None) and code != -signal.SIGKILL, f"exit code {code}\n{proc.output()}"
    assert executions("twice:end") == 0
    assert [seq for seq, _, _, _ in journal(handle.run_id)] == [1], proc.output()
    assert handle.status == RunStatus.RUNNING  # still leased: recovered when the lease expires


# --- 6. terminate or cancel while an activity runs ------------------------------------------------------


def _inside_an_activity(handle, key: str, tmp_path, act) -> list:
    """Run maintenance in a thread; once it is inside the run's activity, ``act()``; then let the activity
    return. The maintenance reports."""
    release = tmp_path / "release"
    reports: list[weft.MaintenanceReport] = []
    errors: list[str] = []

    def executor() -> None:
        try:
            reports.append(weft.run_maintenance())
        except BaseException:
            errors.append(traceback.format_exc())
        finally:
            connection.close()

    thread = threading.Thread(target=executor, name="executor", daemon=True)
    thread.start()
    try:
        wait_until(lambda: executions(f"{key}:start") == 1 or not thread.is_alive(),
                   "the executor thread to enter wait_for_file", 30, describe=lambda: "\n".join(errors))
        assert thread.is_alive(), f"executor thread ended early: {reports} {errors}"
        act()
    finally:
        release.touch()
        thread.join(45)
    assert not thread.is_alive(), "executor thread still running 45s after the release"
    assert not errors, "\n".join(errors)
    return reports


def test_terminate_from_another_thread_refuses_the_late_step_commit(row_locks, tmp_path):
    """An operator terminates a run while an executor thread is inside an activity: when the activity
    returns, its commit is refused, the run stays terminated and nothing more is recorded."""
    handle = weft.start("test.crash", crash_spec("term", tmp_path / "release", max_wait=30))
    reports = _inside_an_activity(handle, "term", tmp_path, lambda: handle.terminate("operator says stop"))
    # The activity did finish, but its result was not recorded: the executor lost the run.
    assert executions("term:end") == 1
    run = handle.refresh()
    assert (run.status, run.termination_reason) == (RunStatus.TIMED_OUT, "terminated"), (run.status, run.error)
    assert run.runnable_at is None and run.lease_owner == ""
    steps = journal(handle.run_id)
    assert [(seq, status) for seq, _, _, status in steps] == [(1, "completed")], steps
    assert reports[0].outcomes == {"lost": 1}, reports[0]


def test_cancel_from_another_thread_lets_the_step_commit_and_the_next_call_raises(row_locks, tmp_path):
    """An operator cancels a run while an executor thread is inside an activity (which never beats): when the
    activity returns its step commits, and the run's next durable call raises the cancel."""
    handle = weft.start("test.crash", crash_spec("cancel", tmp_path / "release", max_wait=30))
    reports = _inside_an_activity(handle, "cancel", tmp_path, lambda: handle.cancel("operator says stop"))
    assert executions("cancel:end") == 1
    run = handle.refresh()
    assert run.status == RunStatus.CANCELLED, (run.status, run.error, reports)
    assert run.error["type"] == "Cancelled" and run.error["message"] == "operator says stop", run.error
    assert run.runnable_at is None and run.lease_owner == ""
    steps = journal(handle.run_id)
    assert [(seq, status) for seq, _, _, status in steps] == [(1, "completed"), (2, "completed"),
                                                               (3, "cancelled")], steps
    assert reports[0].outcomes == {"cancelled": 1}, reports[0]
    with pytest.raises(weft.WorkflowCancelled):
        handle.result(timeout=0)

    # Nothing picks it up again.
    again = weft.run_maintenance()
    assert again.claimed == 0, again
    assert handle.status == RunStatus.CANCELLED
    assert len(journal(handle.run_id)) == 3
    assert executions("cancel:after") == 0
