"""``weft_bench --in-caller``: runs started and executed in the caller's thread with ``weft.run()``.

The shape DBOS Transact's own benchmark has (``bench/compare_dbos.py`` runs both): each of T threads starts a
K-step ``weft.bench`` run and executes it to completion before starting the next, so a figure is the whole
cost of a run, start included, with nothing queued. Per run it reports the wall time of the call (p50/p95),
the process CPU time, and the statements and commits the client sent; beside them, as in every mode, the
raw single-connection commit rate of the same run.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connections, router

from bench.core import (
    BENCH_WORKFLOW,
    GOAL_COMMITS_PER_WORKFLOW,
    BenchError,
    SqlCounter,
    bench_workflow,
    chunks,
    delete_bench_runs,
    load_average,
    measure_commit_rate,
    percentile,
    round_ms,
)
from bench.cpu_split import CpuSplit

WARM_UP = 20  # runs per thread before timing: connections opened, code paths warm


def run_in_caller_bench(*, workflows: int, steps: int, threads: int, probe_seconds: float = 2.0,
                        keep: bool = False, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures; raises :class:`BenchError` if a run did not complete."""
    from django_weft.common import clock
    from django_weft.models import Workflow
    from django_weft.worker.in_caller import run

    using = router.db_for_write(Workflow)
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    share = [workflows // threads + (1 if i < workflows % threads else 0) for i in range(threads)]
    run_ids: list = []
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    since = clock.now()
    barrier = threading.Barrier(threads + 1)
    # Callers keep their connections until the CPU split is read: a closed one takes its server's CPU with it.
    finished, may_close = threading.Barrier(threads + 1), threading.Event()
    split = CpuSplit()

    def caller(count: int) -> None:
        mine: list = []
        timed: list[float] = []
        try:
            for _ in range(WARM_UP):
                mine.append(run(bench_workflow, steps).run_id)
            barrier.wait()
            barrier.wait()  # the timer started
            for _ in range(count):
                began = time.perf_counter()
                mine.append(run(bench_workflow, steps).run_id)
                timed.append((time.perf_counter() - began) * 1000)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            with lock:
                run_ids.extend(mine)
                latencies.extend(timed)
            try:
                finished.wait()
            except threading.BrokenBarrierError:
                pass
            may_close.wait()
            connections.close_all()

    try:
        with SqlCounter(using) as counter:
            workers = [threading.Thread(target=caller, args=(count,), name=f"weft-bench-caller-{i}", daemon=True)
                       for i, count in enumerate(share)]
            for worker in workers:
                worker.start()
            cpu_began, began = time.process_time(), time.perf_counter()
            try:
                barrier.wait()  # every thread warmed up
                counter.active = True
                cpu_began, began = time.process_time(), time.perf_counter()
                split.start()
                barrier.wait()
            except threading.BrokenBarrierError:
                pass  # a caller failed: reported below
            try:
                finished.wait()
                seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
                split.stop()
            finally:
                may_close.set()
            for worker in workers:
                worker.join()
            counter.active = False
        if errors:
            raise BenchError(f"a caller thread failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
        outcomes: Counter = Counter()
        for ids in chunks(run_ids):
            outcomes.update(Workflow.objects.filter(pk__in=ids).values_list("status", flat=True))
    finally:
        if not keep:
            delete_bench_runs(run_ids, BENCH_WORKFLOW, since)
    if outcomes.get("completed", 0) != len(run_ids):
        raise BenchError(f"not every run completed in the caller: {dict(outcomes)}")

    rate = workflows / seconds
    counts = counter.counts
    return {
        "mode": "in_caller",
        "vendor": connections[using].vendor,
        "workflows": workflows,
        "steps": steps,
        "threads": threads,
        "cpus": os.cpu_count(),
        "debug": bool(settings.DEBUG),
        "load_average": load_average(),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "seconds": round(seconds, 3),
        "workflows_per_second": round(rate, 1),
        "cpu_ms_per_workflow": round(cpu_seconds * 1000 / workflows, 3),
        "p50_ms": round_ms(percentile(latencies, 50)),
        "p95_ms": round_ms(percentile(latencies, 95)),
        "queries_per_workflow": round(counts["queries"] / workflows, 2),
        "commits_per_workflow": round(counts["commits"] / workflows, 2),
        "goal_ratio": round(rate * GOAL_COMMITS_PER_WORKFLOW / raw_rate, 3),
        "outcomes": dict(outcomes),
        # The machine's cores over the timed window: busy in all, in the database server, in this process.
        "cpu_split": split.figures(cpu_seconds, workflows),
    }


# --- the command's side: its option, its checks, its table -------------------------------------------

HELP = (" With --in-caller each of --workers (W) threads starts a K-step run with weft.run() and executes it to "
        "completion in the same thread, then the next, until N runs are done (the shape of DBOS Transact's "
        "benchmark; bench/compare_dbos.py runs both): workflows/s, the process CPU ms per run, p50/p95 ms per "
        "call, statements and commits per run (see bench.in_caller).")
# The options of the other modes, refused beside --in-caller (those with defaults cannot be told apart).
OTHER_MODES = ("schedules", "profile", "processes", "celery_workers", "latency", "parallel", "sleep_seconds",
               "query_latency", "replay_check", "milestones", "plain_milestones", "window", "continue_every",
               "interval", "seed_runs", "repeat")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--in-caller", action="store_true",
                        help="Start and execute each run in the calling thread with weft.run(), in W threads.")


def chosen(options: dict[str, Any]) -> bool:
    return bool(options.get("in_caller"))


def mode(options: dict[str, Any]) -> tuple[Callable[..., dict], Callable[[dict], list[str]]]:
    """``--in-caller``'s run and table for ``Command.run_mode``, from the command's options (checked)."""
    from django.core.management.base import CommandError

    others = [name for name in OTHER_MODES if options.get(name) is not None]
    if others or options.get("continue_as_new") or options.get("prestart") or options.get("find"):
        raise CommandError("--in-caller goes alone (with --workflows, --steps, --workers, --probe-seconds, --keep)")
    workflows = 1000 if options.get("workflows") is None else options["workflows"]
    if workflows < 1 or options["steps"] < 0 or options["workers"] < 1:
        raise CommandError("--workflows and --workers must be at least 1, --steps 0 or more")
    if options["probe_seconds"] <= 0:
        raise CommandError("--probe-seconds must be positive")
    return partial(run_in_caller_bench, workflows=workflows, steps=options["steps"], threads=options["workers"],
                   probe_seconds=options["probe_seconds"], keep=options["keep"]), format_table


def format_table(f: dict[str, Any]) -> list[str]:
    return [f"weft_bench: {f['vendor']}, {f['workflows']} runs x {f['steps']} steps started and executed in "
            f"{f['threads']} caller thread(s); raw commits {f['raw_commits_per_second']:.0f}/s",
            f"{f['workflows_per_second']:.1f} workflows/s, {f['cpu_ms_per_workflow']:.3f} ms CPU per run, p50 "
            f"{f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, {f['commits_per_workflow']:.2f} commits per run"]
