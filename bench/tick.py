"""``manage.py weft_bench --schedules N``: the time one schedule tick takes to start N runs.

:func:`run_schedule_bench` bulk-creates N active ``* * * * *`` UTC schedules of the bench workflow, all due
at the same minute (a day ahead, so a maintenance process on the real clock leaves them alone), then times
ONE ``fire_due_schedules(now)`` pass acting as of just after that minute, which must start exactly one run
per schedule. It counts the statements the tick sends, per schedule and by kind, and does not execute the
runs. On PostgreSQL the tables the tick touches are vacuumed (and analyzed) before the tick and after the
cleanup, so one bench's dead rows do not slow the next where autovacuum lags or is off.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction

from bench.core import BENCH_WORKFLOW, BenchError, SqlCounter, chunks, delete_runs, measure_commit_rate

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
    are validated by ``ScheduleSpec.check``, the due time set by ``set_next``) exactly as
    ``create_schedule`` does, minus one INSERT and one transaction per schedule.
    """
    from django_weft.common.codec import encode
    from django_weft.models import Schedule
    from django_weft.services.schedule_tick import cadence_of, set_next
    from django_weft.services.schedules import ScheduleSpec

    spec = ScheduleSpec.check(cron=SCHEDULE_CRON, every=None, timezone="UTC", overlap="skip", backfill=False,
                              catchup_window=None, jitter=None, start_at=None, end_at=None)
    data = encode(steps, what="input of the bench schedules")
    width = len(str(count - 1))
    nominal = None
    pks: list[int] = []
    with transaction.atomic():
        for numbers in chunks(list(range(count))):
            batch = []
            for i in numbers:
                schedule = Schedule(schedule_id=f"{prefix}.{i:0{width}d}", workflow_type=BENCH_WORKFLOW, input=data,
                                    anchor=now, created_at=now, updated_at=now)
                spec.apply(schedule)
                if nominal is None:  # one cadence for all: compute the next occurrence once
                    nominal = cadence_of(schedule).next_after(now + lead)
                set_next(schedule, nominal)
                batch.append(schedule)
            Schedule.objects.bulk_create(batch)
        # bulk_create sets primary keys on PostgreSQL only; read them back everywhere.
        pks = list(Schedule.objects.filter(schedule_id__startswith=f"{prefix}.").values_list("pk", flat=True))
    return pks


def delete_bench_schedules(prefix: str) -> tuple[int, int]:
    """Delete the bench schedules with their occurrence rows and runs; returns (schedules, runs) deleted."""
    from django_weft.models import Schedule, ScheduleOccurrence, Workflow

    pks = list(Schedule.objects.filter(schedule_id__startswith=f"{prefix}.").values_list("pk", flat=True))
    schedules = runs = 0
    for ids in chunks(pks):
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
    from django_weft.models import Schedule, ScheduleOccurrence, Workflow

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

    from django_weft.models import OccurrenceOutcome, RunStatus, Schedule, ScheduleOccurrence, Workflow

    runs = per_schedule_max = with_run = wrong_occurrence = not_pending = 0
    started_rows = other_rows = advanced = current_set = 0
    following = due + timedelta(minutes=1)
    for ids in chunks(pks):
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
    from django_weft.common import clock
    from django_weft.models import Schedule, ScheduleStatus
    from django_weft.services.schedule_tick import PAGE_SIZE, fire_due_schedules

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
