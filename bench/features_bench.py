"""``weft_bench --features``: what the round-three features cost a run, beside a run that uses none of them.

N runs of each shape are started first, then driven by an executor (``Worker``, W threads, in this process) until
every one has ended; the drive is timed alone, with the statements and commits the client sent and this
process's CPU, beside the raw single-connection commit rate of the same run. Shapes, each three steps of the
no-op activity unless said otherwise:

* ``plain``: three ``ctx.run`` calls (the baseline every other shape is compared with);
* ``limited``: three calls of an activity with ``concurrency`` and ``rate`` limits (design 9.3) set so high they
  are never reached, so every attempt takes and frees a slot;
* ``gather``: three ``ctx.start_activity`` at once, then ``ctx.gather``;
* ``code_branches``: two ``ctx.start_branch`` branches of workflow code, one step each, then one step;
* ``cancel``: one step, then a wait for a signal that never comes; once every run has parked (not timed), each is
  cancelled (``handle.cancel``, timed with the drive) and its ``with ctx.cleanup():`` block runs one step before
  the run ends cancelled.

Queues (``--queues``), transaction steps, events and streams (``--events``) and parallel activities
(``--parallel``) have modes of their own. The runs are deleted afterwards unless ``--keep``. Importing this
module registers the shapes' workflows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections, router

from bench.core import (
    BenchError,
    bench_step,
    delete_bench_runs,
    drive_until_ended,
    load_average,
    measure_commit_rate,
)
from django_weft.common.registry import workflow
from django_weft.runtime.activities import activity

FEATURES_WORKFLOW = "weft.bench.features"
SHAPES = ("plain", "limited", "gather", "code_branches", "cancel")
NEVER = "weft.bench.never"


@activity(name="weft.bench.limited_step", concurrency=1_000_000, rate="1000000/s")
def limited_step(i: int) -> int:
    """Does nothing, under limits never reached."""
    return i


def _branch(ctx: Any, i: int) -> int:
    return ctx.run(bench_step, i)


@workflow(name=FEATURES_WORKFLOW)
def features_workflow(ctx: Any, shape: str) -> int:
    from django_weft.exceptions import CancelledError

    if shape == "plain":
        return sum(ctx.run(bench_step, i) for i in range(3))
    if shape == "limited":
        return sum(ctx.run(limited_step, i) for i in range(3))
    if shape == "gather":
        return sum(ctx.gather(*(ctx.start_activity(bench_step, i) for i in range(3))))
    if shape == "code_branches":
        total = sum(ctx.gather(ctx.start_branch(_branch, 0), ctx.start_branch(_branch, 1)))
        return total + ctx.run(bench_step, 2)
    if shape == "cancel":
        ctx.run(bench_step, 0)
        try:
            ctx.wait_for_signal(NEVER)
        except CancelledError:
            with ctx.cleanup():
                ctx.run(bench_step, 1)
            raise
        return 0
    raise ValueError(f"unknown shape {shape!r}")


def _park_all(run_ids: set, timeout: float) -> None:
    """Execute the cancel shape's runs until each waits for its signal (not timed)."""
    from django_weft.models import RunStatus, Workflow
    from django_weft.services.maintenance import MaintenanceReport, default_owner, execute_runnable

    deadline = time.monotonic() + timeout
    while Workflow.objects.filter(pk__in=run_ids).exclude(status=RunStatus.WAITING).exists():
        if time.monotonic() > deadline:
            raise BenchError(f"the cancel shape's runs had not all parked after {timeout:g}s")
        execute_runnable(None, MaintenanceReport(), default_owner())


def _measure_shape(shape: str, workflows: int, workers: int, timeout: float, using: str,
                   run_ids: list) -> dict[str, Any]:
    from django_weft import signals
    from django_weft.services import client

    began = time.perf_counter()
    handles = [client.start(features_workflow, shape) for _ in range(workflows)]
    start_seconds = time.perf_counter() - began
    ids = [h.run_id for h in handles]
    run_ids.extend(ids)
    if shape == "cancel":
        _park_all(set(ids), timeout)
    ending = (signals.workflow_cancelled,) if shape == "cancel" else ()

    def cancel_all() -> None:
        if shape == "cancel":
            for handle in handles:
                handle.cancel("weft_bench --features")

    drive = drive_until_ended(set(ids), workers, using, timeout, also=ending, before=cancel_all)
    finished, counter, seconds, cpu = drive.finished, drive.counter, drive.seconds, drive.cpu_seconds
    if not drive.completed:
        raise BenchError(f"{shape}: {len(finished.pending)} of {workflows} run(s) had not ended after {timeout:g}s")
    if finished.failed:
        sample = finished.failed[0]
        raise BenchError(f"{shape}: {len(finished.failed)} run(s) failed, e.g. {sample.pk}: {sample.error}")
    counts = counter.counts
    return {
        "shape": shape,
        "workflows": workflows,
        "starts_per_second": round(workflows / start_seconds, 1),
        "seconds": round(seconds, 3),
        "workflows_per_second": round(workflows / seconds, 1),
        "cpu_ms_per_workflow": round(cpu * 1000 / workflows, 3),
        "queries_per_workflow": round(counts["queries"] / workflows, 2),
        "commits_per_workflow": round(counts["commits"] / workflows, 2),
        "write_commits_per_workflow": round(counts["write_commits"] / workflows, 2),
    }


def run_features_bench(*, workflows: int, workers: int = 1, shapes: tuple[str, ...] = SHAPES,
                       probe_seconds: float = 2.0, timeout: float = 600.0, keep: bool = False,
                       progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures; raises :class:`BenchError` if a run fails or does not end."""
    from django_weft.common import clock
    from django_weft.models import Workflow

    using = router.db_for_write(Workflow)
    if connections[using].in_atomic_block:
        raise BenchError("called inside a transaction: nothing would commit, so nothing would be measured as "
                         "it runs in production")
    load_before = load_average()
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commit rate {raw_rate:.0f}/s")
    since = clock.now()
    run_ids: list = []
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    try:
        for shape in shapes:
            row = _measure_shape(shape, workflows, workers, timeout, using, run_ids)
            rows.append(row)
            progress(f"{shape}: {row['workflows_per_second']:.0f} workflows/s, "
                     f"{row['commits_per_workflow']:.2f} commits per run")
    finally:
        if not keep:
            progress("deleting the bench's runs")
            delete_bench_runs(run_ids, FEATURES_WORKFLOW, since)
    baseline = next((row for row in rows if row["shape"] == "plain"), None)
    for row in rows:
        row["relative_to_plain"] = (round(row["workflows_per_second"] / baseline["workflows_per_second"], 3)
                                    if baseline else None)
        row["commit_floor_ratio"] = round(row["workflows_per_second"] * row["write_commits_per_workflow"]
                                          / raw_rate, 3)
    return {
        "mode": "features",
        "vendor": connections[using].vendor,
        "cpus": os.cpu_count(),
        "debug": bool(settings.DEBUG),
        "loadavg_before": load_before,
        "loadavg": load_average(),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "workers": workers,
        "shapes": rows,
        "total_seconds": round(time.perf_counter() - began, 1),
    }


def format_table(figures: dict[str, Any]) -> list[str]:
    """The figures as the lines the command prints (before the JSON line)."""
    f = figures
    lines = [
        f"weft_bench --features: {f['vendor']}, {f['cpus']} cpu(s), {f['workers']} executor thread(s), load "
        f"{f['loadavg_before']} at the start, {f['loadavg']} at the end; raw commits "
        f"{f['raw_commits_per_second']:,.0f}/s",
        "per shape: N runs started, then driven until each ended (cancel: each cancelled, its cleanup run); "
        "x plain: workflows/s against the plain shape's; floor: workflows/s x write commits per run / raw commits/s",
        "",
        f"{'shape':<14} {'runs':>6} {'wf/s':>8} {'x plain':>8} {'CPU ms':>7} {'queries':>8} {'commits':>8} "
        f"{'writes':>7} {'floor':>6}",
    ]
    for r in f["shapes"]:
        relative = "" if r["relative_to_plain"] is None else f"{r['relative_to_plain']:.2f}"
        lines.append(f"{r['shape']:<14} {r['workflows']:>6} {r['workflows_per_second']:>8.1f} {relative:>8} "
                     f"{r['cpu_ms_per_workflow']:>7.2f} {r['queries_per_workflow']:>8.2f} "
                     f"{r['commits_per_workflow']:>8.2f} {r['write_commits_per_workflow']:>7.2f} "
                     f"{r['commit_floor_ratio']:>6.2f}")
    return lines


# --- the command's side: its option, its checks -------------------------------------------------------

HELP = (" With --features it drives N runs of each shape (plain, limited activities, gather, branches of code, "
        "cancel with cleanup) with --workers executor threads and reports each shape's workflows/s, CPU and "
        "commits per run beside the plain shape's (see bench.features_bench).")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--features", action="store_true", dest="feature_costs",
                        help="Time runs using each round-three feature beside plain runs.")


def chosen(options: dict[str, Any]) -> bool:
    return bool(options.get("feature_costs"))


def mode(options: dict[str, Any]) -> tuple[Callable[..., dict], Callable[[dict], list[str]]]:
    from functools import partial

    from django.core.management.base import CommandError

    from bench.in_caller import OTHER_MODES

    others = [name for name in OTHER_MODES if options.get(name) is not None]
    if others or options.get("continue_as_new") or options.get("prestart") or options.get("find") or \
            any(options.get(name) for name in ("in_caller", "unkept", "queue_costs", "event_costs", "tasks")):
        raise CommandError("--features goes alone (with --workflows, --workers, --probe-seconds, --timeout, --keep)")
    workflows = 500 if options.get("workflows") is None else options["workflows"]
    if workflows < 1 or options["workers"] < 1:
        raise CommandError("--workflows and --workers must be at least 1")
    return partial(run_features_bench, workflows=workflows, workers=options["workers"],
                   probe_seconds=options["probe_seconds"], timeout=options["timeout"], keep=options["keep"]), \
        format_table
