"""Group commit (PostgreSQL): step commits of several runs that are ready at the same moment go as one statement,
each run fenced on its own; a run whose row another transaction holds is sent again alone, holding up nobody; a
group the database refuses is sent again commit by commit; a group whose reply was lost is left to its leases.

Everything goes through the public API (``weft.run``, ``weft.start``, handles, the Worker, ``weft_maintenance``)
and Django's hooks: every statement of every connection opened during a test is logged by an execute wrapper
(installed from ``connection_created``), with what a step commit returned, so a test sees which statements
carried which runs' commits and what each commit got. The statement shapes (django_weft/group_commit.py):

* ``WITH locked AS (SELECT run_id ... FOR UPDATE SKIP LOCKED), u0 AS (UPDATE ...), i0 AS (INSERT ...), u1 ...``:
  a group, one ``uN AS (UPDATE`` per commit (a lone leader's group has only ``u0``); its first parameters are
  the runs of its commits, by position. It returns ``(NULL, 'l', NULL, NULL, run_id)`` per row it locked and,
  per position, ``'u'`` if the fence held and ``'i', seq, id`` per new row. A commit whose row it could not lock
  is *skipped*: sent again alone.
* ``WITH u AS (UPDATE ...), i AS (INSERT ...) SELECT ...``: one commit alone (a skipped one, each commit of a
  refused group, every commit with ``WEFT_GROUP_COMMIT = False``).

To force a group deterministically, a test *stalls* the statement of one run (X) inside the execute wrapper of
X's own thread, before it reaches the database: X's thread leads and its statement is in flight, so the commits
that arrive meanwhile queue behind it (each of their threads then waits in ``group_commit._wait``, as its stack
shows), in the order the test lets them come; then the stall ends and the first of them leads the others, as
one statement.

Commits data (``transaction=True``) for the threads and processes, each on its own connection. PostgreSQL only:
elsewhere every test skips.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.db.models import Count
from django.test import override_settings
from django.utils import timezone

import django_weft as weft
from django_weft import signals
from django_weft.models import RunStatus, Workflow, WorkflowStep
from django_weft.store import group_commit
from django_weft.worker.loop import Worker
from tests.procs import SHORT_LEASE, journal, outputs, wait_until
from tests.test_processes_signals import LockHolder, backends_blocked_by

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture(autouse=True)
def grouping(settings):
    """Group commit is off by default; these tests are about it (a test's own override_settings wins)."""
    settings.WEFT_GROUP_COMMIT = True

TIMEOUT = 60
GROUP = "WITH locked AS"  # a group's statement (a lone leader's too)
ALONE = "WITH u AS"  # one commit sent alone
COMMIT_CTE = re.compile(r"\bu\d+ AS \(UPDATE\b")  # one per commit a group carries


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
GATE_CALLS: list[str] = []  # the gate keys of every execution of a gated activity, in order


def _on_worker() -> bool:
    return threading.current_thread().name.startswith("weft-executor")


def _gated(key: str) -> str:
    name = key + "@worker" if _on_worker() else key
    GATE_CALLS.append(name)
    gate = GATES[name]
    gate.entered.set()
    assert gate.go.wait(TIMEOUT), f"{key}: never released"
    gate.returned.set()
    return key.upper() + ("@WORKER" if _on_worker() else "")


@weft.activity(name="gc.gate")
def gate_activity(key: str) -> str:
    return _gated(key)


@weft.activity(name="poison")  # the name the refused group test's CHECK constraint refuses
def poison_activity(key: str) -> str:
    return _gated(key)


@weft.workflow(name="gc.gated")
def gated(ctx: weft.Context, spec: dict) -> str:
    """An activity that waits for its gate; its step row rides on the run's completion commit."""
    return ctx.run(poison_activity if spec.get("poison") else gate_activity, spec["key"])


@weft.workflow(name="gc.gated_then")
def gated_then(ctx: weft.Context, spec: dict) -> list[str]:
    """The gated activity, whose step commits on its own (before the next activity starts: a mid-run step
    commit), then a quick one, whose step rides on the completion."""
    first = ctx.run(gate_activity, spec["key"])
    return [first, ctx.run(quick, spec["key"])]


# --- statement log ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Statement:
    """One statement as the database got it, with what a step commit returned (or the error it raised)."""

    sql: str
    params: list[str]
    thread: str
    rows: list[tuple] | None = None
    error: str | None = None

    @property
    def group(self) -> bool:
        return self.sql.startswith(GROUP)

    @property
    def alone(self) -> bool:
        return self.sql.startswith(ALONE)

    @property
    def runs(self) -> list[str]:
        """The run of each commit it carries, by position."""
        if self.group:
            return self.params[:len(COMMIT_CTE.findall(self.sql))]
        if self.alone:  # the run's parameter follows the values of the run columns set
            return [self.params[self.sql.split(" WHERE ", 1)[0].count("= %s")]]
        return []

    def outcomes(self) -> list[str]:
        """Per position: "held" (its fence held: committed), "refused" (its fence moved: nothing written) or
        "skipped" (a group that could not lock its row: sent again alone); "error" for all if it raised."""
        if self.error is not None or self.rows is None:
            return ["error"] * len(self.runs)
        if self.alone:
            return ["held" if any(kind == "u" for kind, _, _ in self.rows) else "refused"]
        locked = {str(row[4]) for row in self.rows if row[1] == "l"}
        held = {row[0] for row in self.rows if row[1] == "u"}
        return ["skipped" if run not in locked else "held" if position in held else "refused"
                for position, run in enumerate(self.runs)]

    def outcome_of(self, run_id: object) -> list[str]:
        return [outcome for run, outcome in zip(self.runs, self.outcomes(), strict=True) if run == str(run_id)]


class Stall:
    """Holds the first group statement that carries ``run_id``'s commit in its thread's execute wrapper (before
    it reaches the database) from when it comes (``reached``) until ``released``."""

    def __init__(self, run_id: object) -> None:
        self.run_id = str(run_id)
        self.reached = threading.Event()
        self.released = threading.Event()

    def hold(self, statement: Statement) -> None:
        if statement.group and self.run_id in statement.runs and not self.reached.is_set():
            self.reached.set()
            assert self.released.wait(TIMEOUT), "a stalled statement was never released"


class StatementLog:
    """Every statement of every connection opened while installed, with its parameters as text; a step
    commit's returned rows too (read, then the cursor rewound for the caller)."""

    def __init__(self) -> None:
        self.statements: list[Statement] = []
        self.stall: Stall | None = None

    def __call__(self, execute, sql, params, many, context):
        statement = Statement(sql, [str(p) for p in params or ()], threading.current_thread().name)
        self.statements.append(statement)
        stall = self.stall
        if stall is not None:
            stall.hold(statement)
        try:
            result = execute(sql, params, many, context)
        except BaseException as exc:
            statement.error = f"{type(exc).__name__}: {exc}"
            raise
        if statement.group or statement.alone:
            cursor = context["cursor"]
            statement.rows = [tuple(row) for row in cursor.fetchall()]
            if statement.rows:
                cursor.scroll(0, mode="absolute")
        return result

    def _install(self, sender, connection, **kwargs) -> None:
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    def __enter__(self) -> StatementLog:
        connection_created.connect(self._install, dispatch_uid="test-group-commit-log")
        return self

    def __exit__(self, *exc: object) -> None:
        connection_created.disconnect(dispatch_uid="test-group-commit-log")

    @contextmanager
    def stalling(self, run_id: object) -> Iterator[Stall]:
        """Stall the first group statement carrying ``run_id``'s commit until the block ends."""
        self.stall = stall = Stall(run_id)
        try:
            yield stall
        finally:
            stall.released.set()
            self.stall = None

    def step_commits(self) -> list[Statement]:
        return [s for s in self.statements if s.group or s.alone]

    def groups(self) -> list[Statement]:
        """The group statements that carried two commits or more."""
        return [s for s in self.step_commits() if s.group and len(s.runs) >= 2]

    def grouped(self, *run_ids: object) -> list[Statement]:
        """The group statements that carried the commits of all of ``run_ids``."""
        return [s for s in self.groups() if all(str(run_id) in s.runs for run_id in run_ids)]

    def carrying(self, run_id: object) -> list[Statement]:
        """The step commit statements that carried ``run_id``'s commit."""
        return [s for s in self.step_commits() if str(run_id) in s.runs]

    def alone_with(self, run_id: object) -> list[Statement]:
        """The statements that sent ``run_id``'s commit alone."""
        return [s for s in self.carrying(run_id) if s.alone]

    def settled(self) -> int:
        """Commits settled (written, or refused by their fence) by all step commit statements: a commit a group
        skipped, or one of a refused group, is settled by the statement that sends it again alone."""
        return sum(outcome in ("held", "refused") for s in self.step_commits() for outcome in s.outcomes())

    def skipped(self) -> int:
        return sum(outcome == "skipped" for s in self.step_commits() for outcome in s.outcomes())

    def describe(self) -> str:
        return "\n".join(f"  {s.thread:18} {s.sql[:14]!r} {s.runs} {s.outcomes()} {s.error or ''}"
                         for s in self.step_commits())


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
    """``weft.run(workflow, {"key": key, ...})`` in a thread of its own (so on a connection of its own; through
    the TCP proxy on ``port`` if given)."""

    def __init__(self, key: str, workflow: str = "gc.gated", port: int | None = None, **spec: Any) -> None:
        super().__init__(name=f"caller-{key}", daemon=True)
        GATES[key] = Gate()
        self.key, self.workflow, self.port = key, workflow, port
        self.workflow_id, self.spec = f"gc-{key}", {"key": key, **spec}
        self.error: str | None = None

    def run(self) -> None:
        try:
            if self.port is not None:
                settings = connection.settings_dict
                connection.settings_dict = {**settings, "HOST": "127.0.0.1", "PORT": str(self.port),
                                            "OPTIONS": {**settings.get("OPTIONS", {}), "sslmode": "disable"}}
            weft.run(self.workflow, self.spec, workflow_id=self.workflow_id)
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

    def finish(self, timeout: float = TIMEOUT) -> None:
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not finish within {timeout}s"
        assert self.error is None, self.error


def queued(thread: threading.Thread, gate: Gate | None = None) -> bool:
    """The thread's activity returned and its commit waits in the group commit queue: the thread is blocked in
    a ``threading`` wait called from ``group_commit._wait`` (sent, it would be in psycopg instead)."""
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    if frame is None or (gate is not None and not gate.returned.is_set()):
        return False
    if not (frame.f_code.co_filename == threading.__file__ and frame.f_code.co_name == "wait"):
        return False
    while frame is not None:
        if frame.f_code.co_name == "_wait" and frame.f_code.co_filename == group_commit.__file__:
            return True
        frame = frame.f_back
    return False


def queue_behind(log: StatementLog, leader: Caller, followers: list[tuple[threading.Thread, Gate]]):
    """A context: ``leader``'s commit goes first and its statement stalls in flight; ``followers``' commits
    queue behind it, in this order; the block runs; then the stall ends."""
    for thread, gate in [(leader, leader.gate), *followers]:
        assert gate.entered.wait(TIMEOUT), f"{thread.name} never reached its activity"

    @contextmanager
    def stalled() -> Iterator[Stall]:
        with log.stalling(leader.run_id) as stall:
            leader.gate.go.set()
            wait_until(stall.reached.is_set, f"{leader.name}'s commit to be in flight", TIMEOUT,
                       describe=lambda: f"{leader.name} alive: {leader.is_alive()}, error: {leader.error}")
            for thread, gate in followers:
                gate.go.set()
                wait_until(lambda t=thread, g=gate: queued(t, g), f"{thread.name}'s commit to queue behind the "
                           "leader's", TIMEOUT, describe=lambda t=thread: f"{t.name} alive: {t.is_alive()}")
            yield stall
    return stalled()


def group_behind(log: StatementLog, leader: Caller, followers: list[tuple[threading.Thread, Gate]]) -> None:
    """Every execution is in its activity. ``leader``'s commit goes first and stalls; ``followers``' commits
    queue behind it, in this order; then the stall ends (the followers go as one group, the first of them
    leading) and the callers finish."""
    with queue_behind(log, leader, followers):
        pass
    for thread, _ in [(leader, None), *followers]:
        if isinstance(thread, Caller):
            thread.finish()


@pytest.fixture
def callers(statements: StatementLog):
    """``callers(*keys, **options)`` starts a Caller per key (its statements logged in ``statements``); every
    gate opens at the end, whatever happened."""
    started: list[Caller] = []

    def start(*keys: str, **options: Any) -> list[Caller]:
        made = [Caller(key, **options) for key in keys]
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
        GATE_CALLS.clear()


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


def completed_with_its_step(caller: Caller) -> None:
    run = Workflow.objects.get(workflow_id=caller.workflow_id)
    assert run.status == RunStatus.COMPLETED, (caller.key, run.status, run.error)
    assert weft.get_handle(caller.workflow_id).result(timeout=0) == caller.key.upper()
    assert journal(run.run_id) == [(1, "activity", "gc.gate", "completed")]


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
    # The ids each executor was given for its new rows (the group's RETURNING, sorted out by position and seq).
    rows = {(run_id, seq): pk for run_id, seq, pk in WorkflowStep.objects.values_list("run_id", "seq", "pk")}
    assert len(announced) == len(rows) == 3 * total, (len(announced), len(rows))
    wrong_ids = [(run_id, seq, pk) for run_id, seq, pk in announced if rows.get((run_id, seq)) != pk]
    assert not wrong_ids, f"steps announced with another row's id: {wrong_ids[:10]}"
    errors = [s for s in log.step_commits() if s.error]
    assert not errors, [(s.runs, s.error) for s in errors[:5]]
    return log


def test_many_runs_on_four_threads_commit_in_groups_each_step_once():
    total = 200
    log = drive(total)
    step_commits, groups = log.step_commits(), log.groups()
    # Each run commits three times (two steps, then the third with its completion): every commit settled once,
    # all of them held (no fence moved)...
    assert log.settled() == 3 * total, (log.settled(), len(step_commits), log.skipped())
    assert all(o in ("held", "skipped") for s in step_commits for o in s.outcomes()), log.describe()
    # ...the only commits sent alone being those a group skipped (a row a lease renewal held at that moment)...
    alone = [s for s in step_commits if s.alone]
    assert len(alone) == log.skipped(), (len(alone), log.skipped())
    # ...in fewer statements than commits, because some went together.
    assert groups, f"no step commit carried two runs' commits ({len(step_commits)} statements for {3 * total})"
    assert len(step_commits) < 3 * total
    for group in groups:  # no group carries one run twice
        assert len(group.runs) == len(set(group.runs)), group.runs
    assert max(len(group.runs) for group in groups) <= group_commit.MAX_GROUP


@override_settings(WEFT_GROUP_COMMIT=False)
def test_without_group_commit_every_commit_is_a_statement_of_its_own():
    total = 100
    log = drive(total)
    assert [s for s in log.step_commits() if s.group] == []
    assert len(log.step_commits()) == log.settled() == 3 * total


# --- b. each run fenced on its own inside a group --------------------------------------------------------------


@pytest.mark.parametrize("end", ["terminate", "reclaim"])
def test_a_run_whose_fence_moved_gets_nothing_from_its_group_the_others_commit(callers, statements, finishes, end):
    """Z's fence moves while its activity runs (terminated, or suspended, resumed and claimed by a
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
        group_behind(statements, x, [(y, y.gate), (z, z.gate)])
        [group] = statements.grouped(y.run_id, z.run_id) or [None]
        assert group is not None, f"Y's and Z's commits did not go together:\n{statements.describe()}"
        # Fenced inside the group (its row locked, its fence checked there), not skipped and sent again.
        assert group.outcome_of(y.run_id) == ["held"] and group.outcome_of(z.run_id) == ["refused"], (
            statements.describe())
        assert statements.alone_with(y.run_id) == statements.alone_with(z.run_id) == []
        if end == "reclaim":
            assert journal(z.run_id) == [], "the stale execution's step went in with the group"
            worker_gate.go.set()
            wait_until(lambda: handle_z.refresh().is_finished, "the worker to finish the re-claimed run", TIMEOUT)

    for caller in (x, y):
        completed_with_its_step(caller)
    run_z = handle_z.refresh()
    if end == "terminate":
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
        group_behind(statements, x, [(y, y.gate), (executor_thread(), worker_gate), (z, z.gate)])
        twice = [s for s in statements.groups() if s.runs.count(str(z.run_id)) == 2]
        assert twice, statements.describe()
        # By position: Y, then Z's new execution (its fence held), then Z's stale one (refused).
        assert twice[0].runs == [str(y.run_id), str(z.run_id), str(z.run_id)], statements.describe()
        assert twice[0].outcomes() == ["held", "held", "refused"], statements.describe()
        wait_until(lambda: any(w == z.workflow_id for w, _, _ in finishes), "Z's completion to be announced", 10)
    assert handle_z.result(timeout=0) == "Z@WORKER"
    assert journal(z.run_id) == [(1, "activity", "gc.gate", "completed")]
    assert [(kind, thread) for w, kind, thread in finishes if w == z.workflow_id] == [
        ("completed", "weft-executor-0")], "the stale execution was told its commit held, the new one that it did not"
    completed_with_its_step(y)


# --- c. a run whose row another transaction holds ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["alone", "leading_a_group", "inside_a_group"])
def test_a_run_whose_row_is_locked_holds_up_no_other_run(callers, statements, finishes, where):
    """Another transaction holds X's row lock (an operator's, a parent closing its children) when X's commit
    goes: alone (X leads, alone), leading a group of X, Y, Z or inside one (Y, X, Z). The group cannot lock X's
    row: it skips X (it never waits on a lock), commits the others, and X's commit is sent again alone, on X's
    own thread, where it waits for the lock. Meanwhile Y and Z, on other threads of the same process, commit
    and complete; X completes once the lock goes."""
    x, y, z = callers("x", "y", "z")
    w = callers("w")[0] if where != "alone" else None
    for caller in (x, y, z, w):
        if caller is not None:
            assert caller.gate.entered.wait(TIMEOUT), caller.error
    table = Workflow._meta.db_table
    with LockHolder(f'SELECT 1 FROM "{table}" WHERE "run_id" = %s FOR UPDATE', [x.run_id]) as holder:

        def x_waits_alone_on_the_lock() -> bool:
            return any(query.startswith(ALONE) for _, query in backends_blocked_by(holder.backend_pid))

        if w is None:
            x.gate.go.set()
        else:  # W's commit stalls in flight while X, Y, Z queue behind it, then they go as one group
            order = [x, y, z] if where == "leading_a_group" else [y, x, z]
            with queue_behind(statements, w, [(c, c.gate) for c in order]):
                pass
        wait_until(x_waits_alone_on_the_lock, "X's commit, sent alone, to wait for the lock", TIMEOUT,
                   describe=lambda: f"blocked: {backends_blocked_by(holder.backend_pid)}\n{statements.describe()}\n"
                   f"X alive: {x.is_alive()}, error: {x.error}")
        for caller in (y, z):
            caller.gate.go.set()
        for caller in (y, z, w):
            if caller is not None:
                caller.finish()  # while X's row is still locked
                completed_with_its_step(caller)
        assert x.is_alive() and x_waits_alone_on_the_lock(), "X's commit did not wait for the lock"
        run_x = Workflow.objects.get(pk=x.run_id)
        assert run_x.status == RunStatus.RUNNING and journal(x.run_id) == []

        # The group statement that carried X did not wait for the lock: it skipped X, and committed the others.
        [first] = [s for s in statements.carrying(x.run_id) if s.group]
        assert first.outcome_of(x.run_id) == ["skipped"], statements.describe()
        if w is None:
            assert first.runs == [str(x.run_id)]
        else:
            assert sorted(first.runs) == sorted(str(c.run_id) for c in (x, y, z)), statements.describe()
            assert first.outcome_of(y.run_id) == first.outcome_of(z.run_id) == ["held"], statements.describe()
            assert first.thread == (x.name if where == "leading_a_group" else y.name)
        [again] = statements.alone_with(x.run_id)
        assert again.thread == x.name and again.rows is None  # its own thread; still waiting

    x.finish()
    completed_with_its_step(x)
    assert again.outcomes() == ["held"]
    assert len(statements.carrying(x.run_id)) == 2, statements.describe()
    assert sorted(finishes) == sorted((c.workflow_id, "completed", c.name) for c in (x, y, z, w) if c is not None)


# --- d. a group the database refuses ----------------------------------------------------------------------------


def test_a_refused_group_is_sent_again_commit_by_commit(callers, statements, finishes):
    table = WorkflowStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT gc_test_no_poison CHECK ("name" <> \'poison\')')
    try:
        x, y = callers("x", "y")
        [p] = callers("p", poison=True)
        group_behind(statements, x, [(p, p.gate), (y, y.gate)])
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT IF EXISTS gc_test_no_poison')

    run_p = Workflow.objects.get(workflow_id=p.workflow_id)
    assert (run_p.status, run_p.termination_reason) == (RunStatus.FAILED, "database_refused"), (
        run_p.status, run_p.error)
    assert "gc_test_no_poison" in str(run_p.error), run_p.error
    assert journal(run_p.run_id) == []
    for caller in (x, y):
        completed_with_its_step(caller)
    # The group of P and Y was sent and refused, then each of its commits alone: P's refused again, Y's held.
    [group] = statements.grouped(p.run_id, y.run_id) or [None]
    assert group is not None and "gc_test_no_poison" in (group.error or ""), statements.describe()
    p_alone, y_alone = statements.alone_with(p.run_id), statements.alone_with(y.run_id)
    assert p_alone and "gc_test_no_poison" in (p_alone[0].error or ""), statements.describe()
    assert [s.outcomes() for s in y_alone] == [["held"]], statements.describe()
    assert statements.statements.index(group) < statements.statements.index(p_alone[0])
    assert sorted(finishes) == sorted([(x.workflow_id, "completed", x.name), (y.workflow_id, "completed", y.name),
                                       (p.workflow_id, "failed", p.name)]), finishes


# --- e. a group whose reply was lost --------------------------------------------------------------------------


class ReplyDropper:
    """A TCP proxy to the test database that passes everything on, but for the first group statement of two
    commits or more: it lets the server run (and commit) it, then closes both sides instead of passing on the
    server's answer, as a connection that breaks at that moment would."""

    MARK = b"u1 AS (UPDATE"

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()  # the statement went to the server
        self.dropped = threading.Event()  # and the server's reply was dropped after its ReadyForQuery
        threading.Thread(target=self._serve, name="reply-dropper", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            mine = threading.Event()  # this connection carried the statement
            threading.Thread(target=self._up, args=(client, server, mine), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, mine), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, mine: threading.Event) -> None:
        tail = b""
        try:
            while data := client.recv(65536):
                if not self.armed.is_set() and self.MARK in tail + data:
                    mine.set()  # before the server can answer it
                    self.armed.set()
                tail = data[-len(self.MARK):]
                server.sendall(data)
        except OSError:
            pass
        finally:
            self._close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, mine: threading.Event) -> None:
        held = b""  # the reply to the statement, held back message by message until its ReadyForQuery
        try:
            while data := server.recv(65536):
                if not mine.is_set():
                    client.sendall(data)
                    continue
                held += data
                while len(held) >= 5:
                    size = int.from_bytes(held[1:5], "big")
                    if len(held) < 1 + size:
                        break
                    if held[:1] == b"Z":  # ReadyForQuery: the statement committed on the server
                        self.dropped.set()
                        return
                    held = held[1 + size:]
        except OSError:
            pass
        finally:
            self._close(client, server)

    @staticmethod
    def _close(*sockets: socket.socket) -> None:
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


LEASE = float(SHORT_LEASE["WEFT_LEASE_SECONDS"])


@override_settings(WEFT_LEASE_SECONDS=LEASE, WEFT_HEARTBEAT_SECONDS=1)
def test_a_group_whose_reply_was_lost_is_left_to_its_leases(callers, statements):
    """The group of Y's and Z's mid-run step commits goes on Y's connection, through a proxy that lets the
    server commit it and then breaks the connection instead of passing the reply on: the outcome is unknown to
    both executors, so each is told of a transient error and its run is left to its lease (not sent again,
    which would try to insert the committed step a second time and fail the run as database_refused). Past the
    lease a maintenance pass takes both runs over and finishes them from their journals: the step the lost
    group recorded is not executed again."""
    host, port = connection.settings_dict["HOST"], connection.settings_dict["PORT"]
    if not host or host.startswith("/"):
        pytest.skip("the proxy needs the test database on TCP (DATABASE_URL=postgres://user@host:port/...)")
    proxy = ReplyDropper(host, int(port or 5432))
    try:
        [x] = callers("x")
        [y] = callers("y", workflow="gc.gated_then", port=proxy.port)
        [z] = callers("z", workflow="gc.gated_then")
        group_behind(statements, x, [(y, y.gate), (z, z.gate)])  # Y leads the group of Y and Z, on the proxy
    finally:
        proxy.close()
    assert proxy.dropped.is_set(), f"the proxy dropped no reply\n{statements.describe()}"
    [group] = statements.grouped(y.run_id, z.run_id) or [None]
    assert group is not None and group.thread == y.name and group.error, statements.describe()
    assert "OperationalError" in group.error, group.error
    assert statements.alone_with(y.run_id) == statements.alone_with(z.run_id) == [], statements.describe()

    completed_with_its_step(x)
    for caller in (y, z):
        run = Workflow.objects.get(workflow_id=caller.workflow_id)
        assert (run.status, run.termination_reason, run.error) == (RunStatus.RUNNING, "", None), (
            caller.key, run.status, run.termination_reason, run.error)
        assert run.lease_owner, caller.key  # left to its lease
        assert journal(run.run_id) == [(1, "activity", "gc.gate", "completed")]  # the lost group committed

    expiries = Workflow.objects.filter(workflow_id__in=[y.workflow_id, z.workflow_id]).values_list(
        "runnable_at", flat=True)
    last = max(expiries)
    wait_until(lambda: timezone.now() > last, "the leases to expire", LEASE + 10)
    assert weft.run_maintenance().claimed == 2
    for caller in (y, z):
        handle = weft.get_handle(caller.workflow_id)
        run = handle.refresh()
        assert run.status == RunStatus.COMPLETED, (caller.key, run.status, run.error)
        assert handle.result(timeout=0) == [caller.key.upper()] * 2
        assert [seq for seq, *_ in journal(run.run_id)] == [1, 2]
        assert GATE_CALLS.count(caller.key) == 1, GATE_CALLS  # step 1, recorded by the lost group: not again


# --- f. an interrupted waiter ----------------------------------------------------------------------------------


class Interrupted(BaseException):
    """What a Ctrl-C or a timeout signal raises in a caller waiting in the queue (not an Exception)."""


@contextmanager
def raising_on(signum: int) -> Iterator[None]:
    def handler(received, frame) -> None:
        raise Interrupted(f"signal {received}")

    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def in_thread(action: Callable[[], None], name: str) -> tuple[threading.Thread, list[str]]:
    errors: list[str] = []

    def run() -> None:
        try:
            action()
        except BaseException:
            errors.append(traceback.format_exc())

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, errors


def later_commits_flow(callers, statements: StatementLog, interrupted: Any) -> None:
    """After the interruption: a new weft.run() commits at once, and the interrupted run was never sent."""
    [w] = callers("w")
    w.gate.go.set()
    w.finish(15)
    completed_with_its_step(w)
    assert statements.carrying(interrupted) == [], statements.describe()
    run = Workflow.objects.get(pk=interrupted)
    assert run.status == RunStatus.RUNNING and journal(run.run_id) == []  # left to its lease


def test_a_waiter_interrupted_in_the_queue_leaves_it(callers, statements):
    """This thread (the main one, where a Ctrl-C lands) calls weft.run(); its commit queues behind X's stalled
    one, then Z's behind it; a signal interrupts it there. It leaves the queue: when X's statement is done, Z
    leads and commits, and later commits go at once."""
    x, z = callers("x", "z")
    GATES["y"] = y_gate = Gate()
    main = threading.main_thread()
    left = threading.Event()

    def orchestrate() -> None:
        assert y_gate.entered.wait(TIMEOUT), "this thread never reached its activity"
        with queue_behind(statements, x, [(main, y_gate), (z, z.gate)]):
            signal.pthread_kill(main.ident, signal.SIGUSR1)  # type: ignore[arg-type]
            assert left.wait(TIMEOUT), "the interrupted weft.run() did not return"

    orchestrator, errors = in_thread(orchestrate, "orchestrator")
    with raising_on(signal.SIGUSR1), pytest.raises(Interrupted):
        try:
            weft.run("gc.gated", {"key": "y"}, workflow_id="gc-y")
        finally:
            left.set()
    orchestrator.join(TIMEOUT)
    assert not orchestrator.is_alive() and not errors, errors
    for caller in (x, z):
        caller.finish()
        completed_with_its_step(caller)
    assert statements.alone_with(z.run_id) == [] and [s.runs for s in statements.carrying(z.run_id)] == [
        [str(z.run_id)]], statements.describe()  # Z led, alone
    later_commits_flow(callers, statements, Workflow.objects.get(workflow_id="gc-y").run_id)


def test_a_waiter_interrupted_as_it_is_handed_the_lead_hands_it_on(callers, statements):
    """Y's and Z's commits queue behind X's stalled one; an exception is made pending in Y's thread (as
    PyThreadState_SetAsyncExc does: delivered once it runs again). When X's statement is done it hands the lead
    to Y, whose thread wakes into the exception: Y hands the lead on to Z, which commits."""
    x, y, z = callers("x", "y", "z")
    with queue_behind(statements, x, [(y, y.gate), (z, z.gate)]):
        pending = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(y.ident), ctypes.py_object(Interrupted))
        assert pending == 1, pending
    for caller in (x, z):
        caller.finish()
        completed_with_its_step(caller)
    y.join(TIMEOUT)
    assert not y.is_alive() and "Interrupted" in (y.error or ""), y.error
    later_commits_flow(callers, statements, y.run_id)


# --- g. a fork while a commit is in flight ---------------------------------------------------------------------


def test_a_child_forked_while_a_commit_is_in_flight_commits_its_own(callers, statements):
    """The process forks while X's commit is in flight (the queue is busy) and Y's waits behind it: the child has
    neither thread, and its own weft.run() commits at once instead of waiting behind them forever."""
    x, y = callers("x", "y")
    with queue_behind(statements, x, [(y, y.gate)]):
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 3
            try:
                def child_run() -> None:
                    try:
                        weft.run("gc.three", "child", workflow_id="gc-child")
                    finally:
                        connection.close()
                thread = threading.Thread(target=child_run, daemon=True)
                thread.start()
                thread.join(20)
                code = 1 if thread.is_alive() else 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while (reaped := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        if reaped == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child did not exit within 30s")
        assert os.waitstatus_to_exitcode(reaped[1]) == 0, "the child's weft.run() did not return within 20s"
        assert x.is_alive() and y.is_alive()  # still stalled and queued, here
    for caller in (x, y):
        caller.finish()
        completed_with_its_step(caller)
    handle = weft.get_handle("gc-child")
    assert handle.refresh().status == RunStatus.COMPLETED
    assert handle.result(timeout=0) == ["CHILD:0", "CHILD:1", "CHILD:2"]


# --- h. SIGKILL of a process driving runs on four threads --------------------------------------------------------


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
