"""``manage.py weft_bench --find``: ``weft.list_runs`` and ``weft.count_runs`` against a large seeded history.

The runs are those :mod:`.seed` writes with their search attributes (``--find --seed-runs N`` seeds N more
first, then ``VACUUM ANALYZE``; without ``--seed-runs`` the runs seeded before are used). They are kept
afterwards, so a million runs are seeded once and timed as often as wanted; ``--drop-seeded`` deletes them.
The attributes are declared for the bench (``WEFT_SEARCH_ATTRIBUTES`` overridden with
:data:`.seed.SEED_ATTRIBUTES`) and the six seeded workflow types registered, so the filters are checked as
an operator's are.

Each query of :func:`queries` is sent once untimed (``first_ms``: a cold cache shows there), then
``repeat`` times: p50, p95 and max wall time of the call as an operator makes it (a page is
``list(weft.list_runs(...)[:50])``, a count ``weft.count_runs(...)``, rows built included). The statement
it sent is captured and explained with ``EXPLAIN (ANALYZE, BUFFERS)`` on PostgreSQL (``EXPLAIN`` on MySQL,
``EXPLAIN QUERY PLAN`` on SQLite): its plan is in the figures, summed up (PostgreSQL) as the scans it makes,
the rows they return and the execution time. The values filtered on come from the data: a customer of a few
runs and one of the ten large ones, a rare and a common region, amounts and due dates relative to the newest seeded run.

The database's raw single-connection commit rate is measured first (:func:`.core.measure_commit_rate`), so
the figures compare across machines. :data:`TARGET_MS` is the goal of design §8.5 for a page and a count.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connections, router
from django.test.utils import override_settings

from bench import seed
from bench.core import BenchError, load_average, measure_commit_rate, percentile
from django_weft.common.registry import workflow
from django_weft.models import SearchAttributeValue, Workflow
from django_weft.services import visibility

TARGET_MS = 300
PAGE = 50
DEFAULT_REPEAT = 20
HELP = (" With --find it times weft.list_runs (first pages of 50: by status and type, by attribute equality and "
        "range, by failure category, tags and created date) and weft.count_runs (grouped by status, type, failure "
        "category and attribute, over everything and filtered) against the runs seeded with search attributes "
        "(--seed-runs N seeds N more first; they are kept unless --drop-seeded): p50/p95/max ms over --repeat "
        "(20) calls after one untimed, and the EXPLAIN (ANALYZE, BUFFERS) plan of each (see "
        "bench.find_bench).")
# The options of the other modes, refused beside --find (those with defaults cannot be told apart).
OTHER_MODES = ("workflows", "schedules", "profile", "processes", "celery_workers", "latency", "parallel",
               "sleep_seconds", "query_latency", "replay_check", "milestones", "plain_milestones", "window",
               "continue_every", "interval")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--find", action="store_true",
                        help="Time weft.list_runs / weft.count_runs against the seeded runs (with --seed-runs N: "
                             "seed N more, with search attributes, first) and print each query's plan.")
    parser.add_argument("--drop-seeded", action="store_true",
                        help="With --find: delete the seeded runs afterwards (they are kept by default).")


def chosen(options: dict[str, Any]) -> bool:
    """Whether the command's options are for this mode (--drop-seeded alone is, to be refused)."""
    return bool(options.get("find") or options.get("drop_seeded"))


def mode(options: dict[str, Any]) -> tuple[Callable[..., dict], Callable[[dict], list[str]]]:
    """``--find``'s run and table for ``Command.run_mode``, from the command's options (checked)."""
    if not options.get("find"):
        raise CommandError("--drop-seeded goes with --find")
    others = [name for name in OTHER_MODES if options.get(name) is not None]
    if others or options.get("continue_as_new") or options.get("prestart"):
        raise CommandError("--find goes alone (with --seed-runs, --seed-steps, --repeat, --probe-seconds, "
                           "--drop-seeded)")
    if options.get("keep") and options["drop_seeded"]:
        raise CommandError("pass --keep or --drop-seeded, not both (--find keeps the seeded runs by default)")
    runs, repeat = options.get("seed_runs"), options.get("repeat")
    if runs is not None and (runs < 1 or options["seed_steps"] < 0):
        raise CommandError("--seed-runs must be at least 1 and --seed-steps 0 or more")
    if repeat is not None and repeat < 1:
        raise CommandError("--repeat must be at least 1")
    if options["probe_seconds"] <= 0:
        raise CommandError("--probe-seconds must be positive")
    options["keep"] = not options["drop_seeded"]  # what an interrupted run says it left
    return partial(run_find_bench, seed_runs=runs, seed_steps=options["seed_steps"],
                   repeat=DEFAULT_REPEAT if repeat is None else repeat, probe_seconds=options["probe_seconds"],
                   drop=options["drop_seeded"]), format_table


def _seeded_type(ctx: Any) -> None:
    """The code of the seeded workflow types: registered so ``type=`` filters take them; never executed."""


def register_seed_types() -> None:
    for _, name in seed.TYPE_MIX:
        workflow(name=seed.SEED_PREFIX + name)(_seeded_type)


def query_values(using: str) -> dict[str, Any]:
    """The values the queries filter on, read from the seeded data."""
    seeded = Workflow.objects.using(using).filter(workflow_type__startswith=seed.SEED_PREFIX)
    newest = seeded.order_by("-created_at").values_list("created_at", flat=True).first()
    if newest is None:
        raise BenchError("no seeded runs on this database: seed them with weft_bench --find --seed-runs N")
    total = seeded.count()
    ids = [f"{seed.SEED_ID_PREFIX}{i}" for i in range(total // 2, total // 2 + 200)]
    customer = (SearchAttributeValue.objects.using(using)
                .filter(run__workflow_id__in=ids, name="customer_id", int_value__gt=seed.LARGE_CUSTOMERS)
                .values_list("int_value", flat=True).first())
    if customer is None:
        raise BenchError("the seeded runs carry no search attributes (runs seeded by --seed-runs alone do not): "
                         "seed with weft_bench --find --seed-runs N")
    return {"newest": newest, "total": total, "customer": customer}


def queries(values: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, "page" or "count", the keywords of list_runs / count_runs)."""
    newest, t = values["newest"], seed.SEED_PREFIX
    return [
        ("status=failed, type=order", "page", {"status": "failed", "type": t + "order"}),
        ("status=waiting", "page", {"status": "waiting"}),
        ("type=audit (1%)", "page", {"type": t + "audit"}),
        ("customer_id = x (~8 runs)", "page", {"attributes": {"customer_id": values["customer"]}}),
        ("customer_id = 1 (large)", "page", {"attributes": {"customer_id": 1}}),
        ("region = af-south (2%)", "page", {"attributes": {"region": "af-south"}}),
        ("region = eu-west (30%)", "page", {"attributes": {"region": "eu-west"}}),
        ("customer_id = 1, region = ap-east", "page", {"attributes": {"customer_id": 1, "region": "ap-east"}}),
        ("region = sa-east, status=failed", "page", {"attributes": {"region": "sa-east"}, "status": "failed"}),
        ("amount >= 5000", "page", {"attributes": {"amount__gte": Decimal(5000)}}),
        ("amount 9990..9999", "page", {"attributes": {"amount__gte": Decimal(9990), "amount__lt": Decimal(9999)}}),
        ("due in a week, 3..10 days", "page", {"attributes": {"due__gte": newest + timedelta(days=3),
                                                              "due__lt": newest + timedelta(days=10)}}),
        ("due 200..199 days ago", "page", {"attributes": {"due__gte": newest - timedelta(days=200),
                                                          "due__lt": newest - timedelta(days=199)}}),
        # Matched only by old runs, which a walk newest first reaches last: the planner's estimate of a range
        # (so of where its matches are) decides between that walk and reading every match.
        ("due before 300 days ago (old)", "page", {"attributes": {"due__lt": newest - timedelta(days=300)}}),
        # The same with the bound on created_at an operator can add: the walk starts where the matches are.
        ("the same, created before then", "page", {"attributes": {"due__lt": newest - timedelta(days=300)},
                                                   "created_before": newest - timedelta(days=300)}),
        ("failure_category=system", "page", {"failure_category": "system"}),
        ("failure_category=timeout", "page", {"failure_category": "timeout"}),
        ("tags=[manual] (3%)", "page", {"tags": ["manual"]}),
        ("created past 7 days, completed", "page", {"created_after": newest - timedelta(days=7),
                                                    "status": "completed"}),
        ("count by status", "count", {"group_by": "status"}),
        ("count by type", "count", {"group_by": "type"}),
        ("count by failure_category", "count", {"group_by": "failure_category"}),
        ("count by region", "count", {"group_by": "region"}),
        ("count by status, type=payment", "count", {"group_by": "status", "type": t + "payment"}),
        ("count by status, past 30 days", "count", {"group_by": "status",
                                                    "created_after": newest - timedelta(days=30)}),
        ("count by failure_category, order", "count", {"group_by": "failure_category", "type": t + "order"}),
        ("count by region, status=failed", "count", {"group_by": "region", "status": "failed"}),
        ("count by region, failed, 30 days", "count", {"group_by": "region", "status": "failed",
                                                       "created_after": newest - timedelta(days=30)}),
        ("count by vip, customer_id = 1", "count", {"group_by": "vip", "attributes": {"customer_id": 1}}),
    ]


class _Capture:
    """The statements sent while active (an execute wrapper)."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
        self.statements.append((sql, params))
        return execute(sql, params, many, context)


def call(kind: str, filters: dict[str, Any]) -> int:
    """One page or count as an operator asks for it; the rows (runs listed, or groups counted)."""
    if kind == "page":
        return len(list(visibility.list_runs(**filters)[:PAGE]))
    return len(visibility.count_runs(**filters))


def explain(using: str, sql: str, params: Any) -> list[str]:
    connection = connections[using]
    head = {"postgresql": "EXPLAIN (ANALYZE, BUFFERS) ", "mysql": "EXPLAIN "}.get(connection.vendor,
                                                                                "EXPLAIN QUERY PLAN ")
    with connection.cursor() as cursor:
        cursor.execute(head + sql, params)
        return [" | ".join(str(cell) for cell in row) for row in cursor.fetchall()]


_SCAN = re.compile(r"((?:Parallel )?(?:Seq|Index|Index Only|Bitmap Heap|Bitmap Index) Scan)(?: using (\S+))?"
                   r"(?: on (\S+))?.*?actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=(\d+)")
_EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")
_JIT = re.compile(r"Timing: .*Total ([\d.]+) ms")


def summarize(plan: list[str]) -> dict[str, Any]:
    """The scans of a PostgreSQL plan (kind, index or table, rows x loops), its execution time and the part of it
    JIT compilation took (PostgreSQL compiles a query its planner thinks costly: jit_above_cost)."""
    scans = []
    for line in plan:
        match = _SCAN.search(line)
        if match:
            kind, index, table, rows, loops = match.groups()
            where = index or (table or "").removeprefix("django_weft_")
            scans.append(f"{kind} {where} {int(rows) * int(loops)}" + (f" ({loops} loops)" if loops != "1" else ""))
    def figure(pattern: re.Pattern) -> float | None:
        return next((float(m.group(1)) for m in map(pattern.search, plan) if m), None)

    return {"scans": scans, "execution_ms": figure(_EXECUTION), "jit_ms": figure(_JIT)}


def measure(using: str, name: str, kind: str, filters: dict[str, Any], repeat: int) -> dict[str, Any]:
    capture = _Capture()
    connection = connections[using]
    began = time.perf_counter()
    with connection.execute_wrapper(capture):
        rows = call(kind, filters)
    first = time.perf_counter() - began
    walls = []
    for _ in range(repeat):
        began = time.perf_counter()
        call(kind, filters)
        walls.append(time.perf_counter() - began)
    if len(capture.statements) != 1:
        raise BenchError(f"{name}: expected one statement, {len(capture.statements)} were sent")
    plan = explain(using, *capture.statements[0])
    p50, p95 = percentile(walls, 50), percentile(walls, 95)
    assert p50 is not None and p95 is not None  # repeat >= 1
    return {"name": name, "kind": kind, "filters": {k: str(v) for k, v in filters.items()}, "rows": rows,
            "first_ms": round(first * 1000, 2), "p50_ms": round(p50 * 1000, 2), "p95_ms": round(p95 * 1000, 2),
            "max_ms": round(max(walls) * 1000, 2), "under_target": max(walls) * 1000 < TARGET_MS,
            **summarize(plan), "plan": plan}


def table_sizes(using: str) -> dict[str, Any]:
    connection = connections[using]
    models = (Workflow, SearchAttributeValue)
    if connection.vendor != "postgresql":
        return {model._meta.db_table: None for model in models}
    with connection.cursor() as cursor:
        sizes = {}
        for model in models:
            cursor.execute("SELECT pg_total_relation_size(%s), pg_relation_size(%s)", [model._meta.db_table] * 2)
            total, heap = cursor.fetchone()
            sizes[model._meta.db_table] = {"total_mb": round(total / 2**20, 1), "heap_mb": round(heap / 2**20, 1)}
        return sizes


def run_find_bench(*, seed_runs: int | None = None, seed_steps: int = 10, repeat: int = DEFAULT_REPEAT,
                   probe_seconds: float = 2.0, drop: bool = False,
                   progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Seed (if asked), time every query of :func:`queries`, and return the figures."""
    using = router.db_for_write(Workflow)
    connection = connections[using]
    if connection.in_atomic_block:
        raise BenchError("called inside a transaction: the seed would not commit, nor be vacuumed")
    register_seed_types()
    load_before = load_average()
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commit rate {raw_rate:.0f}/s")
    began = time.perf_counter()
    seeded, cleaned = None, None
    rows: list[dict[str, Any]] = []
    try:
        if seed_runs is not None:
            seeded = seed.seed(seed_runs, seed_steps, progress, attributes=True)
        with override_settings(WEFT_SEARCH_ATTRIBUTES=seed.SEED_ATTRIBUTES):
            values = query_values(using)
            progress(f"{values['total']} seeded runs; timing {repeat} calls of each query")
            for name, kind, filters in queries(values):
                row = measure(using, name, kind, filters, repeat)
                rows.append(row)
                progress(f"{name}: p50 {row['p50_ms']:.1f} ms, max {row['max_ms']:.1f} ms ({row['rows']} rows)")
        figures = {
            "mode": "find", "vendor": connection.vendor, "cpus": os.cpu_count(), "loadavg_before": load_before,
            "loadavg": load_average(), "debug": bool(settings.DEBUG), "raw_commits_per_second": round(raw_rate, 1),
            "probe_commits": probe_commits, "seed": seeded, "seeded_runs": values["total"],
            "runs": Workflow.objects.using(using).count(),
            "attribute_rows": SearchAttributeValue.objects.using(using).count(), "sizes": table_sizes(using),
            "repeat": repeat, "page": PAGE, "target_ms": TARGET_MS,
            "over_target": [row["name"] for row in rows if not row["under_target"]], "queries": rows,
        }
    finally:
        if drop:
            progress("deleting the seeded runs (--drop-seeded)")
            cleaned = seed.cleanup(progress)
    figures["cleanup"] = cleaned
    figures["total_seconds"] = round(time.perf_counter() - began, 1)
    return figures


def format_table(figures: dict[str, Any]) -> list[str]:
    """The figures as the lines the command prints (before the JSON line): the table, then every plan."""
    f = figures
    sizes = ", ".join(f"{table.removeprefix('django_weft_')} {size['total_mb']:,.0f} MB" for table, size in
                      f["sizes"].items() if size)
    lines = [
        f"weft_bench --find: {f['vendor']}, {f['cpus']} cpu(s), load {f['loadavg_before']} at the start, "
        f"{f['loadavg']} at the end; raw commits {f['raw_commits_per_second']:,.0f}/s",
        f"{f['runs']:,} runs ({f['seeded_runs']:,} seeded), {f['attribute_rows']:,} attribute rows"
        + (f"; {sizes}" if sizes else "")
        + (f"; seeded {f['seed']['runs']:,} in {f['seed']['seed_seconds']:.0f}s" if f["seed"] else ""),
        f"a page is list(weft.list_runs(...)[:{f['page']}]), a count weft.count_runs(...); {f['repeat']} calls "
        f"each after one untimed (first ms); target {f['target_ms']} ms; from the plan: execution ms, of which JIT "
        "compilation, and the scans (rows returned, x loops)",
        "",
        f"{'query':<34} {'rows':>5} {'first ms':>9} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'exec ms':>8} "
        f"{'jit ms':>6}  scans",
    ]
    for r in f["queries"]:
        executed = f"{r['execution_ms']:>8.1f}" if r["execution_ms"] is not None else f"{'':>8}"
        jit = f"{r['jit_ms']:>6.1f}" if r["jit_ms"] is not None else f"{'':>6}"
        lines.append(f"{r['name']:<34} {r['rows']:>5} {r['first_ms']:>9.1f} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f} "
                     f"{r['max_ms']:>8.1f} {executed} {jit}  {'; '.join(r['scans'])}"
                     + ("" if r["under_target"] else "  OVER TARGET"))
    lines += ["", f"over {f['target_ms']} ms: " + (", ".join(f["over_target"]) or "none")]
    for r in f["queries"]:
        lines += ["", f"EXPLAIN {r['name']} ({r['kind']}, {r['filters']}):", *(f"    {line}" for line in r["plan"])]
    return lines
