"""Signals, signal-with-start and async completions under real concurrency: OS processes and threads on a
real database.

Like tests/test_processes.py (whose subprocess plumbing this module reuses), every test commits its data
(``transaction=True``) so that subprocesses and extra threads, each on its own connection, see it; every
wait is bounded by a deadline; every subprocess is killed when the test ends; failure messages carry the
subprocesses' output. Everything that races runs on PostgreSQL only; the refusal of a completion for a
cancelled run, and the park-window tests (deterministic, driven from one extra thread), run on SQLite too.
"""

import json
import os
import signal as os_signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import AsyncActivity, AsyncStatus, RunStatus, Signal, Timer, Workflow
from django_weft.services import with_start
from django_weft.store import inbox, transitions
from tests.procs import (
    REPO_ROOT,
    SHORT_LEASE,
    Proc,
    journal,
    outputs,
    pids_of,
    run_once,
    wait_until,
)
from tests.testapp import signal_workflows
from tests.testapp.models import Execution
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

RACERS = 16
WORKFLOW_ID = "same"
DEADLINE = 60.0


# --- threads ---------------------------------------------------------------------------------------------


def join_all(threads: list[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread.name for thread in threads if thread.is_alive()]
    assert not stuck, f"threads still running after {timeout}s: {stuck}"


def in_another_thread(action: Callable[[], object], name: str) -> None:
    """Run ``action`` to completion in a new thread with its own connection; fail with its traceback if it
    raised."""
    failures: list[str] = []

    def target() -> None:
        try:
            action()
        except BaseException:
            failures.append(traceback.format_exc())
        finally:
            connection.close()

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    join_all([thread], 30)
    assert not failures, failures[0]


# --- racing callers --------------------------------------------------------------------------------------


def start_or_signal(index: int, count: int, signal_id: str) -> dict:
    """What every racer does: signal-with-start of one "test.collect" run; its payload is its index."""
    result = weft.start_or_signal("test.collect", count, signal="item", payload=index, workflow_id=WORKFLOW_ID,
                                  signal_id=signal_id)
    return {"index": index, "outcome": result.outcome, "run_id": str(result.handle.run_id)}


def race_in_threads(count: int, signal_id: Callable[[int], str]) -> list[dict]:
    """RACERS threads, each on its own connection, call start_or_signal together (released by a barrier)."""
    barrier = threading.Barrier(RACERS)
    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def racer(index: int) -> None:
        try:
            connection.ensure_connection()  # connect first, so the calls themselves race
            barrier.wait(timeout=30)
            outcome = start_or_signal(index, count, signal_id(index))
            with lock:
                results.append(outcome)
        except BaseException:
            with lock:
                errors.append(f"racer {index}:\n{traceback.format_exc()}")
        finally:
            connection.close()

    threads = [threading.Thread(target=racer, args=(i,), name=f"racer-{i}", daemon=True) for i in range(RACERS)]
    for thread in threads:
        thread.start()
    join_all(threads, DEADLINE)
    assert not errors, "\n".join(errors)
    return results


# Run as ``python -c RACER_SCRIPT directory index count signal_id``: set Django up, connect, say "ready",
# wait for the shared "go" file, do what start_or_signal() above does once, print the outcome as JSON.
RACER_SCRIPT = r"""
import json, sys, time
from pathlib import Path

import django

django.setup()
from django.db import connection

import django_weft as weft

directory, index, count, signal_id = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
connection.ensure_connection()
(directory / f"ready-{index}").touch()
go, deadline = directory / "go", time.monotonic() + 60
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit("the go file never appeared")
    time.sleep(0.001)
result = weft.start_or_signal("test.collect", count, signal="item", payload=index, workflow_id="same",
                             signal_id=signal_id)
print(json.dumps({"index": index, "outcome": result.outcome, "run_id": str(result.handle.run_id)}))
"""


def racer_process(index: int, directory: Path, count: int, signal_id: str) -> Proc:
    """One ``python -c RACER_SCRIPT`` subprocess on the test database."""
    # What pytest's `pythonpath` setting gives this process.
    path = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject"), os.environ.get("PYTHONPATH", "")])
    return Proc(f"racer-{index}", directory,
                [sys.executable, "-c", RACER_SCRIPT, str(directory), str(index), str(count), signal_id],
                {"PYTHONPATH": path})


def race_in_processes(directory: Path, count: int, signal_id: Callable[[int], str]) -> list[dict]:
    """RACERS processes call start_or_signal together: all connect and report ready, then one file
    releases them at once."""
    racers: list[Proc] = []
    try:
        for index in range(RACERS):
            racers.append(racer_process(index, directory, count, signal_id(index)))
        wait_until(lambda: all((directory / f"ready-{i}").exists() for i in range(RACERS)),
                   f"the {RACERS} racer processes to connect", DEADLINE, racers)
        (directory / "go").touch()
        deadline = time.monotonic() + DEADLINE
        for racer in racers:
            try:
                racer.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{racer.name} did not finish within {DEADLINE}s\n{outputs(racers)}")
        failed = [racer for racer in racers if racer.popen.returncode != 0]
        assert not failed, f"racer processes failed:\n{outputs(failed)}"
        results = []
        for racer in racers:
            lines = racer.stdout_path.read_text().strip().splitlines()
            assert lines, f"{racer.name} printed nothing\n{racer.output()}"
            results.append(json.loads(lines[-1]))
        return results
    finally:
        for racer in racers:
            racer.kill()


def race(racers: str, directory: Path, count: int, signal_id: Callable[[int], str]) -> list[dict]:
    if racers == "threads":
        return race_in_threads(count, signal_id)
    return race_in_processes(directory, count, signal_id)


def assert_one_run_started_once(results: list[dict]) -> tuple[Workflow, dict]:
    """Every racer answered; exactly one started the one run, all the others signalled it."""
    assert sorted(r["index"] for r in results) == list(range(RACERS)), results
    assert Counter(r["outcome"] for r in results) == {"started": 1, "signalled": RACERS - 1}, results
    runs = list(Workflow.objects.all())
    assert len(runs) == 1, [(r.run_id, r.workflow_id, r.status) for r in runs]
    run = runs[0]
    assert run.workflow_id == WORKFLOW_ID and run.workflow_type == "test.collect"
    assert {r["run_id"] for r in results} == {str(run.run_id)}, results
    [starter] = [r for r in results if r["outcome"] == "started"]
    return run, starter


def drive(racers: str, directory: Path) -> None:
    """Execute the run: in this process after the threads, in a weft_maintenance process after processes."""
    if racers == "threads":
        weft.run_maintenance()
    else:
        run_once("driver", directory)


# --- 1. one signal id: one run, one signal ------------------------------------------------------------


@pytest.mark.parametrize("racers", ["threads", "processes"])
def test_concurrent_start_or_signal_with_one_signal_id_make_one_run_and_one_signal(
        row_locks, tmp_path, racers):
    """16 callers signal-with-start the same workflow id with the same signal id at the same moment: one
    run, one stored signal, one "started" (the others "signalled"), one run_id for all."""
    results = race(racers, tmp_path, 1, lambda index: "same")

    run, starter = assert_one_run_started_once(results)
    signals = list(Signal.objects.all())
    assert [(s.run_id, s.name, s.signal_id) for s in signals] == [(run.run_id, "item", "same")], signals
    # The run and its first signal commit together, so the stored signal is the starter's: every other
    # caller found the run only once that signal was there, and was deduplicated against it.
    assert decode(signals[0].payload) == starter["index"], (signals[0], results)

    drive(racers, tmp_path)
    handle = weft.get_handle(WORKFLOW_ID)
    assert handle.result(timeout=0) == [starter["index"]]
    assert Signal.objects.get().consumed_by_seq == 1


# --- 2. distinct signal ids: one run, every signal delivered once, in arrival order -------------------------


@pytest.mark.parametrize("racers", ["threads", "processes"])
def test_concurrent_start_or_signal_with_distinct_ids_deliver_each_signal_once_in_order(
        row_locks, tmp_path, racers):
    """16 callers with 16 signal ids: one run and 16 signals; the run, waiting for 16 items, receives each
    payload exactly once, in the signals' arrival order, the starter's first."""
    results = race(racers, tmp_path, RACERS, lambda index: f"item-{index}")

    run, starter = assert_one_run_started_once(results)
    signals = list(Signal.objects.filter(run=run).order_by("sequence"))
    assert sorted(s.signal_id for s in signals) == sorted(f"item-{i}" for i in range(RACERS)), signals
    assert Signal.objects.count() == RACERS
    assert len({s.sequence for s in signals}) == RACERS, [s.sequence for s in signals]
    arrival = [decode(s.payload) for s in signals]
    assert sorted(arrival) == list(range(RACERS)), arrival
    assert all(decode(s.payload) == int(s.signal_id.removeprefix("item-")) for s in signals)
    assert arrival[0] == starter["index"], (arrival, starter)  # the start signal comes first

    drive(racers, tmp_path)
    handle = weft.get_handle(WORKFLOW_ID)
    assert handle.result(timeout=0) == arrival
    # Each signal consumed once, by the wait at the journal position matching its place in the order.
    consumed = list(Signal.objects.filter(run=run).order_by("sequence").values_list("consumed_by_seq", flat=True))
    assert consumed == list(range(1, RACERS + 1)), consumed
    steps = journal(run.run_id)
    assert [(seq, kind, status) for seq, kind, _, status in steps] == [
        (seq, "signal", "completed") for seq in range(1, RACERS + 1)
    ], steps


def row_locked_elsewhere(run_id: object) -> bool:
    """Whether another transaction holds the run's row lock: a NOWAIT lock attempt on a new connection."""
    seen: list[bool] = []

    def probe() -> None:
        try:
            with transaction.atomic():
                list(Workflow.objects.select_for_update(nowait=True).filter(pk=run_id).values_list("pk"))
            seen.append(False)
        except OperationalError:  # could not obtain lock
            seen.append(True)

    in_another_thread(probe, "lock-probe")
    return seen[0]


def test_start_or_signal_locks_a_run_that_appears_after_its_locked_lookup(row_locks, monkeypatch):
    """The interleaving behind the race above, made deterministic: another caller's start commits just
    after this caller's locked lookup found no open run. This caller then signals that run, and must do
    so holding its row lock (the signal's arrival sequence is the run's inbox_seq + 1, read and written
    under that lock), which a NOWAIT lock attempt from another connection checks."""
    real_lookup, real_deliver = with_start.lock_open_run, inbox.deliver_signal
    interleaved: list[bool] = []
    locked_while_delivering: list[bool] = []

    def lookup(workflow_id: str) -> Workflow | None:
        found = real_lookup(workflow_id)
        if found is None and not interleaved:
            interleaved.append(True)
            in_another_thread(lambda: start_or_signal(0, 2, "item-0"), "first-caller")
        return found

    def deliver(run: Workflow, name: str, payload: bytes, signal_id: str | None, now: Any) -> bool:
        if signal_id == "item-1":
            locked_while_delivering.append(row_locked_elsewhere(run.pk))
        return real_deliver(run, name, payload, signal_id, now)

    monkeypatch.setattr(with_start, "lock_open_run", lookup)
    monkeypatch.setattr(inbox, "deliver_signal", deliver)

    second = start_or_signal(1, 2, "item-1")

    assert interleaved and second["outcome"] == "signalled", second
    assert locked_while_delivering == [True], "the signal was delivered without the run's row lock"
    run = Workflow.objects.get()
    assert run.inbox_seq == 2
    signals = list(Signal.objects.order_by("sequence").values_list("sequence", "signal_id"))
    assert signals == [(1, "item-0"), (2, "item-1")], signals


# --- 3. SIGKILL between a signal's commit and the run's resumption -----------------------------------------


class LockHolder:
    """Holds a PostgreSQL lock (``sql``) in its own thread's open transaction until :meth:`release`, so a
    process that needs it blocks at a known point."""

    def __init__(self, sql: str, params: list[Any]) -> None:
        self.sql, self.params = sql, params
        self.backend_pid: int | None = None
        self.error: str | None = None
        self._locked = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="lock-holder", daemon=True)

    def _hold(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.backend_pid = cursor.fetchone()[0]
                cursor.execute(self.sql, self.params)
                self._locked.set()
                self._release.wait(DEADLINE)
        except BaseException:
            self.error = traceback.format_exc()
        finally:
            self._locked.set()
            connection.close()

    def __enter__(self) -> "LockHolder":
        self._thread.start()
        assert self._locked.wait(30), "the lock holder did not take its lock within 30s"
        assert self.error is None, self.error
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the lock holder did not let go within 30s"

    def __exit__(self, *exc: object) -> None:
        self.release()


def backends_blocked_by(pid: int) -> list[tuple[int, str]]:
    """(pid, query) of the server processes waiting for a lock that backend ``pid`` holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, query FROM pg_stat_activity "
                       "WHERE wait_event_type = 'Lock' AND %s = ANY(pg_blocking_pids(pid))", [pid])
        return list(cursor.fetchall())


def backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] > 0


def approval_state(run_id: object) -> dict:
    """What a crash must not change: the journal, the signal's consumption, what ran."""
    return {
        "journal": [(seq, kind, status) for seq, kind, _, status in journal(run_id)],
        "consumed_by_seq": list(Signal.objects.filter(run_id=run_id).values_list("consumed_by_seq", flat=True)),
        "after": executions("crash:after"),
    }


@pytest.mark.postgres  # LockHolder and the blocked backend: pg_stat_activity, pg_terminate_backend
@pytest.mark.parametrize("kill_point", ["before_consume", "after_consume"])
def test_sigkill_after_the_signal_commits_and_before_the_run_resumes_loses_nothing(
        postgres_only, maintenance, tmp_path, kill_point):
    """The signal commits while no process runs; a weft_maintenance process claims the woken run and is
    SIGKILLed mid-resumption, either while committing the signal's consumption (before_consume) or right
    after that commit, as the next activity starts (after_consume). A lock held by the test stops the
    process at exactly that point. A second process (short lease) finishes the run: the signal is consumed
    exactly once and nothing that was recorded runs again."""
    handle = weft.start("test.approval", "crash")
    first_pass = weft.run_maintenance()
    assert first_pass.outcomes == {"waiting": 1}, first_pass
    assert executions("crash:before") == 1

    assert weft.signal(handle.workflow_id, "approval", {"approved": "yes"},
                       signal_id="decision-1") is True
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and run.runnable_at is not None and run.runnable_at <= timezone.now()
    sent = Signal.objects.get(run_id=handle.run_id)
    assert sent.consumed_at is None

    if kill_point == "before_consume":
        # The consumption is an UPDATE of the signal row inside the step commit's transaction.
        lock_sql, lock_params, blocked_table = (
            f'SELECT 1 FROM "{Signal._meta.db_table}" WHERE "id" = %s FOR UPDATE', [sent.pk], Signal._meta.db_table)
        expected = {"journal": [(1, "activity", "completed"), (2, "signal", "waiting")],
                    "consumed_by_seq": [None], "after": 0}
    else:
        # The consumption has committed; the ":after" activity's first write (its Execution row) waits.
        lock_sql, lock_params, blocked_table = (
            f'LOCK TABLE "{Execution._meta.db_table}" IN EXCLUSIVE MODE', [], Execution._meta.db_table)
        expected = {"journal": [(1, "activity", "completed"), (2, "signal", "completed")],
                    "consumed_by_seq": [2], "after": 0}

    with LockHolder(lock_sql, lock_params) as holder:
        first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)

        def blocked() -> list[tuple[int, str]]:
            return [row for row in backends_blocked_by(holder.backend_pid) if blocked_table in row[1]]

        wait_until(blocked, "the first process to block on the lock", 30, [first],
                   describe=lambda: str(approval_state(handle.run_id)))
        [(blocked_pid, _)] = blocked()
        run = handle.refresh()
        assert run.status == RunStatus.RUNNING and f":{first.pid}:" in run.lease_owner, (
            run.status, run.lease_owner, first.output())
        assert approval_state(handle.run_id) == expected, first.output()

        first.popen.send_signal(os_signal.SIGKILL)
        assert first.wait(10) == -os_signal.SIGKILL, first.output()
        # The dead client's statement still waits on the server; end it as its disconnect would have, so
        # it cannot complete when the lock goes.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [blocked_pid])
        wait_until(lambda: not backend_alive(blocked_pid), "the killed process's server backend to end", 30)

    # The crash lost nothing and repeated nothing; the run is still claimed by the dead process.
    assert approval_state(handle.run_id) == expected
    run = handle.refresh()
    assert run.status == RunStatus.RUNNING and f":{first.pid}:" in run.lease_owner

    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "the second process to finish the run", DEADLINE, [second],
               describe=lambda: f"run: {handle.refresh().status}, state: {approval_state(handle.run_id)}")

    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs([first, second]))
    assert handle.result(timeout=0) == {"approved": "yes"}
    assert approval_state(handle.run_id) == {
        "journal": [(1, "activity", "completed"), (2, "signal", "completed"), (3, "activity", "completed")],
        "consumed_by_seq": [2],
        "after": 1,
    }, outputs([first, second])
    assert pids_of("crash:before") == [os.getpid()]  # recorded before the crash: never again
    assert pids_of("crash:after") == [second.pid]
    assert Signal.objects.count() == 1 and Workflow.objects.count() == 1
    assert not Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).exists()


# --- 4. an arrival while the executor is between reading and parking ----------------------------------------


class ArrivalBeforePark:
    """Wraps ``transitions.park``: the first time ``run_id`` parks (once armed), ``arrive`` commits from
    another thread first — the executor has read that nothing is there and is about to park — and right
    after the real park the run's row is read back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, run_id: object, arrive: Callable[[], object]) -> None:
        self.run_id, self.arrive = run_id, arrive
        self.real_park = transitions.park
        self.armed = False
        self.fired = 0
        self.after_park: dict | None = None
        self.checked_at = None
        monkeypatch.setattr(transitions, "park", self)

    def __call__(self, claim: transitions.Claim, now: Any, **kwargs: Any) -> None:
        if not self.armed or self.fired or claim.run.pk != self.run_id:
            return self.real_park(claim, now, **kwargs)
        self.fired += 1
        in_another_thread(self.arrive, "arrival")
        self.real_park(claim, now, **kwargs)
        self.after_park = Workflow.objects.filter(pk=self.run_id).values(
            "status", "runnable_at", "wait_reason", "inbox_seq").get()
        self.checked_at = timezone.now()
        return None

    def assert_runnable_at_once(self) -> None:
        assert self.fired == 1, "the run never parked while armed"
        row = self.after_park
        # Parked (the executor let it go) but due now, not at the wait's timeout or never.
        assert row["status"] == RunStatus.WAITING, row
        assert row["runnable_at"] is not None and row["runnable_at"] <= self.checked_at, row


def replay_while_waiting(handle: weft.WorkflowHandle) -> None:
    """An operator suspends and resumes the parked run: it is replayed and parks again."""
    handle.suspend("look at it")
    handle.resume()
    assert handle.refresh().runnable_at is not None


@pytest.mark.parametrize("when", ["first_execution", "replay"])
def test_a_signal_committed_between_reading_and_parking_wakes_the_run(db, monkeypatch, when):
    """The signal commits after the executor looked for it and before it parks the run: the park leaves
    the run runnable at once (not until the wait's one-day timeout), and the same pass delivers it."""
    handle = weft.start("test.approval", "window")
    hook = ArrivalBeforePark(monkeypatch, handle.run_id,
                             lambda: weft.signal(handle.workflow_id, "approval", "granted", signal_id="once"))
    if when == "replay":
        assert weft.run_maintenance().outcomes == {"waiting": 1}
        replay_while_waiting(handle)
    hook.armed = True

    report = weft.run_maintenance()

    hook.assert_runnable_at_once()
    assert report.outcomes == {"waiting": 1, "completed": 1}, report
    assert handle.result(timeout=0) == "granted"
    assert executions("window:before") == 1 and executions("window:after") == 1
    assert list(Signal.objects.values_list("consumed_by_seq", flat=True)) == [2]
    assert [(seq, kind, status) for seq, kind, _, status in journal(handle.run_id)] == [
        (1, "activity", "completed"), (2, "signal", "completed"), (3, "activity", "completed"),
    ]


def test_an_async_completion_committed_between_reading_and_parking_wakes_the_run(db, monkeypatch):
    """An async activity's completion commits while a replay has read its record as pending and is about
    to park: the park leaves the run runnable at once (it waits with no timeout: it would never wake),
    and the same pass finishes it with the completion's result."""
    handle = weft.start("test.async", "replayed")
    assert weft.run_maintenance().outcomes == {"waiting": 1}
    record = AsyncActivity.objects.get(run_id=handle.run_id)
    assert record.status == AsyncStatus.PENDING
    hook = ArrivalBeforePark(monkeypatch, handle.run_id,
                             lambda: weft.complete_async_activity(record.token, {"approved": True}))
    replay_while_waiting(handle)
    hook.armed = True

    report = weft.run_maintenance()

    hook.assert_runnable_at_once()
    assert report.outcomes == {"waiting": 1, "completed": 1}, report
    assert handle.result(timeout=0) == {"approved": True}
    assert AsyncActivity.objects.get(pk=record.pk).status == AsyncStatus.COMPLETED
    assert executions("replayed:asked:1") == 1 and executions("replayed:after") == 1
    assert [(seq, kind, status) for seq, kind, _, status in journal(handle.run_id)] == [
        (1, "activity", "completed"), (2, "activity", "completed"),
    ]


def test_a_completion_arriving_before_the_activity_parks_is_not_refused(db):
    """The activity hands its task token to an outside system that answers before the activity returns
    (the design's ``send_email(link=...task_token)`` pattern with a fast answer): the answer is accepted
    and the run continues with it. (With the pending record committed only by the park, such an answer
    was refused with InvalidTaskToken and the run waited forever.)"""
    signal_workflows.FAST_COMPLETIONS.clear()
    handle = weft.start("test.signals.fast_async", "fast")

    report = weft.run_maintenance()

    assert executions("fast:asked") == 1
    assert signal_workflows.FAST_COMPLETIONS == [{"completed": True}], (
        signal_workflows.FAST_COMPLETIONS, report, handle.refresh().status)
    assert handle.result(timeout=0) == "fast: answered at once"


# --- 5. a completion for a cancelled run --------------------------------------------------------------------


def test_a_completion_for_a_cancelled_run_is_refused_and_changes_nothing(db):
    """Cancelling a run kills its pending task tokens: completing or failing one afterwards raises
    TaskTokenAlreadyUsed and writes nothing; nothing executes the run again."""
    handle = weft.start("test.async", "gone")
    assert weft.run_maintenance().outcomes == {"waiting": 1}
    record = AsyncActivity.objects.get(run_id=handle.run_id)
    assert record.status == AsyncStatus.PENDING
    assert handle.cancel("no longer needed") is True
    assert weft.run_maintenance().outcomes == {"cancelled": 1}  # its code sees the cancel where it waits

    def snapshot() -> tuple:
        run = Workflow.objects.filter(pk=handle.run_id).values(
            "status", "fence", "inbox_seq", "runnable_at", "updated_at", "finished_at", "error", "result").get()
        asyncs = list(AsyncActivity.objects.filter(run_id=handle.run_id).values_list(
            "status", "result", "error", "resolved_at"))
        return run, asyncs, journal(handle.run_id), list(Execution.objects.values_list("key", flat=True))

    before = snapshot()
    assert before[0]["status"] == RunStatus.CANCELLED and before[1][0][0] == AsyncStatus.CANCELLED, before

    with pytest.raises(weft.TaskTokenAlreadyUsed, match="cancelled"):
        weft.complete_async_activity(record.token, {"approved": True})
    with pytest.raises(weft.TaskTokenAlreadyUsed, match="cancelled"):
        weft.fail_async_activity(record.token, "too late anyway")

    assert snapshot() == before
    again = weft.run_maintenance()
    assert again.claimed == 0, again
    assert snapshot() == before
    assert executions("gone:after") == 0
    with pytest.raises(weft.WorkflowCancelled):
        handle.result(timeout=0)
