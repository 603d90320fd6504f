"""A bounded soak test (``-m soak``, PostgreSQL only; ``make soak``, deselected by default).

4 ``weft_maintenance`` processes (2 executor threads each, a 3 s lease) work through 2,000 runs started
through the public API over about a minute, mixing activities, durable sleeps, signals and schedules,
while one process is killed with SIGKILL (round-robin) and replaced at once every 20 s:

* activity-only runs (2-4 steps), runs with 1-2 durable sleeps of 0.5-3 s between activities;
* runs started with ``weft.start`` that wait for 1-3 signals sent by sender threads with ``weft.signal``,
  and runs started by ``weft.start_or_signal`` whose further signals use it too; about a third of the
  signals are sent twice with one ``signal_id`` (the last one of a run twice in one transaction, since
  the run may finish as soon as it has it);
* 10 interval schedules (every 2 or 3 s, ``overlap="allow_all"``) whose runs sleep between two activities,
  paused (in one transaction holding all their row locks) once every planned run and signal is sent.

When every run has finished (bounded by a deadline that fails with diagnostics), the live processes are
stopped with SIGTERM and must exit with 0. Then every run completed exactly once with the expected result
(the signal workflows return the payloads they consumed, in order, compared with what was sent), each
workflow id has one run, every journal has exactly its expected steps, once each; every signal row was
stored once (duplicates deduplicated) and consumed once; no schedule occurrence started two runs. An
activity may run again only if it was in flight in a killed process (at-least-once): every execution of
a key but its last must be in a killed process, and there are at most kills x executor threads of them.

Run with ``-s`` to see the summary. WEFT_SOAK_SEED replays a plan; WEFT_SOAK_RUNS changes the run count.
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import signal
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Count

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import (
    OccurrenceOutcome,
    RunStatus,
    Schedule,
    ScheduleOccurrence,
    ScheduleStatus,
    Signal,
    Workflow,
    WorkflowStep,
)
from tests.procs import SHORT_LEASE, Maintenance, bound_lock_waits, wait_until
from tests.testapp.models import Execution

pytestmark = [pytest.mark.soak, pytest.mark.django_db(transaction=True)]

PROCESSES = 4
WORKERS = 2  # executor threads per process: at most this many activities in flight when one is killed
KILL_EVERY = 20.0
RUNS = int(os.environ.get("WEFT_SOAK_RUNS", "2000"))
START_OVER = 120.0  # seconds over which the planned runs are started (so about 6 kills happen meanwhile)
SENDERS = 3  # threads sending signals; each owns the signals of a third of the runs, so sends in order
SCHEDULES = 10
SCHEDULED_SLEEP = 1.0
# From the first start until every run has finished: normally START_OVER plus a few seconds; a slow,
# shared machine gets room, but the test ends with diagnostics rather than hanging.
DEADLINE = 300.0
STOP_TIMEOUT = 60.0
SIGNAL = "item"
ACTIVITY = ("activity", "soak.step")
SLEEP = ("sleep", "sleep")
WAIT = ("signal", SIGNAL)


# --- the plan ----------------------------------------------------------------------------------------------


@dataclass
class Send:
    index: int
    at: float  # seconds after the load began
    duplicate: bool  # sent twice with one signal_id
    last: bool


@dataclass
class Planned:
    number: int
    workflow_id: str
    workflow: str
    input: object
    at: float
    via: str  # "start" or "start_or_signal" (the first send starts the run)
    expected: object
    journal: list[tuple[str, str]]
    keys: list[str]
    sends: list[Send] = field(default_factory=list)

    def signal_id(self, index: int) -> str:
        return f"{self.workflow_id}/sig-{index}"

    def payload(self, index: int) -> str:
        return f"{self.workflow_id}/item-{index}"


def make_plan(rng: random.Random, runs: int) -> list[Planned]:
    kinds = (["activities"] * (runs * 35 // 100) + ["sleeps"] * (runs * 25 // 100)
             + ["start_or_signal"] * (runs * 15 // 100))
    kinds += ["signals"] * (runs - len(kinds))
    rng.shuffle(kinds)
    plan = []
    for number, kind in enumerate(kinds):
        wid = f"soak-{number:04d}-{kind}"
        at = START_OVER * number / runs
        if kind == "activities":
            steps = rng.randint(2, 4)
            keys = [f"{wid}:{i}" for i in range(steps)]
            plan.append(Planned(number, wid, "soak.activities", steps, at, "start", keys, [ACTIVITY] * steps, keys))
        elif kind == "sleeps":
            seconds = [round(rng.uniform(0.5, 3.0), 1) for _ in range(rng.randint(1, 2))]
            keys = [f"{wid}:{i}" for i in range(len(seconds) + 1)]
            plan.append(Planned(number, wid, "soak.sleeps", seconds, at, "start", keys,
                                [ACTIVITY, *[SLEEP, ACTIVITY] * len(seconds)], keys))
        else:
            count = rng.randint(1, 3)
            via = "start" if kind == "signals" else "start_or_signal"
            planned = Planned(number, wid, "soak.signals", count, at, via, None,
                              [ACTIVITY, *[WAIT] * count, ACTIVITY], [f"{wid}:0", f"{wid}:1"])
            planned.expected = [planned.payload(i) for i in range(count)]
            moment = at if via == "start_or_signal" else at + rng.uniform(0.2, 3.0)
            for index in range(count):
                planned.sends.append(Send(index, moment, rng.random() < 0.3, index == count - 1))
                moment += rng.uniform(0.2, 3.0)
            plan.append(planned)
    return plan


# --- threads: the producer and the signal senders ----------------------------------------------------------


class Load:
    """The producer thread starts the planned runs on time; SENDERS threads send their signals, each one
    in the order planned for its runs. Every outcome is recorded; every exception is kept for the test."""

    def __init__(self, plan: list[Planned], began: float) -> None:
        self.plan, self.began = plan, began
        self.errors: list[str] = []
        self.outcomes: dict[tuple[str, int], list[object]] = {}
        self.queues: list[list[tuple[float, int, Planned, Send]]] = [[] for _ in range(SENDERS)]
        self.cond = threading.Condition()
        self.produced = 0
        self.producing = True
        self.stopping = False
        self.sent = 0
        self.order = itertools.count()
        self.threads = [threading.Thread(target=self._guard, args=(self._produce,), name="producer", daemon=True)]
        self.threads += [threading.Thread(target=self._guard, args=(lambda i=i: self._send(i),), name=f"sender-{i}",
                                          daemon=True) for i in range(SENDERS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """Make every thread end soon (a failing test must not leave them writing to the database)."""
        with self.cond:
            self.stopping = True
            self.producing = False
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(30)

    @property
    def done(self) -> bool:
        return not any(thread.is_alive() for thread in self.threads)

    def describe(self) -> str:
        with self.cond:
            queued = [len(queue) for queue in self.queues]
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        return (f"load: {self.produced}/{len(self.plan)} planned runs handled by the producer, {self.sent} "
                f"signal sends done, queued per sender {queued}, threads alive {alive}")

    def _guard(self, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException:
            self.errors.append(f"{threading.current_thread().name}:\n{traceback.format_exc()}")
            with self.cond:
                self.producing = False  # let the others end too
                self.cond.notify_all()
        finally:
            connection.close()

    def _sleep_until(self, at: float) -> None:
        delay = self.began + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _produce(self) -> None:
        try:
            for planned in self.plan:
                if self.errors or self.stopping:
                    return
                self._sleep_until(planned.at)
                if planned.via == "start":
                    weft.start(planned.workflow, planned.input, workflow_id=planned.workflow_id)
                with self.cond:
                    for send in planned.sends:
                        heapq.heappush(self.queues[planned.number % SENDERS],
                                       (send.at, next(self.order), planned, send))
                    self.produced += 1
                    self.cond.notify_all()
        finally:
            with self.cond:
                self.producing = False
                self.cond.notify_all()

    def _next_send(self, queue: list[tuple[float, int, Planned, Send]]) -> tuple[Planned, Send] | None:
        """The next send of this sender's queue once it is due; None when there will be none."""
        with self.cond:
            while not self.errors and not self.stopping:
                if queue and self.began + queue[0][0] <= time.monotonic():
                    _, _, planned, send = heapq.heappop(queue)
                    return planned, send
                if not queue and not self.producing:
                    return None
                wait = self.began + queue[0][0] - time.monotonic() if queue else 1.0
                self.cond.wait(max(0.001, min(wait, 1.0)))
            return None

    def _send(self, sender: int) -> None:
        queue = self.queues[sender]
        while (item := self._next_send(queue)) is not None:
            planned, send = item
            self.outcomes[(planned.workflow_id, send.index)] = deliver(planned, send)
            self.sent += 1


def deliver(planned: Planned, send: Send) -> list[object]:
    """One planned send (twice if it is a duplicate): weft.signal's booleans or start_or_signal's outcomes."""
    signal_id, payload = planned.signal_id(send.index), planned.payload(send.index)

    def once() -> object:
        if planned.via == "start":
            return weft.signal(planned.workflow_id, SIGNAL, payload, signal_id=signal_id)
        return weft.start_or_signal(planned.workflow, planned.input, signal=SIGNAL, payload=payload,
                                    workflow_id=planned.workflow_id, signal_id=signal_id).outcome

    if not send.duplicate:
        return [once()]
    if send.last:  # the run can finish once it has its last signal: send both copies in one transaction
        with transaction.atomic():
            return [once(), once()]
    return [once(), once()]


def expected_outcomes(planned: Planned, send: Send) -> list[object]:
    if planned.via == "start":
        first, again = True, False
    else:
        first, again = ("started" if send.index == 0 else "signalled"), "signalled"
    return [first, again] if send.duplicate else [first]


# --- processes ---------------------------------------------------------------------------------------------


class Fleet:
    """PROCESSES weft_maintenance processes in slots; ``kill_next`` SIGKILLs the next slot's process
    (round-robin) and starts its replacement at once. Keeps every process, dead or alive, for output."""

    def __init__(self, maintenance: Callable[..., Maintenance]) -> None:
        self.maintenance = maintenance
        self.slots = [self._start(slot, 0) for slot in range(PROCESSES)]
        self.every: list[Maintenance] = list(self.slots)
        self.killed: list[Maintenance] = []

    def _start(self, slot: int, generation: int) -> Maintenance:
        return self.maintenance(f"proc{slot}.{generation}", "--workers", str(WORKERS), "--interval", "0.2",
                                **SHORT_LEASE)

    def kill_next(self) -> Maintenance:
        slot = len(self.killed) % PROCESSES
        victim = self.slots[slot]
        victim.popen.send_signal(signal.SIGKILL)
        code = victim.wait(10)
        assert code == -signal.SIGKILL, f"{victim.name} exited with {code}, not by SIGKILL\n{victim.output()}"
        self.killed.append(victim)
        replacement = self._start(slot, len(self.killed) // PROCESSES + 1)
        self.slots[slot] = replacement
        self.every.append(replacement)
        return victim

    def check_alive(self, context: Callable[[], str]) -> None:
        for proc in self.slots:
            if not proc.alive:
                pytest.fail(f"{proc.name} exited on its own\n{context()}\n{self.output()}")

    def output(self, lines: int = 40) -> str:
        """The end of every process's output (a failure message must stay readable)."""
        parts = []
        for proc in self.every:
            out = proc.stdout().splitlines()[-lines:]
            err = proc.stderr().splitlines()[-lines:]
            parts.append(f"--- {proc.name} (pid {proc.pid}, exit code {proc.popen.poll()}) stdout tail:\n"
                         + "\n".join(out) + f"\n--- {proc.name} stderr tail:\n" + "\n".join(err))
        return "\n".join(parts)


# --- schedules ---------------------------------------------------------------------------------------------


def create_schedules() -> None:
    for n in range(SCHEDULES):
        weft.create_schedule(f"soak-sched-{n}", "soak.scheduled", SCHEDULED_SLEEP, overlap="allow_all",
                             every=timedelta(seconds=2 + n % 2))


def pause_schedules() -> None:
    """Pause every schedule in one transaction holding all their row locks (taken after any tick in
    progress commits), so no tick is half-way and none starts a run afterwards."""
    with transaction.atomic():
        bound_lock_waits(90)  # a bounded wait for the ticks in progress
        for schedule in Schedule.objects.select_for_update().order_by("pk"):
            assert schedule.status == ScheduleStatus.ACTIVE, (schedule.schedule_id, schedule.status, schedule.note)
            schedule.pause("soak test over")


# --- diagnostics -------------------------------------------------------------------------------------------


def describe_runs() -> str:
    by = sorted(Workflow.objects.values_list("workflow_type", "status").annotate(n=Count("pk")))
    lines = [f"runs by (type, status, count): {by}"]
    stuck = Workflow.objects.filter(status__in=RunStatus.open_values()).order_by("created_at")[:10]
    for run in stuck:
        steps = list(WorkflowStep.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "status"))
        signals = list(Signal.objects.filter(run=run).order_by("sequence")
                       .values_list("sequence", "signal_id", "consumed_by_seq"))
        lines.append(f"  open: {run.workflow_id} {run.status} wait_reason={run.wait_reason!r} "
                     f"lease_owner={run.lease_owner!r} runnable_at={run.runnable_at} fence={run.fence} "
                     f"inbox_seq={run.inbox_seq} awaiting={run.awaiting_signals} journal={steps} signals={signals}")
    return "\n".join(lines)


# --- the test ----------------------------------------------------------------------------------------------


def test_soak_four_processes_2000_runs_with_a_sigkill_every_20s(row_locks, maintenance):
    seed = int(os.environ.get("WEFT_SOAK_SEED") or random.SystemRandom().randrange(1, 2**31))
    print(f"\n[soak] seed={seed} (WEFT_SOAK_SEED={seed} replays this plan), runs={RUNS}")
    plan = make_plan(random.Random(seed), RUNS)
    wall_began = time.monotonic()

    fleet = Fleet(maintenance)
    wait_until(lambda: all("running with" in proc.stdout() for proc in fleet.slots),
               f"the {PROCESSES} processes to start", 60, fleet.slots)
    create_schedules()

    began = time.monotonic()
    load = Load(plan, began)
    load.start()
    deadline = began + DEADLINE
    next_kill = began + KILL_EVERY
    paused_at: float | None = None
    load_done_at: float | None = None
    open_runs = Workflow.objects.filter(status__in=RunStatus.open_values())

    def context() -> str:
        return f"seed={seed}, {len(fleet.killed)} kill(s)\n{load.describe()}\n{describe_runs()}"

    try:
        while True:
            if load.errors:
                pytest.fail(f"the load failed:\n{load.errors[0]}\n{context()}\n{fleet.output()}")
            fleet.check_alive(context)
            now = time.monotonic()
            if now >= next_kill:
                victim = fleet.kill_next()
                print(f"[soak] {now - began:6.1f}s SIGKILL {victim.name} (pid {victim.pid}); "
                      f"{open_runs.count()} open run(s)")
                next_kill += KILL_EVERY
            if paused_at is None and load.done:
                load_done_at = now
                pause_schedules()
                paused_at = time.monotonic()
            if paused_at is not None and not open_runs.exists():
                break
            if now > deadline:
                pytest.fail(f"not every run finished within {DEADLINE}s\n{context()}\n{fleet.output()}")
            time.sleep(0.2)
    finally:
        load.stop()
    drained = time.monotonic()

    live = list(fleet.slots)
    for proc in live:
        proc.send(signal.SIGTERM)
    for proc in live:
        code = proc.wait(STOP_TIMEOUT)
        assert code == 0, f"{proc.name} exited with {code} after SIGTERM\n{fleet.output()}"
    stopped = time.monotonic()

    numbers = check(plan, load, fleet)
    numbers.update({
        "load_s": f"{load_done_at - began:.1f}",
        "drain_s": f"{drained - paused_at:.1f}",
        "stop_s": f"{stopped - drained:.1f}",
        "wall_s": f"{time.monotonic() - wall_began:.1f}",
    })
    print("[soak] " + ", ".join(f"{key}={value}" for key, value in numbers.items()))


def check(plan: list[Planned], load: Load, fleet: Fleet) -> dict:
    """Every assertion on the final state; returns the numbers for the summary."""
    by_id = {planned.workflow_id: planned for planned in plan}
    runs = list(Workflow.objects.values("run_id", "workflow_id", "workflow_type", "status", "result", "error",
                                        "schedule_id", "scheduled_for", "restarted_from_id"))

    # Every run completed, once per workflow id: the planned ones and the ones the schedules started.
    statuses = Counter(run["status"] for run in runs)
    assert statuses == {RunStatus.COMPLETED: len(runs)}, (
        statuses, [(r["workflow_id"], r["status"], r["error"]) for r in runs if r["status"] != "completed"][:10])
    per_id = Counter(run["workflow_id"] for run in runs)
    assert not [wid for wid, n in per_id.items() if n > 1], [(wid, n) for wid, n in per_id.items() if n > 1][:10]
    assert not [run for run in runs if run["restarted_from_id"] is not None]
    planned_runs = [run for run in runs if run["schedule_id"] is None]
    scheduled_runs = [run for run in runs if run["schedule_id"] is not None]
    assert {run["workflow_id"] for run in planned_runs} == set(by_id), "planned runs missing, or runs not planned"
    assert all(run["workflow_type"] == "soak.scheduled" and run["scheduled_for"] is not None
               for run in scheduled_runs)

    # The expected result of each: for the signal workflows, the payloads consumed in the order sent, so a
    # lost, duplicated or reordered signal shows here.
    expected: dict[str, object] = {wid: planned.expected for wid, planned in by_id.items()}
    keys: dict[str, list[str]] = {wid: planned.keys for wid, planned in by_id.items()}
    journals: dict[str, list[tuple[str, str]]] = {wid: planned.journal for wid, planned in by_id.items()}
    for run in scheduled_runs:
        wid = run["workflow_id"]
        keys[wid] = [f"{wid}:0", f"{wid}:1"]
        expected[wid] = keys[wid]
        journals[wid] = [ACTIVITY, SLEEP, ACTIVITY]
    wrong = [(run["workflow_id"], decode(run["result"])) for run in runs
             if decode(run["result"]) != expected[run["workflow_id"]]]
    assert not wrong, f"{len(wrong)} run(s) with an unexpected result: {wrong[:5]}"

    # Every journal: exactly its expected steps, in seq order 1..n, each completed, none recorded twice.
    wid_of = {run["run_id"]: run["workflow_id"] for run in runs}
    steps: dict[str, list[tuple[int, str, str, str]]] = defaultdict(list)
    rows = WorkflowStep.objects.order_by("run_id", "seq").values_list("run_id", "seq", "kind", "name", "status")
    for run_id, seq, kind, name, status in rows.iterator(chunk_size=5000):
        steps[wid_of[run_id]].append((seq, kind, name, status))
    twice = list(WorkflowStep.objects.values("run_id", "seq").annotate(n=Count("id")).filter(n__gt=1)[:10])
    assert not twice, f"steps recorded twice: {twice}"
    bad_journals = []
    for wid, want in journals.items():
        got = steps.get(wid, [])
        if ([seq for seq, *_ in got] != list(range(1, len(want) + 1)) or [(k, n) for _, k, n, _ in got] != want
                or any(status != "completed" for *_, status in got)):
            bad_journals.append((wid, got, want))
    assert not bad_journals, f"{len(bad_journals)} journal(s) not as expected: {bad_journals[:5]}"
    assert set(steps) == set(journals)

    # Activity executions: each key executed; again only if it was in flight in a killed process.
    killed_pids = {proc.pid for proc in fleet.killed}
    names = {proc.pid: proc.name for proc in fleet.every}
    executions: dict[str, list[int]] = defaultdict(list)
    for key, pid in Execution.objects.order_by("id").values_list("key", "pid").iterator(chunk_size=5000):
        executions[key].append(pid)
    wanted = {key for wid in keys for key in keys[wid]}
    assert set(executions) == wanted, (
        f"never executed: {sorted(wanted - set(executions))[:10]}, unexpected: {sorted(set(executions) - wanted)[:10]}")
    repeated = {key: pids for key, pids in executions.items() if len(pids) > 1}
    again = sum(len(pids) - 1 for pids in repeated.values())
    outside_kills = {key: [names.get(pid, pid) for pid in pids] for key, pids in repeated.items()
                     if not set(pids[:-1]) <= killed_pids}
    assert not outside_kills, (
        f"activities executed again though no kill explains it: {list(outside_kills.items())[:10]}")
    assert again <= len(fleet.killed) * WORKERS, (
        f"{again} repeated executions for {len(fleet.killed)} kill(s) of {WORKERS} executor threads: "
        f"{[(key, [names.get(pid, pid) for pid in pids]) for key, pids in repeated.items()][:10]}")
    by_process = Counter(names.get(pid, f"pid {pid}") for pids in executions.values() for pid in pids)
    assert set(by_process) <= set(names.values()), by_process
    assert len(by_process) > 1, f"only one process executed activities: {by_process}"

    # Signals: each planned send answered as expected (a duplicate deduplicated), each stored once, each
    # consumed once, by the wait at its place in the journal.
    signalled = [planned for planned in plan if planned.sends]
    wrong_outcomes = [(planned.workflow_id, send.index, load.outcomes.get((planned.workflow_id, send.index)),
                       expected_outcomes(planned, send))
                      for planned in signalled for send in planned.sends
                      if load.outcomes.get((planned.workflow_id, send.index)) != expected_outcomes(planned, send)]
    assert not wrong_outcomes, f"{len(wrong_outcomes)} send(s) answered unexpectedly: {wrong_outcomes[:10]}"
    stored: dict[str, list[tuple]] = defaultdict(list)
    for run_id, name, signal_id, payload, consumed_at, consumed_by_seq in (
            Signal.objects.order_by("run_id", "sequence")
            .values_list("run_id", "name", "signal_id", "payload", "consumed_at", "consumed_by_seq")):
        stored[wid_of[run_id]].append((name, signal_id, decode(payload), consumed_at is not None, consumed_by_seq))
    assert set(stored) == {planned.workflow_id for planned in signalled}
    bad_signals = []
    for planned in signalled:
        count = len(planned.sends)
        want = [(SIGNAL, planned.signal_id(i), planned.payload(i), True, i + 2) for i in range(count)]
        if stored[planned.workflow_id] != want:
            bad_signals.append((planned.workflow_id, stored[planned.workflow_id], want))
    assert not bad_signals, f"{len(bad_signals)} run(s) with signals not stored/consumed once: {bad_signals[:5]}"

    # Schedules: no occurrence started two runs; every started trace is one run's, one-to-one.
    per_occurrence = Counter((run["schedule_id"], run["scheduled_for"]) for run in scheduled_runs)
    assert not [k for k, n in per_occurrence.items() if n > 1], [k for k, n in per_occurrence.items() if n > 1]
    traces = list(ScheduleOccurrence.objects.values_list("schedule_id", "scheduled_for", "outcome", "count",
                                                         "run_id"))
    started = Counter(run_id for _, _, outcome, _, run_id in traces if outcome == OccurrenceOutcome.STARTED)
    assert started == Counter(run["run_id"] for run in scheduled_runs), "started traces differ from the runs"
    decided_twice = [k for k, n in Counter((s, f) for s, f, o, _, _ in traces if o == OccurrenceOutcome.STARTED)
                     .items() if n > 1]
    assert not decided_twice, decided_twice
    assert scheduled_runs, "the schedules started no run"
    missed = sum(count for _, _, outcome, count, _ in traces
                 if outcome in (OccurrenceOutcome.MISSED, OccurrenceOutcome.OUTSIDE_CATCHUP))

    sends = [send for planned in signalled for send in planned.sends]
    return {
        "runs": len(runs),
        "planned_runs": len(planned_runs),
        "scheduled_runs": len(scheduled_runs),
        "missed_occurrences": missed,
        "steps": sum(len(j) for j in steps.values()),
        "signals": sum(len(s) for s in stored.values()),
        "duplicate_sends": sum(send.duplicate for send in sends),
        "start_or_signal_runs": sum(planned.via == "start_or_signal" for planned in plan),
        "kills": len(fleet.killed),
        "processes": len(fleet.every),
        "executions": sum(len(pids) for pids in executions.values()),
        "re_executed_keys": len(repeated),
        "re_executions": again,
        "executions_by_process": dict(sorted(by_process.items())),
    }
