"""Group commit (PostgreSQL): step commits of several runs that are ready at the same moment go as one statement,
each run fenced on its own, and a group the database refuses is sent again commit by commit.

Everything goes through the public API (``weft.run``, ``weft.start``, handles, the Worker, ``weft_maintenance``)
and Django's hooks: every statement of every connection opened during a test is logged by an execute wrapper
(installed from ``connection_created``), so a test sees which statements carried which runs' commits. A step
commit is the statement that begins ``WITH u0``; one that carries two commits or more also has a ``u1 AS`` CTE.

To force a group deterministically, a test holds the row lock of one run (X) from another transaction, lets X's
commit go first (it leads and blocks on the lock, as ``pg_stat_activity`` shows), then lets the other runs'
commits arrive (each of their threads then waits in Python, not on the database: queued behind X's statement),
and only then lets go of the lock: the commits that queued behind X's go together, as one statement.

Commits data (``transaction=True``) for the threads and processes, each on its own connection. PostgreSQL only:
elsewhere every test skips.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.db.models import Count
from django.test import override_settings

import django_weft as weft
from django_weft import signals
from django_weft.models import RunStatus, Workflow, WorkflowStep
from django_weft.runtime.worker import Worker
from tests.procs import SHORT_LEASE, journal, outputs, wait_until
from tests.test_processes_signals import LockHolder, backends_blocked_by

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

TIMEOUT = 60
STEP_COMMIT = "WITH u0"  # how a step commit's statement begins, alone or grouped
COMMIT_CTE = re.compile(r"\bu\d+ AS \(UPDATE\b")  # one per commit a statement carries


@pytest.fixture(autouse=True)
def _postgres(postgres_only: None) -> None:
    """Grouping is PostgreSQL's (the one-statement step commit): on other vendors every test here skips."""


# --- what the tests run ----------------------------------------------------------------------------------------


@weft.activity(name="gc.quick")
def quick(key: str) -> str:
    return key.upper()


@weft.workflow(name="gc.three")
def three(ctx: weft.Context, key: str) -> list[str]:
    return [ctx.run(quick, f"{key}:{i}") for i in range(3)]


class Gate:
    """One execution's activity: when it started, its go, and when it returned (its commit comes next)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.returned = threading.Event()


GATES: dict[str, Gate] = {}  # by run key; a Worker's execution of the same run has the key "<key>@worker"


def _on_worker() -> bool:
    return threading.current_thread().name.startswith("weft-executor")


def _gated(key: str) -> str:
    gate = GATES[key + "@worker" if _on_worker() else key]
    gate.entered.set()
    assert gate.go.wait(TIMEOUT), f"{key}: never released"
    gate.returned.set()
    return key.upper() + ("@WORKER" if _on_worker() else "")


@weft.activity(name="gc.gate")
def gate_activity(key: str) -> str:
    return _gated(key)


@weft.activity(name="poison")  # the name test c's CHECK constraint refuses
def poison_activity(key: str) -> str:
    return _gated(key)


@weft.workflow(name="gc.gated")
def gated(ctx: weft.Context, spec: dict) -> str:
    """An activity that waits for its gate; its step row rides on the run's completion commit."""
    return ctx.run(poison_activity if spec.get("poison") else gate_activity, spec["key"])


# --- statement log ---------------------------------------------------------------------------------------------


class StatementLog:
    """Every statement of every connection opened while installed, with its parameters as text."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, list[str]]] = []

    def __call__(self, execute, sql, params, many, context):
        self.statements.append((sql, [str(p) for p in params or ()]))
        return execute(sql, params, many, context)

    def _install(self, sender, connection, **kwargs) -> None:
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    def __enter__(self) -> StatementLog:
        connection_created.connect(self._install, dispatch_uid="test-group-commit-log")
        return self

    def __exit__(self, *exc: object) -> None:
        connection_created.disconnect(dispatch_uid="test-group-commit-log")

    def step_commits(self) -> list[tuple[str, list[str]]]:
        return [(sql, params) for sql, params in self.statements if sql.startswith(STEP_COMMIT)]

    def groups(self) -> list[list[str]]:
        """The parameters of each step commit statement that carried two commits or more."""
        return [params for sql, params in self.step_commits() if " u1 AS" in sql]

    def grouped(self, *run_ids: object) -> bool:
        """One statement carried the commits of all of ``run_ids``."""
        return any(all(str(run_id) in params for run_id in run_ids) for params in self.groups())

    def carried(self) -> int:
        """Commits carried by all step commit statements."""
        return sum(len(COMMIT_CTE.findall(sql)) for sql, _ in self.step_commits())

    def alone_with(self, run_id: object) -> int:
        """Step commit statements that carried ``run_id``'s commit and no other."""
        return sum(1 for sql, params in self.step_commits() if " u1 AS" not in sql and str(run_id) in params)


@pytest.fixture
def statements() -> Iterator[StatementLog]:
    """A StatementLog installed for the whole test (every connection its threads open)."""
    with StatementLog() as log:
        yield log


FINISH_SIGNALS = {"completed": signals.workflow_completed, "failed": signals.workflow_failed,
                  "cancelled": signals.workflow_cancelled, "timed_out": signals.workflow_timed_out}


@pytest.fixture
def finishes() -> Iterator[list[tuple[str, str, str]]]:
    """(workflow_id, how it ended, thread) of every workflow_completed/failed/cancelled/timed_out signal: what
    each executor was told about its last commit (a finish told refused sends nothing)."""
    sent: list[tuple[str, str, str]] = []

    def receiver(kind: str):
        def receive(sender, run, **kwargs) -> None:
            sent.append((run.workflow_id, kind, threading.current_thread().name))
        return receive

    for kind, signal_ in FINISH_SIGNALS.items():
        signal_.connect(receiver(kind), weak=False, dispatch_uid=f"test-group-commit-{kind}")
    try:
        yield sent
    finally:
        for kind, signal_ in FINISH_SIGNALS.items():
            signal_.disconnect(dispatch_uid=f"test-group-commit-{kind}")


# --- callers of weft.run() in threads, and forcing a group -------------------------------------------------------


class Caller(threading.Thread):
    """``weft.run("gc.gated", ...)`` in a thread of its own (so on a connection of its own)."""

    def __init__(self, key: str, **spec: Any) -> None:
        super().__init__(name=f"caller-{key}", daemon=True)
        GATES[key] = Gate()
        self.key, self.workflow_id, self.spec = key, f"gc-{key}", {"key": key, **spec}
        self.error: str | None = None

    def run(self) -> None:
        try:
            weft.run("gc.gated", self.spec, workflow_id=self.workflow_id)
        except BaseException:
            self.error = traceback.format_exc()
        finally:
            connection.close()

    @property
    def gate(self) -> Gate:
        return GATES[self.key]

    @property
    def run_id(self) -> Any:
        return Workflow.objects.get(workflow_id=self.workflow_id).run_id

    def finish(self) -> None:
        self.join(TIMEOUT)
        assert not self.is_alive(), f"{self.name} did not finish within {TIMEOUT}s"
        assert self.error is None, self.error


def queued(thread: threading.Thread, gate: Gate) -> bool:
    """The thread's activity returned and the thread is blocked in a ``threading`` wait: its commit is queued
    behind the statement in flight (sent alone it would wait on the database, in psycopg, instead)."""
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    return (gate.returned.is_set() and frame is not None
            and frame.f_code.co_filename == threading.__file__ and frame.f_code.co_name == "wait")


def group_behind(leader: Caller, followers: list[tuple[threading.Thread, Gate]]) -> None:
    """Every execution is in its activity. ``leader``'s commit goes first and blocks on its run's row lock;
    ``followers``' commits queue behind it, in this order; then the lock goes and the callers finish."""
    for thread, gate in [(leader, leader.gate), *followers]:
        assert gate.entered.wait(TIMEOUT), f"{thread.name} never reached its activity"
    table = Workflow._meta.db_table
    with LockHolder(f'SELECT 1 FROM "{table}" WHERE "run_id" = %s FOR UPDATE', [leader.run_id]) as holder:
        leader.gate.go.set()
        # (A lease renewal may wait for the lock too: only the step commit counts.)
        wait_until(lambda: any(query.startswith(STEP_COMMIT) for _, query in backends_blocked_by(holder.backend_pid)),
                   "the leader's commit to block on the lock", TIMEOUT,
                   describe=lambda: f"blocked: {backends_blocked_by(holder.backend_pid)}")
        for thread, gate in followers:
            gate.go.set()
            wait_until(lambda t=thread, g=gate: queued(t, g), f"{thread.name}'s commit to queue behind the leader's",
                       TIMEOUT, describe=lambda t=thread: f"{t.name} alive: {t.is_alive()}")
    for thread, _ in [(leader, None), *followers]:
        if isinstance(thread, Caller):
            thread.finish()


@pytest.fixture
def callers(statements: StatementLog):
    """``callers(*keys, **spec)`` starts a Caller per key (its statements logged in ``statements``); every gate
    opens at the end, whatever happened."""
    started: list[Caller] = []

    def start(*keys: str, **spec: Any) -> list[Caller]:
        made = [Caller(key, **spec) for key in keys]
        for caller in made:
            caller.start()
        started.extend(made)
        return made

    try:
        yield start
    finally:
        for gate in GATES.values():
            gate.go.set()
        for caller in started:
            caller.join(TIMEOUT)
        GATES.clear()


@contextmanager
def worker(threads: int) -> Iterator[Worker]:
    """A Worker with ``threads`` executor threads running in this process until the block ends."""
    running = Worker(threads=threads, interval=0.2)
    thread = threading.Thread(target=running.run, name="worker", daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(30)
    assert not thread.is_alive(), "the worker did not stop within 30s"


def executor_thread() -> threading.Thread:
    [thread] = [t for t in threading.enumerate() if t.name == "weft-executor-0"]
    return thread


def reclaimed_by_a_worker(stale: Caller) -> Gate:
    """Suspend and resume ``stale``'s run while its caller is in its activity: the run's fence moves and the
    Worker (one thread) claims it and executes it again, up to the same activity. Its status is running again:
    only the fence tells the two executions apart. Returns the Worker's gate."""
    GATES[stale.key + "@worker"] = gate = Gate()
    handle = weft.get_handle(stale.workflow_id)
    handle.suspend("taken from its caller")
    handle.resume()
    assert gate.entered.wait(TIMEOUT), "the worker did not claim the resumed run"
    run = handle.refresh()
    assert run.status == RunStatus.RUNNING and run.lease_owner, (run.status, run.lease_owner)
    return gate


# --- a. many runs, four executor threads ---------------------------------------------------------------------


def drive(total: int) -> StatementLog:
    """Start ``total`` gc.three runs and execute them all with a Worker of four executor threads. Checks that every
    run completed with exactly its steps 1, 2, 3, each announced once (activity_completed) with its own row."""
    handles = [weft.start("gc.three", f"r{n}") for n in range(total)]
    announced: list[tuple[Any, int, Any]] = []

    def on_step(sender, run, seq, step, **kwargs) -> None:
        announced.append((run.pk, seq, step.pk))

    signals.activity_completed.connect(on_step, weak=False, dispatch_uid="test-group-commit-steps")
    try:
        with StatementLog() as log, worker(threads=4):
            open_runs = Workflow.objects.filter(status__in=RunStatus.open_values())
            wait_until(lambda: not open_runs.exists(), f"the {total} runs to finish", 120,
                       describe=lambda: f"{open_runs.count()} run(s) still open")
    finally:
        signals.activity_completed.disconnect(dispatch_uid="test-group-commit-steps")

    by_status = dict(Workflow.objects.values_list("status").annotate(n=Count("pk")))
    assert by_status == {RunStatus.COMPLETED: total}, (
        by_status, list(Workflow.objects.exclude(status=RunStatus.COMPLETED).values_list("error")[:3]))
    for n in (0, total // 2, total - 1):
        assert handles[n].result(timeout=0) == [f"R{n}:{i}" for i in range(3)]
    seqs: dict[Any, list[int]] = {}
    for run_id, seq in WorkflowStep.objects.order_by("run_id", "seq").values_list("run_id", "seq"):
        seqs.setdefault(run_id, []).append(seq)
    assert len(seqs) == total
    wrong = {run_id: s for run_id, s in seqs.items() if s != [1, 2, 3]}
    assert not wrong, f"runs without exactly steps 1, 2, 3: {list(wrong.items())[:10]}"
    assert not WorkflowStep.objects.exclude(status="completed").exists()
    # The ids each executor was given for its new rows (the group's RETURNING, sorted out by run and seq).
    rows = {(run_id, seq): pk for run_id, seq, pk in WorkflowStep.objects.values_list("run_id", "seq", "pk")}
    assert len(announced) == len(rows) == 3 * total, (len(announced), len(rows))
    wrong_ids = [(run_id, seq, pk) for run_id, seq, pk in announced if rows.get((run_id, seq)) != pk]
    assert not wrong_ids, f"steps announced with another row's id: {wrong_ids[:10]}"
    return log


def test_many_runs_on_four_threads_commit_in_groups_each_step_once():
    total = 200
    log = drive(total)
    statements, groups = len(log.step_commits()), log.groups()
    # Each run commits three times (two steps, then the third with its completion): every commit carried once...
    assert log.carried() == 3 * total, (log.carried(), statements)
    # ...in fewer statements than commits, because some went together.
    assert groups, f"no step commit carried two runs' commits ({statements} statements for {3 * total} commits)"
    assert statements < 3 * total
    # No group carries one run twice.
    all_runs = {str(run_id) for run_id in Workflow.objects.values_list("run_id", flat=True)}
    for params in groups:
        run_ids = [p for p in params if p in all_runs]
        assert len(run_ids) == len(set(run_ids)) >= 2, run_ids


@override_settings(WEFT_GROUP_COMMIT=False)
def test_without_group_commit_every_commit_is_a_statement_of_its_own():
    total = 100
    log = drive(total)
    assert log.groups() == []
    assert len(log.step_commits()) == log.carried() == 3 * total


# --- b. each run fenced on its own inside a group --------------------------------------------------------------


@pytest.mark.parametrize("end", ["cancel", "terminate", "reclaim"])
def test_a_run_whose_fence_moved_gets_nothing_from_its_group_the_others_commit(callers, statements, finishes, end):
    """Z's fence moves while its activity runs (cancelled, terminated, or suspended, resumed and claimed by a
    Worker: running again, under another fence). Its commit goes in one statement with Y's: Y commits, Z gets
    nothing, and a re-claimed Z is finished by its new executor."""
    x, y, z = callers("x", "y", "z")
    for caller in (x, y, z):
        assert caller.gate.entered.wait(TIMEOUT), caller.error
    handle_z = weft.get_handle(z.workflow_id)
    with worker(threads=1) if end == "reclaim" else nullcontext():
        if end == "reclaim":
            worker_gate = reclaimed_by_a_worker(z)
        else:
            assert getattr(handle_z, end)("moved while its step ran")  # Z's executor does not know yet
        group_behind(x, [(y, y.gate), (z, z.gate)])
        assert statements.grouped(y.run_id, z.run_id), f"Y's and Z's commits did not go together: {statements}"
        if end == "reclaim":
            assert journal(z.run_id) == [], "the stale execution's step went in with the group"
            worker_gate.go.set()
            wait_until(lambda: handle_z.refresh().is_finished, "the worker to finish the re-claimed run", TIMEOUT)

    for caller in (x, y):
        run = Workflow.objects.get(workflow_id=caller.workflow_id)
        assert run.status == RunStatus.COMPLETED, (caller.key, run.status, run.error)
        assert weft.get_handle(caller.workflow_id).result(timeout=0) == caller.key.upper()
        assert journal(run.run_id) == [(1, "activity", "gc.gate", "completed")]
    run_z = handle_z.refresh()
    if end == "cancel":
        assert (run_z.status, run_z.termination_reason) == (RunStatus.CANCELLED, "cancel_requested")
        assert journal(run_z.run_id) == [], "the cancelled run got its step from the group"
    elif end == "terminate":
        assert (run_z.status, run_z.termination_reason) == (RunStatus.TIMED_OUT, "terminated")
        assert journal(run_z.run_id) == [], "the terminated run got its step from the group"
    else:  # one step, the new executor's
        assert run_z.status == RunStatus.COMPLETED, (run_z.status, run_z.error)
        assert handle_z.result(timeout=0) == "Z@WORKER"
        assert journal(run_z.run_id) == [(1, "activity", "gc.gate", "completed")]
    # Each executor was told the truth about its commit: X's and Y's held (they announce their completion),
    # Z's caller's was refused (it announces nothing; the operator's cancel or the new executor does).
    z_end = {"cancel": ("cancelled", "MainThread"), "terminate": ("timed_out", "MainThread"),
             "reclaim": ("completed", "weft-executor-0")}[end]
    assert sorted(finishes) == sorted([(x.workflow_id, "completed", x.name), (y.workflow_id, "completed", y.name),
                                       (z.workflow_id, *z_end)]), finishes


@pytest.mark.xfail(strict=True, reason="group_commit._send maps the returned rows by run_id: of two commits of one "
                                       "run in one group, the stale one is reported held and the one that committed "
                                       "is reported refused")
def test_two_commits_of_one_run_in_one_group_each_get_their_own_outcome(callers, statements, finishes):
    """Z's stale execution (its caller's: its fence moved) and its new one (a Worker's, after a re-claim) send
    their completions in one group, the new one first. The stale one must be told it was refused; the new one,
    which committed, that it held (each executor announces a completion it was told held)."""
    x, y, z = callers("x", "y", "z")
    for caller in (x, y, z):
        assert caller.gate.entered.wait(TIMEOUT), caller.error
    handle_z = weft.get_handle(z.workflow_id)
    with worker(threads=1):
        worker_gate = reclaimed_by_a_worker(z)
        group_behind(x, [(y, y.gate), (executor_thread(), worker_gate), (z, z.gate)])
        assert any(params.count(str(z.run_id)) == 2 for params in statements.groups()), statements.step_commits()
        wait_until(lambda: any(w == z.workflow_id for w, _, _ in finishes), "Z's completion to be announced", 10)
    assert handle_z.result(timeout=0) == "Z@WORKER"
    assert journal(z.run_id) == [(1, "activity", "gc.gate", "completed")]
    assert [(kind, thread) for w, kind, thread in finishes if w == z.workflow_id] == [
        ("completed", "weft-executor-0")], "the stale execution was told its commit held, the new one that it did not"


# --- c. a group the database refuses ----------------------------------------------------------------------------


def test_a_refused_group_is_sent_again_commit_by_commit(callers, statements, finishes):
    table = WorkflowStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT gc_test_no_poison CHECK ("name" <> \'poison\')')
    try:
        x, y = callers("x", "y")
        [p] = callers("p", poison=True)
        group_behind(x, [(p, p.gate), (y, y.gate)])
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT IF EXISTS gc_test_no_poison')

    run_p = Workflow.objects.get(workflow_id=p.workflow_id)
    assert (run_p.status, run_p.termination_reason) == (RunStatus.FAILED, "database_refused"), (
        run_p.status, run_p.error)
    assert "gc_test_no_poison" in str(run_p.error), run_p.error
    assert journal(run_p.run_id) == []
    for caller in (x, y):
        run = Workflow.objects.get(workflow_id=caller.workflow_id)
        assert run.status == RunStatus.COMPLETED, (caller.key, run.status, run.error)
        assert weft.get_handle(caller.workflow_id).result(timeout=0) == caller.key.upper()
        assert journal(run.run_id) == [(1, "activity", "gc.gate", "completed")]
    # The group of P and Y was sent (and refused), then each of its commits alone.
    assert statements.grouped(p.run_id, y.run_id), statements.step_commits()
    assert statements.alone_with(p.run_id) >= 1 and statements.alone_with(y.run_id) == 1, statements.step_commits()
    assert sorted(finishes) == sorted([(x.workflow_id, "completed", x.name), (y.workflow_id, "completed", y.name),
                                       (p.workflow_id, "failed", p.name)]), finishes


# --- d. SIGKILL of a process driving runs on four threads --------------------------------------------------------


@pytest.mark.concurrent
def test_a_process_killed_mid_drive_leaves_every_recorded_step_recorded_once(maintenance):
    """A four-thread weft_maintenance (grouping on) is SIGKILLed while it drives 100 three-step runs; a second one
    finishes them. Every run completes with steps 1, 2, 3; a step recorded before the kill never ran again; one
    that was not ran again in the second process."""
    from tests.testapp.models import Execution

    total, count = 100, 3
    first = maintenance("first", "--workers", "4", "--interval", "0.2", WEFT_GROUP_COMMIT="1", **SHORT_LEASE)
    wait_until(lambda: "running with" in first.stdout(), "the first process to start", 30, [first])
    handles = [weft.start("test.steps", {"key": f"k{n}", "count": count}) for n in range(total)]
    wait_until(lambda: WorkflowStep.objects.count() >= 40, "the first process to record some steps", 60, [first])
    first.send(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL, first.output()

    recorded = set(WorkflowStep.objects.values_list("run_id", "seq"))
    assert len(recorded) < total * count, "the first process finished everything before the kill"
    second = maintenance("second", "--workers", "4", "--interval", "0.2", **SHORT_LEASE)
    open_runs = Workflow.objects.filter(status__in=RunStatus.open_values())
    wait_until(lambda: not open_runs.exists(), "the second process to finish every run", 120, [second],
               describe=lambda: f"{open_runs.count()} run(s) still open")

    by_status = dict(Workflow.objects.values_list("status").annotate(n=Count("pk")))
    assert by_status == {RunStatus.COMPLETED: total}, (by_status, outputs([first, second]))
    seqs: dict[Any, list[int]] = {}
    for run_id, seq in WorkflowStep.objects.order_by("run_id", "seq").values_list("run_id", "seq"):
        seqs.setdefault(run_id, []).append(seq)
    assert set(seqs) == {handle.run_id for handle in handles}
    assert {run_id: s for run_id, s in seqs.items() if s != [1, 2, 3]} == {}
    executed: dict[str, list[int]] = {}
    for key, pid in Execution.objects.order_by("id").values_list("key", "pid"):
        executed.setdefault(key, []).append(pid)
    for n, handle in enumerate(handles):
        assert handle.result(timeout=0) == [f"K{n}:{i}" for i in range(count)]
        for seq in range(1, count + 1):
            pids = executed.get(f"k{n}:{seq - 1}", [])
            if (handle.run_id, seq) in recorded:  # recorded before the kill: never executed again
                assert pids == [first.pid], (n, seq, pids)
            else:  # in flight or not started at the kill: executed again, once, by the second process
                assert pids in ([second.pid], [first.pid, second.pid]), (n, seq, pids)
