"""Schedules ticked by several real ``weft_maintenance`` processes against PostgreSQL.

200 schedules with ``overlap="allow_all"`` (so no policy holds an occurrence back), each every 2 seconds
from its creation. (Intervals, not crons: a six-field cron every 2 seconds costs the tick about 45 ms per
schedule, as ``Cadence._cron_after`` walks the hour before each occurrence, so 100 of them cannot be
ticked every 2 seconds at all.) Three processes tick them and execute their runs for a bounded time; then
every schedule is paused in one transaction holding all their row locks (so no tick is half-way),
recording each one's next undecided occurrence; the processes finish the open runs and are stopped with
SIGTERM. The checks:

* no occurrence started two runs (the unique constraint ``weft_one_run_per_occurrence`` makes this a
  database guarantee; the test counts anyway);
* none is missing: every occurrence from the schedule's creation up to its next undecided one (computed
  here independently of the engine) either started a run or is traced as missed, and the traced misses
  add up to ``missed_fire_count``; nothing is decided twice or outside that range;
* every run completed with its one step, its activity executed once (SIGKILL aside: an activity in flight
  in the killed process may run again elsewhere), and more than one process executed runs.

Whether the processes keep up (no misses) depends on the machine, so misses are not failures as long as
they are traced and counted; the numbers are printed (run with ``-s`` to see them).

Every wait has a deadline; every subprocess is killed when the test ends; failures carry their output.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from django.db import transaction
from django.db.models import Count

import django_weft as weft
from django_weft.models import (
    OccurrenceOutcome,
    RunStatus,
    Schedule,
    ScheduleOccurrence,
    ScheduleStatus,
    Workflow,
    WorkflowStep,
)
from tests.procs import SHORT_LEASE, Maintenance, bound_lock_waits, outputs, wait_until
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULES = 200
WORKFLOW = "test.scheduled_pid"  # tests/testapp/schedule_workflows.py: records its pid, keyed by workflow id
EVERY = timedelta(seconds=2)
MISSED = (OccurrenceOutcome.MISSED, OccurrenceOutcome.OUTSIDE_CATCHUP)


# --- helpers -----------------------------------------------------------------------------------------------


def start_processes(maintenance, names: list[str], **env: str) -> list[Maintenance]:
    procs = [maintenance(name, "--workers", "2", "--interval", "0.2", **env) for name in names]
    wait_until(lambda: all("running with" in proc.stdout() for proc in procs),
               f"{len(procs)} process(es) to start", 60, procs)
    return procs


def create_schedules() -> None:
    """Each schedule commits on its own, so the running processes tick the first ones while the last ones
    are being created."""
    for n in range(SCHEDULES):
        weft.create_schedule(f"sched-{n:03d}", WORKFLOW, 0, overlap="allow_all", every=EVERY)


def keep_running(seconds: float, procs: list[Maintenance]) -> None:
    """Let ``procs`` work for ``seconds``; fail at once if one of them exits meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for proc in procs:
            if not proc.alive:
                pytest.fail(f"{proc.name} exited while the schedules were running\n{outputs(procs)}")
        time.sleep(0.1)


def pause_all() -> dict[int, datetime]:
    """Pause every schedule in one transaction holding all their row locks (taken after any tick in
    progress commits), and return each one's next undecided occurrence as it was at that moment."""
    with transaction.atomic():
        bound_lock_waits(90)  # a bounded wait for the ticks in progress
        locked = list(Schedule.objects.select_for_update().order_by("pk"))
        bounds = {schedule.pk: schedule.next_fire_at for schedule in locked}
        for schedule in locked:
            assert schedule.status == ScheduleStatus.ACTIVE, (schedule.schedule_id, schedule.status, schedule.note)
            schedule.pause("test over")
    return bounds


def drain_and_stop(procs: list[Maintenance], all_procs: list[Maintenance]) -> None:
    """Wait for the live ``procs`` to finish every open run, then SIGTERM them: each must exit with 0."""
    open_runs = Workflow.objects.filter(status__in=RunStatus.open_values())
    wait_until(lambda: not open_runs.exists(), "every scheduled run to finish", 120, procs,
               describe=lambda: f"{open_runs.count()} run(s) still open")
    for proc in procs:
        proc.send(signal.SIGTERM)
    for proc in procs:
        code = proc.wait(60)
        assert code == 0, f"{proc.name} exited with {code}\n{outputs(all_procs)}"


def occurrences_before(schedule: Schedule, bound: datetime) -> list[datetime]:
    """Every occurrence after the schedule's creation and before ``bound``, computed here with croniter and
    interval arithmetic (no DST in these tests' zone), not with the engine's own cadence code."""
    moments: list[datetime] = []
    if schedule.every is not None:
        assert schedule.start_at is None and schedule.anchor == schedule.created_at
        moment = schedule.anchor + schedule.every
        while moment < bound:
            moments.append(moment)
            moment += schedule.every
        return moments
    zone = ZoneInfo(schedule.timezone)
    walls = croniter(schedule.cron, schedule.created_at.astimezone(zone).replace(tzinfo=None),
                     ret_type=datetime, second_at_beginning=True)
    while True:
        moment = walls.get_next(datetime).replace(tzinfo=zone).astimezone(UTC)
        if moment >= bound:
            return moments
        moments.append(moment)


def check_schedules(bounds: dict[int, datetime], procs: list[Maintenance], killed: Maintenance | None = None) -> dict:
    """Every assertion on the final state; returns the numbers for the report."""
    context = outputs(procs)
    schedules = {s.pk: s for s in Schedule.objects.all()}
    assert len(schedules) == SCHEDULES
    runs = list(Workflow.objects.values("pk", "workflow_id", "schedule_id", "scheduled_for", "status"))

    # 1. No duplicates: one run per (schedule, scheduled_for), and so as many runs as distinct occurrences.
    duplicated = list(Workflow.objects.values("schedule_id", "scheduled_for").annotate(n=Count("pk"))
                      .filter(n__gt=1)[:10])
    assert not duplicated, f"occurrences with more than one run: {duplicated}"
    assert all(run["schedule_id"] is not None and run["scheduled_for"] is not None for run in runs), (
        [run for run in runs if run["schedule_id"] is None or run["scheduled_for"] is None][:5])
    per_schedule = Counter(run["schedule_id"] for run in runs)
    distinct = dict(Workflow.objects.values_list("schedule_id").annotate(n=Count("scheduled_for", distinct=True)))
    assert per_schedule == Counter(distinct), "runs per schedule differ from distinct occurrences per schedule"

    # 2. None missing: from creation up to the next undecided occurrence, each one started a run or is
    # traced as missed; nothing was decided twice or outside that range; missed_fire_count adds up.
    started: dict[int, Counter] = defaultdict(Counter)
    for run in runs:
        started[run["schedule_id"]][run["scheduled_for"]] += 1
    traces = list(ScheduleOccurrence.objects.order_by("scheduled_for")
                  .values("schedule_id", "scheduled_for", "outcome", "count", "run_id", "decided_at"))
    # pause_all() traces what had fallen due at its moment as paused: from each bound on, never before it.
    paused = [t for t in traces if t["outcome"] == OccurrenceOutcome.PAUSED]
    assert all(t["scheduled_for"] == bounds[t["schedule_id"]] for t in paused), paused[:5]
    traces = [t for t in traces if t["outcome"] != OccurrenceOutcome.PAUSED]
    unexpected = Counter(t["outcome"] for t in traces if t["outcome"] not in (OccurrenceOutcome.STARTED, *MISSED))
    assert not unexpected, f"allow_all schedules should only start or miss occurrences: {unexpected}"
    windows: dict[int, list[tuple[datetime, int]]] = defaultdict(list)
    late: list[float] = []  # how late the tick that counted each missed window came, in seconds
    for trace in traces:
        if trace["outcome"] in MISSED:
            windows[trace["schedule_id"]].append((trace["scheduled_for"], trace["count"]))
            late.append((trace["decided_at"] - trace["scheduled_for"]).total_seconds())
    problems: list[str] = []
    missed: dict[int, int] = {}
    for pk, schedule in schedules.items():
        name, bound = schedule.schedule_id, bounds[pk]
        if bound is None:
            problems.append(f"{name}: no next occurrence when it was paused")
            continue
        expected = occurrences_before(schedule, bound)
        index = {moment: i for i, moment in enumerate(expected)}
        decided = Counter(started[pk])
        for first, count in windows[pk]:
            if first not in index:
                problems.append(f"{name}: a missed window starts at {first}, not an occurrence in range")
                continue
            window = expected[index[first]:index[first] + count]
            if len(window) != count:
                problems.append(f"{name}: the missed window at {first} of {count} runs past {bound}")
            decided.update(window)
        missed[pk] = sum(count for _, count in windows[pk])
        unaccounted = [m for m in expected if m not in decided]
        twice = sorted(m for m, n in decided.items() if n > 1)
        outside = sorted(m for m in decided if m not in index)
        if unaccounted or twice or outside:
            problems.append(f"{name}: {len(unaccounted)} unaccounted {unaccounted[:3]}, {len(twice)} decided twice "
                            f"{twice[:3]}, {len(outside)} outside (creation, {bound}) {outside[:3]}")
        if schedule.missed_fire_count != missed[pk]:
            problems.append(f"{name}: missed_fire_count {schedule.missed_fire_count}, {missed[pk]} traced")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:20]) + f"\n{context}"

    # Each run has exactly one 'started' trace pointing at it.
    started_traces = Counter(t["run_id"] for t in traces if t["outcome"] == OccurrenceOutcome.STARTED)
    assert started_traces == Counter(run["pk"] for run in runs), "started traces do not match the runs one-to-one"

    # 3. Every run completed, its one step recorded once, its activity executed in one of our processes.
    statuses = Counter(run["status"] for run in runs)
    assert statuses == {RunStatus.COMPLETED: len(runs)}, (statuses, context)
    steps = Counter(WorkflowStep.objects.filter(status="completed").values_list("run_id", flat=True))
    assert steps == Counter(run["pk"] for run in runs), "runs without exactly one completed step"
    assert not WorkflowStep.objects.exclude(status="completed").exists()
    executions: dict[str, list[int]] = defaultdict(list)
    for key, pid in Execution.objects.order_by("id").values_list("key", "pid"):
        executions[key].append(pid)
    assert set(executions) == {run["workflow_id"] for run in runs}, "executions without a run, or runs without one"
    killed_pid = killed.pid if killed is not None else None
    repeated = {key: pids for key, pids in executions.items() if len(pids) != 1}
    # Only an activity in flight in the killed process may have run again (at-least-once); elsewhere, once.
    wrong = {key: pids for key, pids in repeated.items()
             if killed_pid is None or len([p for p in pids if p != killed_pid]) != 1}
    assert not wrong, f"activities executed more than once: {list(wrong.items())[:10]}"
    by_pid = Counter(pid for pids in executions.values() for pid in pids)
    names = {proc.pid: proc.name for proc in procs}
    assert set(by_pid) <= set(names), (by_pid, names)
    assert len(by_pid) > 1, f"only one process executed runs: {by_pid}\n{context}"

    misses_at = [t["scheduled_for"] for t in traces if t["outcome"] in MISSED]
    created = min(schedule.created_at for schedule in schedules.values())
    return {
        "runs": len(runs),
        "missed": sum(missed.values()),
        "missed_windows": sum(len(w) for w in windows.values()),
        "schedules_with_misses": sum(1 for n in missed.values() if n),
        "missed_tick_lateness_s": f"{min(late):.2f}..{max(late):.2f}" if late else "-",
        # When the first missed occurrence was due, counted from the first schedule's creation.
        "first_miss_at_s": f"{(min(misses_at) - created).total_seconds():.1f}" if misses_at else "-",
        "schedules_without_runs": sum(1 for pk in schedules if not started[pk]),
        "executed_by": {names[pid]: n for pid, n in sorted(by_pid.items())},
        "executed_again_after_kill": len(repeated),
    }


def report(title: str, numbers: dict) -> None:
    print(f"\n[{title}] " + ", ".join(f"{key}={value}" for key, value in numbers.items()))


def executions_per_pid() -> dict[int, int]:
    return dict(Execution.objects.values_list("pid").annotate(n=Count("id")))


# --- tests ---------------------------------------------------------------------------------------------------


def test_three_processes_tick_200_schedules_without_duplicates_or_gaps(row_locks, maintenance):
    procs = start_processes(maintenance, ["proc0", "proc1", "proc2"])
    create_schedules()
    keep_running(14, procs)
    bounds = pause_all()
    drain_and_stop(procs, procs)
    report("3 processes", check_schedules(bounds, procs))


def test_a_process_killed_mid_way_and_restarted_loses_and_doubles_no_occurrence(row_locks, maintenance):
    # A short lease, so that runs the killed process held are taken over within seconds.
    procs = start_processes(maintenance, ["proc0", "proc1", "proc2"], **SHORT_LEASE)
    create_schedules()
    victim = procs[0]
    # Killed only once it is verifiably doing its share of the work.
    wait_until(lambda: Execution.objects.filter(pid=victim.pid).count() >= 20,
               "the first process to execute some scheduled runs", 60, procs,
               describe=lambda: f"executions per pid: {executions_per_pid()}")
    keep_running(2, procs)
    victim.popen.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL, victim.output()

    survivors = procs[1:]
    keep_running(5, survivors)  # the other two keep ticking through the gap
    restarted = start_processes(maintenance, ["proc0-restarted"], **SHORT_LEASE)[0]
    live = [*survivors, restarted]
    keep_running(7, live)
    bounds = pause_all()
    all_procs = [*procs, restarted]
    drain_and_stop(live, all_procs)
    report("SIGKILL + restart", check_schedules(bounds, all_procs, killed=victim))
