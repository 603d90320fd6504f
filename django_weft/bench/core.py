"""The benchmark behind ``manage.py weft_bench``: engine throughput and latency against the raw commit rate.

Importing this module registers the ``weft.bench`` workflow and its activity, so only the bench command
imports it. :func:`run_bench` does the work and returns a JSON-safe dict; the command is argparse glue.

Phases, each timed on its own:

1. **probe** -- the database's single-connection commit rate: one-row ``INSERT`` per
   ``transaction.atomic()`` into a real (non-temporary: PostgreSQL skips the WAL flush for temporary
   tables) table ``weft_bench_probe``, dropped afterwards.
2. **start** -- ``weft.start()`` N times from one thread, each in its own transaction (one commit each),
   as a web request would.
3. **drive** -- a :class:`~django_weft.runtime.worker.Worker` with W executor threads, in this process,
   runs until every started run has finished (counted from the completed/failed signals, so nothing
   polls the database). ``workflows_per_second`` and ``steps_per_second`` are for this phase; the
   ``end_to_end_*`` figure covers start + drive.

Latency is per run: ``finished_at - created_at`` (``p50_ms``/``p95_ms``; in this batch setting it
includes the time a run queued behind the others) and ``finished_at - started_at`` (``exec_p50_ms``...:
from its claim to its completion).

:func:`run_schedule_bench` (``--schedules N``) measures the schedule tick instead: it bulk-creates N
active ``* * * * *`` UTC schedules of the bench workflow, all due at the same minute (a day ahead, so a
maintenance process on the real clock leaves them alone), then times ONE ``fire_due_schedules(now)`` pass
acting as of just after that minute, which must start exactly one run per schedule. It counts the
statements the tick sends, per schedule and by kind, and does not execute the runs. On PostgreSQL the
tables the tick touches are vacuumed (and analyzed) before the tick and after the cleanup, so one bench's
dead rows do not slow the next where autovacuum lags or is off.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.backends.signals import connection_created

from .. import signals
from ..activities import activity
from ..conf import weft_settings
from ..registry import workflow

BENCH_WORKFLOW = "weft.bench"
BENCH_ACTIVITY = "weft.bench.step"
PROBE_TABLE = "weft_bench_probe"
# The goal: with K=3 a workflow costs about five commits (start, claim, steps, completion), and
# on PostgreSQL one worker should reach 60% of raw_commits_per_second / 5.
GOAL_COMMITS_PER_WORKFLOW = 5
GOAL_RATIO_TARGET = 0.6
CHUNK = 500
WRITE_VERBS = ("INSERT", "UPDATE", "DELETE")
_WRITE_CTE = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b", re.IGNORECASE)


@activity(name=BENCH_ACTIVITY)
def bench_step(i: int) -> int:
    """Does nothing: the benchmark measures the engine, not the activity."""
    return i


@workflow(name=BENCH_WORKFLOW)
def bench_workflow(ctx: Any, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += ctx.run(bench_step, i)
    return total


class BenchError(Exception):
    """The benchmark could not complete (runs failed or did not finish in time)."""


# --- measuring helpers -------------------------------------------------------------------------------


def measure_commit_rate(seconds: float, using: str) -> tuple[float, int]:
    """Commits per second of one connection inserting one row per transaction for ``seconds``."""
    conn = connections[using]
    table = conn.ops.quote_name(PROBE_TABLE)
    with conn.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {table}")
        cursor.execute(f"CREATE TABLE {table} (v integer)")
    try:
        sql = f"INSERT INTO {table} (v) VALUES (%s)"
        count = 0
        began = time.perf_counter()
        deadline = began + seconds
        while True:
            with transaction.atomic(using=using), conn.cursor() as cursor:
                cursor.execute(sql, [count])
            count += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        return count / (now - began), count
    finally:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")


def percentile(values: list[float], pct: float) -> float | None:
    """Linear-interpolated percentile of ``values`` (0 <= pct <= 100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class _Block:
    """One outermost atomic block seen by the counter; its on_commit callback counts the commit."""

    def __init__(self, counter: SqlCounter) -> None:
        self.counter = counter
        self.wrote = False

    def __call__(self) -> None:
        self.counter.committed(self)


class SqlCounter:
    """Counts statements and committed transactions on every connection opened while it is installed.

    Installed through ``connection_created`` (the worker's threads open their own connections), as an
    execute wrapper: a statement inside an atomic block registers one on_commit callback per block, so
    each committed block counts once and rolled-back blocks not at all; a statement outside any block
    is its own (autocommit) transaction.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self.active = False
        self.counts: Counter = Counter()
        self._lock = threading.Lock()
        self._blocks: dict[int, _Block] = {}

    def _add(self, **amounts: int) -> None:
        with self._lock:
            self.counts.update(amounts)

    def committed(self, block: _Block) -> None:
        if self.active:
            self._add(commits=1, write_commits=int(block.wrote))

    def __call__(self, execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
        if self.active:
            conn = context["connection"]
            head = sql.lstrip()[:6].upper()
            is_write = head in WRITE_VERBS or (head.startswith("WITH") and _WRITE_CTE.search(sql) is not None)
            if conn.in_atomic_block:
                block = self._blocks.get(id(conn))
                if block is None or not any(entry[1] is block for entry in conn.run_on_commit):
                    block = _Block(self)
                    self._blocks[id(conn)] = block
                    transaction.on_commit(block, using=conn.alias)
                block.wrote = block.wrote or is_write
                self._add(queries=1)
            elif sql.lstrip()[:5].upper() == "BEGIN":  # SQLite opens its atomic blocks this way
                self._add(queries=1)
            else:
                self._add(queries=1, autocommit_statements=1, commits=1, write_commits=int(is_write))
        return execute(sql, params, many, context)

    def _install(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias == self.using and self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    def __enter__(self) -> SqlCounter:
        connection_created.connect(self._install, weak=False, dispatch_uid=f"weft-bench-{id(self)}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False
        connection_created.disconnect(dispatch_uid=f"weft-bench-{id(self)}")


class _Finished:
    """Collects the runs of this bench as their completed/failed signals arrive (after commit)."""

    def __init__(self, run_ids: set) -> None:
        self.pending = set(run_ids)
        self.failed: list[Any] = []
        self.done = threading.Event()
        self._lock = threading.Lock()
        if not self.pending:
            self.done.set()

    def _receive(self, failed: bool) -> Callable[..., None]:
        def receiver(sender: Any, run: Any, **kwargs: Any) -> None:
            with self._lock:
                if run.pk not in self.pending:
                    return
                self.pending.discard(run.pk)
                if failed:
                    self.failed.append(run)
                if not self.pending:
                    self.done.set()
        return receiver

    def __enter__(self) -> _Finished:
        self._receivers = [(signals.workflow_completed, self._receive(False)),
                           (signals.workflow_failed, self._receive(True))]
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)


def _chunks(items: list, size: int = CHUNK) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def delete_runs(run_ids: list) -> int:
    """Delete the given runs with their journal and timers (signals and async records cascade)."""
    from ..models import Timer, Workflow, WorkflowStep

    deleted = 0
    for ids in _chunks(run_ids):
        with transaction.atomic():
            WorkflowStep.objects.filter(run_id__in=ids).delete()
            Timer.objects.filter(run_id__in=ids).delete()
            deleted += Workflow.objects.filter(pk__in=ids).delete()[1].get("django_weft.Workflow", 0)
    return deleted


def delete_bench_runs(run_ids: list, workflow_type: str, since: Any) -> int:
    """Delete ``run_ids`` and every other run of ``workflow_type`` created since ``since``: one started
    just as the bench was interrupted may have been committed without reaching ``run_ids``. (The bench
    refuses to run beside live executors, so no other bench is creating such runs meanwhile.)"""
    from ..models import Workflow

    late = Workflow.objects.filter(workflow_type=workflow_type, created_at__gte=since).values_list("pk", flat=True)
    return delete_runs(list({*run_ids, *late}))


# --- the benchmark -----------------------------------------------------------------------------------


def run_bench(*, workflows: int, steps: int, workers: int, probe_seconds: float = 2.0,
              timeout: float = 600.0, keep: bool = False,
              progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures. Raises :class:`BenchError` if runs fail or time out."""
    from .. import client, clock
    from ..models import Workflow
    from ..runtime.worker import Worker

    using = router.db_for_write(Workflow)
    conn = connections[using]
    open_before = Workflow.objects.open().count()
    if open_before:
        progress(f"note: {open_before} open run(s) already in the database; the worker executes them too")

    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)

    run_ids: list = []
    since = clock.now()
    try:
        began = time.perf_counter()
        for _ in range(workflows):
            run_ids.append(client.start(bench_workflow, steps).run_id)
        start_seconds = time.perf_counter() - began

        worker = Worker(threads=workers)
        with SqlCounter(using) as counter, _Finished(set(run_ids)) as finished:
            counter.active = True
            thread = threading.Thread(target=worker.run, name="weft-bench-worker", daemon=True)
            began = time.perf_counter()
            thread.start()
            try:
                completed = finished.done.wait(timeout)
                drive_seconds = time.perf_counter() - began
            finally:
                # Stopped before anything else (cleanup included) touches the runs.
                counter.active = False
                worker.stop()
                thread.join()
        if not completed:
            raise BenchError(
                f"{len(finished.pending)} of {workflows} run(s) had not finished after {timeout:g}s"
            )
        if finished.failed:
            sample = finished.failed[0]
            raise BenchError(f"{len(finished.failed)} run(s) failed, e.g. {sample.pk}: {sample.error}")

        total_ms: list[float] = []
        exec_ms: list[float] = []
        for ids in _chunks(run_ids):
            for created, started, ended in Workflow.objects.filter(pk__in=ids).values_list(
                "created_at", "started_at", "finished_at"
            ):
                assert started is not None and ended is not None  # every run finished (checked above)
                total_ms.append((ended - created).total_seconds() * 1000)
                exec_ms.append((ended - started).total_seconds() * 1000)
    finally:
        if not keep:
            delete_bench_runs(run_ids, BENCH_WORKFLOW, since)

    wps = workflows / drive_seconds
    end_to_end = start_seconds + drive_seconds
    counts = counter.counts

    def per_workflow(key: str) -> float:
        return round(counts[key] / workflows, 2)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "vendor": conn.vendor,
        "workflows": workflows,
        "steps": steps,
        "workers": workers,
        "cpus": os.cpu_count(),
        "debug": bool(settings.DEBUG),
        "claim_batch_size": weft_settings.CLAIM_BATCH_SIZE,
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "start_seconds": round(start_seconds, 3),
        "starts_per_second": round(workflows / start_seconds, 1),
        "elapsed_seconds": round(drive_seconds, 3),
        "workflows_per_second": round(wps, 2),
        "steps_per_second": round(wps * steps, 1),
        "end_to_end_seconds": round(end_to_end, 3),
        "end_to_end_workflows_per_second": round(workflows / end_to_end, 2),
        "p50_ms": ms(percentile(total_ms, 50)),
        "p95_ms": ms(percentile(total_ms, 95)),
        "exec_p50_ms": ms(percentile(exec_ms, 50)),
        "exec_p95_ms": ms(percentile(exec_ms, 95)),
        # Drive phase, per workflow, counted on the client (worker threads, maintenance, heartbeat).
        "queries_per_workflow": per_workflow("queries"),
        "transactions_per_workflow": per_workflow("commits"),
        "write_commits_per_workflow": per_workflow("write_commits"),
        "outcomes": dict(worker.outcomes),
        # workflows_per_second if each workflow cost exactly K + 2 commits (claim, K steps, completion,
        # start) at the raw rate would make this 1.0.
        "floor_commits_per_workflow": steps + 2,
        "commit_floor_ratio": round(wps * (steps + 2) / raw_rate, 3),
        "goal_ratio": round(wps * GOAL_COMMITS_PER_WORKFLOW / raw_rate, 3),
        "goal_ratio_target": GOAL_RATIO_TARGET,
    }


# --- the schedule tick -------------------------------------------------------------------------------

SCHEDULE_PREFIX = "weft.bench.schedule"
SCHEDULE_CRON = "* * * * *"
# How long after the due minute the timed tick runs: well inside the tick's lateness grace.
TICK_DELAY = timedelta(milliseconds=1)
# The bench schedules are due this far ahead, and the tick acts as of then: a maintenance process running
# on the real clock against the same database neither fires them nor claims their runs meanwhile.
SCHEDULE_LEAD = timedelta(days=1)
_FIRST_WORD = re.compile(r"\s*(\w+)")
_TABLE = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', re.IGNORECASE)


class StatementTally:
    """An execute wrapper that tallies statements by kind (``SELECT weft_schedule``, ``SAVEPOINT``...) and
    the wall time spent in them (the database's work plus the round trip, as the client sees it)."""

    def __init__(self) -> None:
        self.kinds: Counter = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def __call__(self, execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
        word = _FIRST_WORD.match(sql)
        verb = word.group(1).upper() if word else "?"
        table = _TABLE.search(sql) if verb in ("SELECT", "INSERT", "UPDATE", "DELETE") else None
        kind = f"{verb} {table.group(1)}" if table else verb
        self.kinds[kind] += 1
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds[kind] += time.perf_counter() - began

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


def create_bench_schedules(prefix: str, count: int, steps: int, now: Any, lead: timedelta = SCHEDULE_LEAD) -> list[int]:
    """Bulk-create ``count`` active schedules of the bench workflow, all next due at the same minute, the
    first one ``lead`` after ``now``.

    The cadence fields and ``next_fire_at``/``due_at`` come from the engine's own helpers (the options
    are validated by ``ScheduleSpec.check``, the due time set by ``_set_next``) exactly as
    ``create_schedule`` does, minus one INSERT and one transaction per schedule.
    """
    from ..codec import encode
    from ..models import Schedule
    from ..schedules import ScheduleSpec, _set_next, cadence_of

    spec = ScheduleSpec.check(cron=SCHEDULE_CRON, every=None, timezone="UTC", overlap="skip", backfill=False,
                              catchup_window=None, jitter=None, start_at=None, end_at=None)
    data = encode(steps, what="input of the bench schedules")
    width = len(str(count - 1))
    nominal = None
    pks: list[int] = []
    with transaction.atomic():
        for numbers in _chunks(list(range(count))):
            batch = []
            for i in numbers:
                schedule = Schedule(schedule_id=f"{prefix}.{i:0{width}d}", workflow_type=BENCH_WORKFLOW, input=data,
                                    anchor=now, created_at=now, updated_at=now)
                spec.apply(schedule)
                if nominal is None:  # one cadence for all: compute the next occurrence once
                    nominal = cadence_of(schedule).next_after(now + lead)
                _set_next(schedule, nominal)
                batch.append(schedule)
            Schedule.objects.bulk_create(batch)
        # bulk_create sets primary keys on PostgreSQL only; read them back everywhere.
        pks = list(Schedule.objects.filter(schedule_id__startswith=f"{prefix}.").values_list("pk", flat=True))
    return pks


def delete_bench_schedules(prefix: str) -> tuple[int, int]:
    """Delete the bench schedules with their occurrence rows and runs; returns (schedules, runs) deleted."""
    from ..models import Schedule, ScheduleOccurrence, Workflow

    pks = list(Schedule.objects.filter(schedule_id__startswith=f"{prefix}.").values_list("pk", flat=True))
    schedules = runs = 0
    for ids in _chunks(pks):
        with transaction.atomic():
            ScheduleOccurrence.objects.filter(schedule_id__in=ids).delete()
            run_ids = list(Workflow.objects.filter(schedule_id__in=ids).values_list("pk", flat=True))
            Schedule.objects.filter(pk__in=ids).update(current_run=None)
            runs += delete_runs(run_ids)
            schedules += Schedule.objects.filter(pk__in=ids).delete()[1].get("django_weft.Schedule", 0)
    return schedules, runs


def vacuum_schedule_tables(using: str) -> float | None:
    """``VACUUM ANALYZE`` the tables a tick reads and writes, on PostgreSQL; returns the seconds it took.

    Every bench leaves dead rows behind (updated schedules, deleted runs); where autovacuum is slow or off,
    the due-schedule index keeps entries of dead rows, and each page of the next tick walks them."""
    from ..models import Schedule, ScheduleOccurrence, Workflow

    conn = connections[using]
    if conn.vendor != "postgresql":
        return None
    tables = ", ".join(conn.ops.quote_name(model._meta.db_table) for model in (Schedule, Workflow, ScheduleOccurrence))
    began = time.perf_counter()
    with conn.cursor() as cursor:  # autocommit: VACUUM cannot run inside a transaction block
        cursor.execute(f"VACUUM (ANALYZE) {tables}")
    return time.perf_counter() - began


def _autovacuum(using: str) -> str | None:
    conn = connections[using]
    if conn.vendor != "postgresql":
        return None
    with conn.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0]


def check_schedule_runs(pks: list[int], due: Any) -> dict[str, int]:
    """What the tick left behind for the bench schedules: runs per schedule, occurrence rows, schedule state."""
    from django.db.models import Count

    from ..models import OccurrenceOutcome, RunStatus, Schedule, ScheduleOccurrence, Workflow

    runs = per_schedule_max = with_run = wrong_occurrence = not_pending = 0
    started_rows = other_rows = advanced = current_set = 0
    following = due + timedelta(minutes=1)
    for ids in _chunks(pks):
        rows = list(Workflow.objects.filter(schedule_id__in=ids).values("schedule_id")
                    .annotate(n=Count("pk")).values_list("schedule_id", "n"))
        runs += sum(n for _, n in rows)
        with_run += len(rows)
        per_schedule_max = max([per_schedule_max, *(n for _, n in rows)])
        wrong_occurrence += Workflow.objects.filter(schedule_id__in=ids).exclude(scheduled_for=due).count()
        not_pending += Workflow.objects.filter(schedule_id__in=ids).exclude(status=RunStatus.PENDING).count()
        occurrences = ScheduleOccurrence.objects.filter(schedule_id__in=ids)
        started_rows += occurrences.filter(outcome=OccurrenceOutcome.STARTED, scheduled_for=due,
                                           run__isnull=False).count()
        other_rows += occurrences.exclude(outcome=OccurrenceOutcome.STARTED).count()
        schedules = Schedule.objects.filter(pk__in=ids)
        advanced += schedules.filter(next_fire_at=following, due_at=following, last_fire_at=due).count()
        current_set += schedules.filter(current_run__schedule_id__in=ids, current_run__scheduled_for=due).count()
    return {
        "runs_for_bench_schedules": runs,
        "schedules_with_a_run": with_run,
        "schedules_missing_a_run": len(pks) - with_run,
        "max_runs_per_schedule": per_schedule_max,
        "runs_for_another_occurrence": wrong_occurrence,
        "runs_not_pending": not_pending,
        "started_occurrence_rows": started_rows,
        "other_occurrence_rows": other_rows,
        "schedules_advanced": advanced,
        "schedules_with_current_run": current_set,
    }


def run_schedule_bench(*, schedules: int, steps: int = 0, probe_seconds: float = 2.0, keep: bool = False,
                       profile: str | None = None,
                       progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Time one schedule tick that starts ``schedules`` runs. Raises :class:`BenchError` if it started
    anything but exactly one run per bench schedule."""
    from .. import clock
    from ..models import Schedule, ScheduleStatus
    from ..schedules import PAGE_SIZE, fire_due_schedules

    using = router.db_for_write(Schedule)
    conn = connections[using]
    real_now = clock.now()
    prefix = f"{SCHEDULE_PREFIX}.{uuid.uuid4().hex[:8]}"

    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)

    try:
        began = time.perf_counter()
        pks = create_bench_schedules(prefix, schedules, steps, real_now)
        create_seconds = time.perf_counter() - began
        if len(pks) != schedules:
            raise BenchError(f"created {len(pks)} schedule(s), expected {schedules}")
        vacuum_seconds = vacuum_schedule_tables(using)
        due_at = Schedule.objects.get(pk=pks[0]).due_at
        if due_at is None:
            raise BenchError(f"bench schedule {pks[0]} has no due time")
        tick_now = due_at + TICK_DELAY
        others = (Schedule.objects.filter(status=ScheduleStatus.ACTIVE, due_at__isnull=False, due_at__lte=tick_now)
                  .exclude(schedule_id__startswith=f"{prefix}.").count())
        if others:
            progress(f"note: {others} other schedule(s) are due too; the tick fires them as well")

        tally = StatementTally()
        counter = SqlCounter(using)
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
        with conn.execute_wrapper(counter), conn.execute_wrapper(tally), clock.acting_at(tick_now):
            counter.active = True
            began = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            started = fire_due_schedules(tick_now)
            if profiler is not None:
                profiler.disable()
            tick_seconds = time.perf_counter() - began
            counter.active = False
        if profiler is not None and profile:
            profiler.dump_stats(profile)
            progress(f"profile of the tick written to {profile}")

        checks = check_schedule_runs(pks, due_at)
        problems = [
            f"{key}={checks[key]} (expected {expected})"
            for key, expected in (
                ("runs_for_bench_schedules", schedules), ("schedules_missing_a_run", 0),
                ("max_runs_per_schedule", 1), ("runs_for_another_occurrence", 0), ("runs_not_pending", 0),
                ("started_occurrence_rows", schedules), ("other_occurrence_rows", 0),
                ("schedules_advanced", schedules), ("schedules_with_current_run", schedules),
            )
            if checks[key] != expected
        ]
        if started != schedules + others:
            problems.append(f"fire_due_schedules returned {started} (expected {schedules + others})")
        if problems:
            raise BenchError("the tick did not start exactly one run per schedule: " + "; ".join(problems))
    finally:
        if not keep:
            delete_bench_schedules(prefix)
            vacuum_schedule_tables(using)

    counts = counter.counts

    def per_schedule(value: int) -> float:
        return round(value / schedules, 3)

    rate = checks["runs_for_bench_schedules"] / tick_seconds
    return {
        "mode": "schedules",
        "vendor": conn.vendor,
        "schedules": schedules,
        "runs_started": checks["runs_for_bench_schedules"],
        "tick_returned": started,
        "other_due_schedules": others,
        "cpus": os.cpu_count(),
        "debug": bool(settings.DEBUG),
        "page_size": PAGE_SIZE,
        # PostgreSQL: the server's autovacuum setting, and the VACUUM ANALYZE run before the tick.
        "autovacuum": _autovacuum(using),
        "vacuum_seconds": None if vacuum_seconds is None else round(vacuum_seconds, 3),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "create_seconds": round(create_seconds, 3),
        "schedules_created_per_second": round(schedules / create_seconds, 1),
        "due_at": due_at.isoformat(),
        "tick_now": tick_now.isoformat(),
        "tick_seconds": round(tick_seconds, 3),
        "runs_started_per_second": round(rate, 1),
        "ms_per_schedule": round(tick_seconds * 1000 / schedules, 3),
        # Runs started per commit the database could do in the same time (single connection).
        "runs_per_raw_commit": round(rate / raw_rate, 2),
        "queries": counts["queries"],
        "queries_per_schedule": per_schedule(counts["queries"]),
        "transactions": counts["commits"],
        "statements_per_schedule": {kind: per_schedule(n) for kind, n in tally.kinds.most_common()},
        # Time inside the statements (client side, the execute wrapper included); the rest of tick_seconds
        # is Python in this process, and the commits.
        "statement_seconds": round(sum(tally.seconds.values()), 3),
        "statement_seconds_by_kind": {kind: round(t, 3) for kind, t in sorted(tally.seconds.items(),
                                                                    key=lambda item: -item[1])},
        **{key: value for key, value in checks.items() if key != "runs_for_bench_schedules"},
        "kept": keep,
        "schedule_prefix": prefix,
    }
