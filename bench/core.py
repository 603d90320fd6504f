"""The benchmark behind ``manage.py weft_bench``: engine throughput and latency against the raw commit rate.

Importing this module registers the ``weft.bench`` workflow and its activity, so only the bench command
(and the processes it starts) imports it. :func:`run_bench` does the work and returns a JSON-safe dict; the
command is argparse glue. The bench's other modes build on what is here (the workflow, the commit-rate
probe, the counters, the cleanup): :mod:`.tick` times the schedule tick, :mod:`.processes`,
:mod:`.celery_worker` and :mod:`.latency` execute in subprocesses.

Phases, each timed on its own:

1. **probe** -- the database's single-connection commit rate: one-row ``INSERT`` per
   ``transaction.atomic()`` into a real (non-temporary: PostgreSQL skips the WAL flush for temporary
   tables) table ``weft_bench_probe``, dropped afterwards.
2. **start** -- ``weft.start()`` N times from one thread, each in its own transaction (one commit each),
   as a web request would.
3. **drive** -- a :class:`~django_weft.worker.loop.Worker` with W executor threads, in this process,
   runs until every started run has finished (counted from the completed/failed signals, so nothing
   polls the database). ``workflows_per_second`` and ``steps_per_second`` are for this phase; the
   ``end_to_end_*`` figure covers start + drive.

Latency is per run: ``finished_at - created_at`` (``p50_ms``/``p95_ms``; in this batch setting it
includes the time a run queued behind the others) and ``finished_at - started_at`` (``exec_p50_ms``...:
from its claim to its completion).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.backends.signals import connection_created

from django_weft import signals
from django_weft.common.registry import workflow
from django_weft.conf import weft_settings
from django_weft.runtime.activities import activity

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


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def round_ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


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
    """Collects the runs of this bench as their completed/failed signals arrive (after commit); ``also``: more
    signals of runs that ended as they should (workflow_cancelled, for runs the bench cancels)."""

    def __init__(self, run_ids: set, also: tuple = ()) -> None:
        self.also = also
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
                           (signals.workflow_failed, self._receive(True)),
                           *((signal, self._receive(False)) for signal in self.also)]
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)


def chunks(items: list, size: int = CHUNK) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def delete_runs(run_ids: list) -> int:
    """Delete the given runs with their journal and timers (signals and async records cascade)."""
    from django_weft.models import Timer, Workflow, WorkflowStep

    deleted = 0
    for ids in chunks(run_ids):
        with transaction.atomic():
            WorkflowStep.objects.filter(run_id__in=ids).delete()
            Timer.objects.filter(run_id__in=ids).delete()
            deleted += Workflow.objects.filter(pk__in=ids).delete()[1].get("django_weft.Workflow", 0)
    return deleted


def _open_transaction_unknown_to_django(conn: Any) -> bool:
    """Whether the driver has a transaction (or a command) open that Django's bookkeeping does not know of: an
    interrupt landed between a BEGIN and Django noting it, or inside a commit."""
    raw = conn.connection
    if raw is None or conn.in_atomic_block:
        return False
    if conn.vendor == "sqlite":
        return bool(raw.in_transaction)
    if conn.vendor == "postgresql":
        from psycopg.pq import TransactionStatus

        return bool(raw.info.transaction_status != TransactionStatus.IDLE)
    return False


def _fresh_connection_if_broken(using: str) -> None:
    """An interrupt (SIGTERM, Ctrl-C) that lands inside a database call, a NOTIFY sent after a commit or the
    BEGIN of a transaction say, leaves the connection mid-command or mid-transaction: the clean-up then needs a
    new one (what was uncommitted is rolled back with the old one, which is all the bench's own rows)."""
    conn = connections[using]
    try:
        broken = _open_transaction_unknown_to_django(conn)
        if not broken:
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")
    except Exception:
        broken = True
    if broken:
        try:
            conn.close()
        except Exception:
            conn.connection = None  # dropped; Django opens a new one on the next query


def delete_bench_runs(run_ids: list, workflow_type: str, since: Any) -> int:
    """Delete ``run_ids`` and every other run of ``workflow_type`` created since ``since``: one started
    just as the bench was interrupted may have been committed without reaching ``run_ids``. (The bench
    refuses to run beside live executors, so no other bench is creating such runs meanwhile.)"""
    from django_weft.models import Workflow

    _fresh_connection_if_broken(router.db_for_write(Workflow))

    late = Workflow.objects.filter(workflow_type=workflow_type, created_at__gte=since).values_list("pk", flat=True)
    return delete_runs(list({*run_ids, *late}))


# --- the benchmark -----------------------------------------------------------------------------------


@dataclass
class Drive:
    worker: Any
    counter: SqlCounter
    finished: _Finished
    completed: bool
    seconds: float
    cpu_seconds: float


def drive_until_ended(run_ids: set, workers: int, using: str, timeout: float, *, also: tuple = (),
                      before: Callable[[], None] = lambda: None) -> Drive:
    """Drive ``run_ids`` with an executor of ``workers`` threads in this process until each has ended (or
    ``timeout``): the wall and CPU seconds from just before ``before()`` (timed with the drive) to the last end,
    and the statements and commits counted meanwhile."""
    from django_weft.worker.loop import Worker

    worker = Worker(threads=workers)
    with SqlCounter(using) as counter, _Finished(run_ids, also=also) as finished:
        counter.active = True
        thread = threading.Thread(target=worker.run, name="weft-bench-worker", daemon=True)
        cpu_began, began = time.process_time(), time.perf_counter()
        before()
        thread.start()
        try:
            completed = finished.done.wait(timeout)
            seconds, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        finally:
            # Stopped before anything else (cleanup included) touches the runs.
            counter.active = False
            worker.stop()
            thread.join()
    return Drive(worker, counter, finished, completed, seconds, cpu)


def run_bench(*, workflows: int, steps: int, workers: int, probe_seconds: float = 2.0,
              timeout: float = 600.0, keep: bool = False,
              progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures. Raises :class:`BenchError` if runs fail or time out."""
    from django_weft.common import clock
    from django_weft.models import Workflow
    from django_weft.services import client

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

        drive = drive_until_ended(set(run_ids), workers, using, timeout)
        worker, counter, finished, completed = drive.worker, drive.counter, drive.finished, drive.completed
        drive_seconds, drive_cpu = drive.seconds, drive.cpu_seconds
        if not completed:
            raise BenchError(
                f"{len(finished.pending)} of {workflows} run(s) had not finished after {timeout:g}s"
            )
        if finished.failed:
            sample = finished.failed[0]
            raise BenchError(f"{len(finished.failed)} run(s) failed, e.g. {sample.pk}: {sample.error}")

        total_ms: list[float] = []
        exec_ms: list[float] = []
        for ids in chunks(run_ids):
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
        # This process's CPU time in the drive phase (executor threads, heartbeat, maintenance) per run.
        "cpu_ms_per_workflow": round(drive_cpu * 1000 / workflows, 3),
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
