"""Exactly-once database steps under real faults (PostgreSQL and MariaDB; design 9.4).

Three ``weft_maintenance`` processes run workflows whose steps increment a counter of the test app, while a fault
thread SIGKILLs executors (and starts replacements) and terminates their database connections at random moments.
With ``@weft.transaction`` steps every counter ends equal to its run's journal rows: nothing lost, nothing doubled.
The same workflow with plain activities (at least once) doubles some increments under the same faults, which shows
that the faults land where they matter (between a step's write and its journal row), so the first test can fail.
"""

from __future__ import annotations

import random
import signal
import threading
from collections import Counter as Tally

import pytest
from django.db import connection

import django_weft as weft
from django_weft.models import RunStatus, StepKind, StepStatus, Workflow, WorkflowStep
from tests.procs import SHORT_LEASE, wait_until
from tests.testapp.models import Counter

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 300.0
STEPS = 5
EXECUTOR_ARGS = ("--workers", "3", "--interval", "0.1")


def session_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()")
        return cursor.fetchone()[0]


def executor_connections(spared: int) -> list[int]:
    """The database sessions of the test database but this thread's and ``spared`` (the test's): the executors'."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid NOT IN (pg_backend_pid(), %s) AND backend_type = 'client backend'", [spared])
        else:
            cursor.execute("SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
                           "AND id NOT IN (CONNECTION_ID(), %s)", [spared])
        return [row[0] for row in cursor.fetchall()]


def terminate(session: int) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [session])
        else:
            try:
                cursor.execute(f"KILL CONNECTION {int(session)}")
            except Exception:  # it ended meanwhile
                pass


class Faults(threading.Thread):
    """SIGKILLs an executor (and starts its replacement) or terminates executors' connections, at random moments,
    until stopped: what the executors go through while the workflows run."""

    def __init__(self, procs: list, start_executor) -> None:
        super().__init__(daemon=True)
        self.procs, self.start_executor = procs, start_executor
        self.spared = session_id()  # the test's own session
        self.stop = threading.Event()
        self.kills = self.terminations = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        rng = random.Random(9)
        try:
            while not self.stop.wait(rng.uniform(0.1, 0.5)):
                if rng.random() < 0.4:
                    slot = rng.randrange(len(self.procs))
                    victim = self.procs[slot]
                    victim.popen.send_signal(signal.SIGKILL)
                    victim.wait(10)
                    self.procs[slot] = self.start_executor(f"replacement{self.kills}")
                    self.kills += 1
                else:
                    sessions = executor_connections(self.spared)
                    for session in rng.sample(sessions, min(len(sessions), rng.randint(1, 3))):
                        terminate(session)
                        self.terminations += 1
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            connection.close()


def run_under_faults(maintenance, runs: int, *, activities: bool) -> tuple[dict[str, int], dict[str, int], Faults]:
    """Start ``runs`` counter workflows, execute them under faults until all complete; per counter, its value and
    its run's completed journal rows."""
    def start_executor(name: str):
        return maintenance(name, *EXECUTOR_ARGS, **SHORT_LEASE)

    procs = [start_executor(f"executor{i}") for i in range(3)]
    names = [f"{'activity' if activities else 'transaction'}-{i}" for i in range(runs)]
    Counter.objects.bulk_create([Counter(name=name) for name in names])
    handles = [weft.start("exactly_once.counter", {"name": name, "steps": STEPS, "activities": activities},
                          workflow_id=name) for name in names]
    ids = [h.run_id for h in handles]
    faults = Faults(procs, start_executor)
    faults.start()
    try:
        wait_until(lambda: Workflow.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == runs,
                   f"{runs} runs to complete under faults", DEADLINE,
                   describe=lambda: f"{Tally(Workflow.objects.filter(pk__in=ids).values_list('status', flat=True))}")
    finally:
        faults.stop.set()
        faults.join(30)
    assert not faults.errors, faults.errors
    kind = StepKind.ACTIVITY if activities else StepKind.TRANSACTION
    journal = Tally(WorkflowStep.objects.filter(run_id__in=ids, kind=kind, status=StepStatus.COMPLETED)
                    .values_list("run__workflow_id", flat=True))
    values = dict(Counter.objects.filter(name__in=names).values_list("name", "value"))
    print(f"\n{runs} runs x {STEPS} {'activities' if activities else 'transaction steps'}: "
          f"{faults.kills} SIGKILLs, {faults.terminations} terminated connections")
    return values, dict(journal), faults


def test_transaction_steps_count_exactly_once_under_sigkills_and_terminated_connections(row_locks, maintenance):
    values, journal, faults = run_under_faults(maintenance, 200, activities=False)
    lost = {name: (values[name], journal.get(name, 0)) for name in values if values[name] < journal.get(name, 0)}
    doubled = {name: (values[name], journal.get(name, 0)) for name in values if values[name] > journal.get(name, 0)}
    print(f"counters equal to their journal rows: {sum(values[n] == journal.get(n, 0) for n in values)} of "
          f"{len(values)}; lost {len(lost)}, doubled {len(doubled)}")
    assert faults.kills >= 3 and faults.terminations >= 3, "the faults happened"
    assert set(journal.values()) == {STEPS}
    assert lost == {} and doubled == {}


def test_the_same_steps_as_plain_activities_double_some_increments_under_the_same_faults(row_locks, maintenance):
    values, journal, faults = run_under_faults(maintenance, 100, activities=True)
    doubled = {name: (values[name], journal.get(name, 0)) for name in values if values[name] > journal.get(name, 0)}
    print(f"activities: {len(doubled)} of {len(values)} counters counted more than their journal rows "
          f"({sum(values[n] - journal.get(n, 0) for n in doubled)} extra increments)")
    assert faults.kills >= 3 and faults.terminations >= 3, "the faults happened"
    assert set(journal.values()) == {STEPS}
    assert doubled, "at least once: some increments ran twice (else the faults missed the window the test is about)"
