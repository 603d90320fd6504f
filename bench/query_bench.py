"""``manage.py weft_bench --query-latency [N[,N...]]``: the latency of ``handle.query()`` against history length.

For each length N (10, 1,000 and 10,000 steps by default) one run of the ``weft.bench.query`` workflow is
started and executed through the engine's normal path (:func:`django_weft.services.maintenance.execute_runnable`, in
this thread): its code makes N durable calls, alternately an activity (``ctx.run(weft.bench.step, i)``) and
``ctx.now()``, then waits for signal ``stop``, so its journal holds N + 1 real rows, written by the engine.
A query handler ``state`` (registered before the first step) answers the state the code rebuilt: the steps
made, the sum of the activities' results and the last recorded time.

Then ``handle.query("state")`` is called ``repeat`` times, one after another (after one untimed call, reported
as ``first_ms``): p50, p95 and max wall time, ms per 1,000 steps (p50 x 1,000 / N), and the statements each
query sends: on a journal of 200 rows or more, the state kept since the first
(django_weft.services.replay_cache), as a run that has not moved is queried again. The same queries with
``WEFT_REPLAY_CACHE_ROWS = 0`` (``replaying_p50_ms``) replay each time, as the first query after the run moves
does. Each answer must equal the state the journal holds, and the run must be left as it was (status, fence,
updated_at, journal rows): a query executes and writes nothing. The same number of times, the two
parts of a query that grow with N are timed alone: loading the journal rows (``fetch_p50_ms``: the querysets
:mod:`django_weft.services.queries` evaluates) and the dry replay over rows already loaded (``replay_p50_ms``:
:func:`django_weft.services.replay_check.replay_dry`); the rest of a query (reading the run, the handler, the copy of
its answer) is what p50 leaves. The marginal cost per 1,000 steps is the slope of p50 between the shortest
and the longest history.

The database's raw single-connection commit rate is measured first (:func:`.core.measure_commit_rate`), so
the figures compare across machines. Runs are deleted afterwards unless ``--keep``. Importing this module
registers the ``weft.bench.query`` workflow.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.test import override_settings

from bench.core import (
    BenchError,
    SqlCounter,
    bench_step,
    delete_bench_runs,
    load_average,
    measure_commit_rate,
    percentile,
)
from django_weft.common import clock
from django_weft.common.registry import workflow
from django_weft.conf import weft_settings

QUERY_WORKFLOW = "weft.bench.query"
QUERY_NAME = "state"
STOP_SIGNAL = "stop"
DEFAULT_LENGTHS = (10, 1_000, 10_000)
DEFAULT_QUERIES = 20


@workflow(name=QUERY_WORKFLOW)
def query_workflow(ctx: Any, spec: dict) -> dict:
    """``spec``: ``steps`` (N). N durable calls, alternately an activity and ``ctx.now()``, then a wait for
    signal ``stop``; query ``state`` answers what the code has rebuilt."""
    state: dict[str, Any] = {"steps": 0, "total": 0, "last_at": None}
    ctx.set_query_handler(QUERY_NAME, lambda: dict(state))
    for i in range(spec["steps"]):
        if i % 2 == 0:
            state["total"] += ctx.run(bench_step, i)
        else:
            state["last_at"] = ctx.now().isoformat()
        state["steps"] += 1
    ctx.wait_for_signal(STOP_SIGNAL)
    return state


def parse_lengths(text: str) -> list[int]:
    """``"10,1000,10000"`` as the distinct history lengths, shortest first; ValueError if malformed or past
    WEFT_MAX_HISTORY (a run of N steps journals N + 1 rows: its signal wait)."""
    limit = int(weft_settings.MAX_HISTORY)
    lengths: set[int] = set()
    for part in str(text).split(","):
        part = part.strip().replace("_", "")
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--query-latency takes history lengths (steps) of at least 1, separated by commas "
                             f"(e.g. 10,1000,10000), got {text!r}")
        if int(part) + 1 > limit:
            raise ValueError(f"--query-latency {part}: the run's journal (its steps and the signal wait) would pass "
                             f"WEFT_MAX_HISTORY ({limit})")
        lengths.add(int(part))
    return sorted(lengths)


def expected_state(steps: int, journal: list) -> dict[str, Any]:
    """What query ``state`` must answer for a run of ``steps`` steps with this journal."""
    from django_weft.common.codec import decode
    from django_weft.models import StepKind

    times = [step for step in journal if step.kind == StepKind.NOW]
    return {"steps": steps, "total": sum(range(0, steps, 2)),
            "last_at": decode(max(times, key=lambda s: s.seq).result).isoformat() if times else None}


def _snapshot(run_id: Any) -> tuple:
    from django_weft.models import Workflow, WorkflowStep

    run = Workflow.objects.get(pk=run_id)
    steps = WorkflowStep.objects.filter(run_id=run_id)
    return run.status, run.fence, run.updated_at, steps.count(), max(steps.values_list("pk", flat=True), default=None)


def build_run(steps: int, prefix: str) -> tuple[Any, float]:
    """Start and execute a run of ``steps`` steps until it waits for its signal; its handle and the drive's
    seconds."""
    from django_weft.models import RunStatus, StepKind, StepStatus, WorkflowStep
    from django_weft.services import client
    from django_weft.services.maintenance import MaintenanceReport, default_owner, execute_runnable

    handle = client.start(query_workflow, {"steps": steps}, workflow_id=f"{prefix}{steps}")
    report = MaintenanceReport()
    began = time.perf_counter()
    execute_runnable(None, report, default_owner())
    seconds = time.perf_counter() - began
    run = handle.refresh()
    journal = WorkflowStep.objects.filter(run_id=run.pk)
    last = journal.order_by("-seq").first()
    if (run.status != RunStatus.WAITING or journal.count() != steps + 1 or last is None
            or (last.seq, last.kind, last.name, last.status) != (steps + 1, StepKind.SIGNAL, STOP_SIGNAL,
                                                                 StepStatus.WAITING)):
        raise BenchError(f"run {run.pk} of {steps} step(s): executing it ended {dict(report.outcomes)}, the run is "
                         f"{run.status} ({run.error or run.wait_reason}) with {journal.count()} journal row(s), not "
                         f"waiting for signal {STOP_SIGNAL!r} at step {steps + 1}")
    return handle, seconds


def measure(handle: Any, steps: int, repeat: int, using: str) -> dict[str, Any]:
    """Time ``repeat`` queries of the run (after one untimed) and the parts of a query that grow with it."""
    from django_weft.models import Timer, WorkflowStep
    from django_weft.models.instances import loaded as loaded_rows
    from django_weft.services.replay_check import replay_dry

    run_id = handle.run_id
    before = _snapshot(run_id)
    expected = expected_state(steps, list(WorkflowStep.objects.filter(run_id=run_id)))
    began = time.perf_counter()
    first = handle.query(QUERY_NAME)
    first_s = time.perf_counter() - began
    walls: list[float] = []
    answers: list[Any] = [first]
    with SqlCounter(using) as counter, connections[using].execute_wrapper(counter):
        counter.active = True
        for _ in range(repeat):
            began = time.perf_counter()
            answers.append(handle.query(QUERY_NAME))
            walls.append(time.perf_counter() - began)
        counter.active = False
    # The same queries with the kept state turned off: each replays the journal, as the first query after the
    # run moves does.
    replaying: list[float] = []
    with override_settings(WEFT_REPLAY_CACHE_ROWS=0):
        for _ in range(repeat):
            began = time.perf_counter()
            answers.append(handle.query(QUERY_NAME))
            replaying.append(time.perf_counter() - began)
    wrong = [answer for answer in answers if answer != expected]
    if wrong:
        raise BenchError(f"run {run_id} of {steps} step(s): query {QUERY_NAME!r} answered {wrong[0]!r}, "
                         f"expected {expected!r}")
    after = _snapshot(run_id)
    if after != before:
        raise BenchError(f"run {run_id} of {steps} step(s): the queries changed the run: (status, fence, "
                         f"updated_at, journal rows, last step id) {before} before, {after} after")

    run = handle.refresh()
    loads: list[float] = []
    replays: list[float] = []
    for _ in range(repeat):
        began = time.perf_counter()
        journal = list(loaded_rows(WorkflowStep.objects.filter(run=run)))
        timers = list(Timer.objects.filter(run=run, fired_at__isnull=True, seq__isnull=False))
        loaded = time.perf_counter()
        ctx, stopped = replay_dry(run, journal, timers)
        ended = time.perf_counter()
        if stopped is not None or ctx._seq != steps + 1:
            raise BenchError(f"run {run_id}: its dry replay stopped at step {ctx._seq} ({stopped!r}), not at its "
                             f"signal wait (step {steps + 1})")
        loads.append(loaded - began)
        replays.append(ended - loaded)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 3)

    p50 = percentile(walls, 50)
    assert p50 is not None  # repeat >= 1
    return {
        "steps": steps,
        "journal_rows": before[3],
        "queries": repeat,
        "first_ms": ms(first_s),
        "p50_ms": ms(p50),
        "p95_ms": ms(percentile(walls, 95)),
        "max_ms": ms(max(walls)),
        "ms_per_1000_steps": round(p50 * 1000 * 1000 / steps, 3),
        "replaying_p50_ms": ms(percentile(replaying, 50)),
        "replaying_p95_ms": ms(percentile(replaying, 95)),
        "fetch_p50_ms": ms(percentile(loads, 50)),
        "replay_p50_ms": ms(percentile(replays, 50)),
        "statements_per_query": round(counter.counts["queries"] / repeat, 2),
        "answer": expected,
    }


def run_query_bench(*, lengths: list[int], repeat: int = DEFAULT_QUERIES, probe_seconds: float = 2.0,
                    keep: bool = False, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures. Raises :class:`BenchError` if a run does not reach its signal
    wait, a query answers otherwise than its journal says, or a query changes the run."""
    from django_weft.models import Workflow

    using = router.db_for_write(Workflow)
    connection = connections[using]
    if connection.in_atomic_block:
        raise BenchError("called inside a transaction: nothing would commit, so nothing would be measured as "
                         "it runs in production")
    open_before = Workflow.objects.open().count()
    if open_before:
        progress(f"note: {open_before} open run(s) already in the database; the bench executes any that are "
                 "runnable too")
    load_before = load_average()
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commit rate {raw_rate:.0f}/s")
    since = clock.now()
    prefix = f"weft-bench-query-{uuid.uuid4().hex[:12]}-"
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    handles: list[Any] = []
    try:
        for steps in lengths:
            handle, drive_seconds = build_run(steps, prefix)
            handles.append(handle)
            progress(f"{steps} step(s): run driven in {drive_seconds:.2f}s; {repeat} queries to time")
            row = {**measure(handle, steps, repeat, using), "drive_seconds": round(drive_seconds, 3),
                   "loadavg": load_average()}
            rows.append(row)
            progress(f"{steps} step(s): p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms")
    finally:
        if not keep:
            progress("deleting the bench's runs")
            delete_bench_runs([h.run_id for h in handles], QUERY_WORKFLOW, since)
    shortest, longest = rows[0], rows[-1]
    marginal = None
    if longest["steps"] > shortest["steps"]:
        marginal = round((longest["p50_ms"] - shortest["p50_ms"]) * 1000 / (longest["steps"] - shortest["steps"]), 3)
    return {
        "mode": "query_latency",
        "vendor": connection.vendor,
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg": load_average(),
        "debug": bool(settings.DEBUG),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "queries_per_length": repeat,
        "lengths": rows,
        "marginal_ms_per_1000_steps": marginal,
        "runs": len(handles),
        "total_seconds": round(time.perf_counter() - began, 1),
    }


def format_table(figures: dict[str, Any]) -> list[str]:
    """The figures as the lines the command prints (before the JSON line)."""
    f = figures
    lines = [
        f"weft_bench --query-latency: {f['vendor']}, {f['cpus']} cpu(s), load {f['loadavg_before']} at the start, "
        f"{f['loadavg']} at the end; raw commits {f['raw_commits_per_second']:,.0f}/s",
        f"one run per history length, waiting for signal {STOP_SIGNAL!r} after N durable steps (alternately "
        "ctx.run(weft.bench.step) and ctx.now()), executed by execute_runnable() in drive s; then "
        f"{f['queries_per_length']} handle.query({QUERY_NAME!r}) calls one at a time, after one untimed (first ms)",
        "replaying p50: the same queries with WEFT_REPLAY_CACHE_ROWS = 0 (each replays, as the first after the run "
        "moves does); fetch ms: loading the journal rows alone, replay ms: the dry replay over loaded rows alone "
        "(p50 of as many); stmts: statements per query",
        "",
        f"{'steps':>7} {'journal':>8} {'drive s':>8} {'first ms':>9} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9} "
        f"{'ms/1k steps':>12} {'replaying p50':>14} {'fetch ms':>9} {'replay ms':>10} {'stmts':>6}",
    ]
    for r in f["lengths"]:
        lines.append(f"{r['steps']:>7,} {r['journal_rows']:>8,} {r['drive_seconds']:>8.2f} {r['first_ms']:>9.2f} "
                     f"{r['p50_ms']:>9.2f} {r['p95_ms']:>9.2f} {r['max_ms']:>9.2f} {r['ms_per_1000_steps']:>12.2f} "
                     f"{r['replaying_p50_ms']:>14.2f} {r['fetch_p50_ms']:>9.2f} {r['replay_p50_ms']:>10.2f} "
                     f"{r['statements_per_query']:>6.1f}")
    if f["marginal_ms_per_1000_steps"] is not None:
        shortest, longest = f["lengths"][0]["steps"], f["lengths"][-1]["steps"]
        lines += ["", f"marginal cost: {f['marginal_ms_per_1000_steps']:.2f} ms per 1,000 steps (p50 from "
                      f"{shortest:,} to {longest:,} steps)"]
    return lines
