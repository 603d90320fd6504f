"""``manage.py weft_bench --parallel K[,K...]``: parallel branches against the sequential form of the same work.

For each K, one run at a time, each timed from just before ``weft.start()`` to its result read back:

* **sleeping** -- K activities that each wait ``sleep_seconds`` (0.2 s: I/O, ``time.sleep``), as
  ``ctx.gather(*[ctx.start_activity(...)])`` (ideally about 0.2 s), as K ``ctx.run`` calls (K x 0.2 s), and
  gathered as ``async def`` activities (``asyncio.sleep``, on the run's shared event loop);
* **no-op** -- the same forms with activities that return at once: wall time / K is the overhead per branch
  (per step for the sequential form); the same minus the wall time of an empty run (no activity at all) is
  what each branch adds to the run's fixed cost (start, claim, completion).

The gather runs execute with WEFT_MAX_PARALLEL_ACTIVITIES raised to at least K (with the default of 8, K=32
would otherwise take 4 x 0.2 s); for every K above the configured limit the gathers are measured again at
that limit. Each figure is the median of ``repeat`` runs (of ``repeat x NOOP_REPEAT_FACTOR`` for the no-op
and empty runs, which last milliseconds).

Runs execute through the engine's normal path, :func:`django_weft.services.maintenance.execute_runnable` (what
``run_maintenance()`` does between its timeouts/schedules and retention), in this thread, on the configured
database and outside any transaction, so the attempts of a gather run in threads of their own. Each activity
returns when it ran (``time.perf_counter()`` at its start and end), so the bench checks every result and
reports how many attempts of one run overlapped at most (never more than the limit).

Importing this module registers the ``weft.bench.parallel`` workflow and its activities.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.test.utils import override_settings

from bench.core import BenchError, delete_bench_runs, load_average
from django_weft.common import clock
from django_weft.common.registry import workflow
from django_weft.conf import weft_settings
from django_weft.runtime.activities import activity

PARALLEL_WORKFLOW = "weft.bench.parallel"
SLEEP_ACTIVITY = "weft.bench.parallel.sleep"
ASYNC_SLEEP_ACTIVITY = "weft.bench.parallel.async_sleep"
DEFAULT_SLEEP_SECONDS = 0.2
DEFAULT_REPEAT = 3
# No-op runs last milliseconds, so their figures are medians of this many times more runs.
NOOP_REPEAT_FACTOR = 5
MAX_BRANCHES = 1000

# The workflow's forms.
EMPTY, SEQUENTIAL, GATHER = "empty", "sequential", "gather"


@activity(name=SLEEP_ACTIVITY)
def sleep_step(i: int, seconds: float) -> list:
    """Waits ``seconds`` (0: returns at once); returns ``[i, began, ended, thread]``: when it ran
    (``time.perf_counter()``) and on which thread (``threading.get_ident()``)."""
    began = time.perf_counter()
    if seconds:
        time.sleep(seconds)
    return [i, began, time.perf_counter(), threading.get_ident()]


@activity(name=ASYNC_SLEEP_ACTIVITY)
async def async_sleep_step(i: int, seconds: float) -> list:
    """The ``async def`` form of :func:`sleep_step`."""
    began = time.perf_counter()
    if seconds:
        await asyncio.sleep(seconds)
    return [i, began, time.perf_counter(), threading.get_ident()]


@workflow(name=PARALLEL_WORKFLOW)
def parallel_workflow(ctx: Any, spec: dict) -> list:
    """``spec``: ``form`` (empty, sequential or gather), ``branches`` (K), ``seconds``, ``async``."""
    fn = async_sleep_step if spec["async"] else sleep_step
    k, seconds = spec["branches"], spec["seconds"]
    if spec["form"] == GATHER:
        return ctx.gather(*[ctx.start_activity(fn, i, seconds) for i in range(k)])
    if spec["form"] == SEQUENTIAL:
        return [ctx.run(fn, i, seconds) for i in range(k)]
    return []


def parse_branch_counts(text: str) -> list[int]:
    """``"1,8,32"`` (or one int) as a list of distinct Ks in the order given; ValueError if malformed."""
    counts: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_BRANCHES:
            raise ValueError(f"--parallel takes branch counts from 1 to {MAX_BRANCHES}, separated by commas "
                             f"(e.g. 1,8,32), got {text!r}")
        if int(part) not in counts:
            counts.append(int(part))
    return counts


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """How many of the ``(began, ended)`` intervals overlapped at most (one ending as another begins:
    not an overlap)."""
    events = sorted([(began, 1) for began, _ in intervals] + [(ended, -1) for _, ended in intervals])
    running = peak = 0
    for _, step in events:  # at equal times -1 sorts first
        running += step
        peak = max(peak, running)
    return peak


class _Runs:
    """Starts and executes the bench's runs one at a time, checking each result."""

    def __init__(self, run_ids: list, timeout: float) -> None:
        self.run_ids = run_ids
        self.timeout = timeout

    def one(self, *, form: str, branches: int, seconds: float, is_async: bool = False) -> tuple[float, int]:
        """Wall seconds of one run from start() to its result, and how many of its attempts overlapped."""
        from django_weft.common.codec import decode
        from django_weft.models import RunStatus, StepKind, StepStatus, Workflow, WorkflowStep
        from django_weft.services import client
        from django_weft.services.maintenance import MaintenanceReport, default_owner, execute_runnable

        spec = {"form": form, "branches": branches, "seconds": seconds, "async": is_async}
        began = time.perf_counter()
        run_id = client.start(parallel_workflow, spec).run_id
        self.run_ids.append(run_id)
        what = f"run {run_id} ({form}, K={branches}{', async' if is_async else ''})"
        while True:  # one pass executes it to the end: it never parks
            execute_runnable(None, MaintenanceReport(), default_owner())
            status, result, error = Workflow.objects.filter(pk=run_id).values_list("status", "result", "error").get()
            if status in RunStatus.terminal_values():
                break
            if time.perf_counter() - began > self.timeout:
                raise BenchError(f"{what} had not finished after {self.timeout:g}s ({status})")
            time.sleep(0.01)
        wall = time.perf_counter() - began
        if status != RunStatus.COMPLETED:
            raise BenchError(f"{what} ended {status}: {error}")
        value = decode(result)
        expected = branches if form != EMPTY else 0
        if sorted(entry[0] for entry in value) != list(range(expected)):
            raise BenchError(f"{what} returned {value!r}, not one result per activity 0..{expected - 1}")
        executor_thread = threading.get_ident()  # execute_runnable drives the run in this thread
        inline = sum(entry[3] == executor_thread for entry in value)
        if form == GATHER and inline:
            raise BenchError(f"{what}: {inline} of its {branches} gathered attempt(s) ran in the executor's thread, "
                             "not in the run's attempt pool")
        if form == SEQUENTIAL and not is_async and inline != branches:
            raise BenchError(f"{what}: {branches - inline} of its {branches} ctx.run attempt(s) ran outside the "
                             "executor's thread")
        rows = WorkflowStep.objects.filter(run_id=run_id, kind=StepKind.ACTIVITY, status=StepStatus.COMPLETED).count()
        if rows != expected:
            raise BenchError(f"{what} recorded {rows} completed activity step(s), not {expected}")
        return wall, max_overlap([(entry[1], entry[2]) for entry in value])

    def median(self, repeat: int, **spec: Any) -> dict[str, Any]:
        walls, overlaps = [], []
        for _ in range(repeat):
            wall, overlap = self.one(**spec)
            walls.append(wall)
            overlaps.append(overlap)
        return {"seconds": round(statistics.median(walls), 4), "min_seconds": round(min(walls), 4),
                "max_concurrent": max(overlaps)}


def run_parallel_bench(*, branch_counts: list[int], sleep_seconds: float = DEFAULT_SLEEP_SECONDS,
                       repeat: int = DEFAULT_REPEAT, timeout: float = 600.0, keep: bool = False,
                       progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures. Raises :class:`BenchError` if a run fails, returns a wrong
    result, or more attempts of a run overlapped than its limit allows."""
    from django_weft.models import Workflow

    using = router.db_for_write(Workflow)
    if connections[using].in_atomic_block:
        raise BenchError("called inside a transaction: the runs' activity attempts would all run inline in it, "
                         "one after another, so nothing would be measured in parallel")
    open_before = Workflow.objects.open().count()
    if open_before:
        progress(f"note: {open_before} open run(s) already in the database; the bench executes them too")
    configured = max(1, int(weft_settings.MAX_PARALLEL_ACTIVITIES))
    run_ids: list = []
    runs = _Runs(run_ids, timeout)
    since = clock.now()
    rows: list[dict[str, Any]] = []
    try:
        runs.one(form=EMPTY, branches=0, seconds=0)  # warm-up: connection, first queries; not counted
        noop_repeat = repeat * NOOP_REPEAT_FACTOR
        empty = runs.median(noop_repeat, form=EMPTY, branches=0, seconds=0)["seconds"]
        for k in branch_counts:
            progress(f"K={k}: sequential")
            sequential = runs.median(repeat, form=SEQUENTIAL, branches=k, seconds=sleep_seconds)
            noop_sequential = runs.median(noop_repeat, form=SEQUENTIAL, branches=k, seconds=0)
            limits = [max(k, configured)] + ([configured] if k > configured else [])
            for limit in limits:
                progress(f"K={k}: gather at WEFT_MAX_PARALLEL_ACTIVITIES={limit}")
                with override_settings(WEFT_MAX_PARALLEL_ACTIVITIES=limit):
                    forms = {
                        "gather": runs.median(repeat, form=GATHER, branches=k, seconds=sleep_seconds),
                        "async_gather": runs.median(repeat, form=GATHER, branches=k, seconds=sleep_seconds,
                                                    is_async=True),
                        "noop_gather": runs.median(noop_repeat, form=GATHER, branches=k, seconds=0),
                    }
                for name, figures in forms.items():
                    if figures["max_concurrent"] > limit:
                        raise BenchError(f"K={k}, {name}: {figures['max_concurrent']} attempts of one run overlapped, "
                                         f"above WEFT_MAX_PARALLEL_ACTIVITIES={limit}")
                rows.append(_row(k, limit, configured, sleep_seconds, empty, sequential, noop_sequential, forms))
    finally:
        if not keep:
            delete_bench_runs(run_ids, PARALLEL_WORKFLOW, since)
    return {
        "mode": "parallel",
        "vendor": connections[using].vendor,
        "cpus": os.cpu_count(),
        "loadavg": load_average(),
        "debug": bool(settings.DEBUG),
        "sleep_seconds": sleep_seconds,
        "repeat": repeat,
        "noop_repeat": noop_repeat,
        "configured_max_parallel_activities": configured,
        "empty_run_seconds": empty,
        "runs": len(run_ids),
        "rows": rows,
    }


def _row(k: int, limit: int, configured: int, sleep_seconds: float, empty: float, sequential: dict,
         noop_sequential: dict, forms: dict[str, dict]) -> dict[str, Any]:
    def per_branch_ms(wall: float, minus: float = 0.0) -> float:
        return round((wall - minus) / k * 1000, 2)

    gather = forms["gather"]
    return {
        "branches": k,
        "limit": limit,
        "at_configured_limit": limit == configured,
        "ideal_seconds": round(-(-k // limit) * sleep_seconds, 4),  # ceil(K / limit) waves of sleeps
        "sequential": sequential,
        "gather": gather,
        "async_gather": forms["async_gather"],
        "speedup": round(sequential["seconds"] / gather["seconds"], 2) if gather["seconds"] else None,
        "noop_sequential": noop_sequential,
        "noop_gather": forms["noop_gather"],
        "noop_ms_per_step_sequential": per_branch_ms(noop_sequential["seconds"]),
        "noop_ms_per_branch_gather": per_branch_ms(forms["noop_gather"]["seconds"]),
        "noop_ms_per_step_sequential_over_empty": per_branch_ms(noop_sequential["seconds"], empty),
        "noop_ms_per_branch_gather_over_empty": per_branch_ms(forms["noop_gather"]["seconds"], empty),
    }


def format_table(figures: dict[str, Any]) -> list[str]:
    """The figures as the lines the command prints (before the JSON line)."""
    f = figures
    sleep = f"{f['sleep_seconds']:g}s"
    lines = [
        f"weft_bench --parallel: {f['vendor']}, {f['cpus']} cpu(s), load {f['loadavg']}; one run at a time, wall "
        f"time from start() to result, median of {f['repeat']} run(s) per figure ({f['noop_repeat']} for no-op "
        "and empty runs)",
        f"WEFT_MAX_PARALLEL_ACTIVITIES: configured {f['configured_max_parallel_activities']}; gather runs use "
        f"max(K, {f['configured_max_parallel_activities']}), and K above it is measured at it too (limit marked *)",
        f"an empty run (no activity): {f['empty_run_seconds'] * 1000:.1f} ms",
        "",
        f"activities that each wait {sleep} (time.sleep; async: asyncio.sleep)",
        f"{'K':>5} {'limit':>6} {'sequential':>11} {'gather':>9} {'async gather':>13} {'ideal':>8} {'speedup':>8}"
        f" {'overlap':>8} {'async overlap':>14}",
    ]
    for r in f["rows"]:
        limit = f"{r['limit']}{'*' if r['at_configured_limit'] and r['limit'] < r['branches'] else ''}"
        lines.append(
            f"{r['branches']:>5} {limit:>6} {r['sequential']['seconds']:>10.3f}s {r['gather']['seconds']:>8.3f}s "
            f"{r['async_gather']['seconds']:>12.3f}s {r['ideal_seconds']:>7.3f}s {r['speedup']:>7.2f}x "
            f"{r['gather']['max_concurrent']:>8} {r['async_gather']['max_concurrent']:>14}"
        )
    lines += [
        "",
        "no-op activities: overhead per branch, ms = wall / K (in brackets: (wall - empty run) / K)",
        f"{'K':>5} {'limit':>6} {'sequential ms/step':>22} {'gather ms/branch':>22}",
    ]
    for r in f["rows"]:
        limit = f"{r['limit']}{'*' if r['at_configured_limit'] and r['limit'] < r['branches'] else ''}"
        seq = f"{r['noop_ms_per_step_sequential']:.2f} ({r['noop_ms_per_step_sequential_over_empty']:.2f})"
        gat = f"{r['noop_ms_per_branch_gather']:.2f} ({r['noop_ms_per_branch_gather_over_empty']:.2f})"
        lines.append(f"{r['branches']:>5} {limit:>6} {seq:>22} {gat:>22}")
    return lines
