"""Seed a large run history and time the run admin against it (``manage.py weft_bench --seed-runs N``).

:func:`seed` writes N runs and N*K journal rows. On PostgreSQL it is set-based (``INSERT ... SELECT FROM
generate_series``, one statement per chunk that inserts the runs and, through a data-modifying CTE, their
steps), then ``VACUUM ANALYZE`` so the planner sees what a long-lived, autovacuumed table looks like. Other
databases get a ``bulk_create`` path meant for small sizes (tests, a laptop). Every seeded run has a
``workflow_type`` starting with :data:`SEED_PREFIX`; :func:`cleanup` deletes them and their journal.

The mix: a year of history (``created_at`` evenly spread, newest last), about 80% completed, 5% failed,
2% cancelled, 1% timed out, 8% waiting, 2% pending, 1.5% running and 0.5% suspended; six workflow types
from 40% down to 1% of the runs; failed runs in failure categories (70% application, 15% timeout, 10%
resource, 5% system; cancelled runs "cancellation", timed out ones "timeout"); 45% of the runs tagged
(:data:`TAG_MIX`); the newest third on version 2. It satisfies the check constraints: finished runs have
``finished_at``, only open runs have ``runnable_at``, waiting runs hold no lease, and every open run has its
own ``workflow_id``.

With ``attributes=True`` every run also carries the search attributes :data:`SEED_ATTRIBUTES` declares, on
its row (``search_attributes``) and as :class:`~django_weft.models.SearchAttributeValue` rows inserted by
the same statement (from the row's JSON, so both always agree): ``region`` (keyword, 8 regions from 30%
down to 2%) and ``vip`` (bool, 5% true) on every run; ``customer_id`` (int) on the order, payment and email
runs (80%), about 100,000 customers of a few runs each plus 10 large ones (1..10) with 0.2% of the runs
each; ``amount`` (decimal, log-uniform from 1.00 to 10,000.00) and ``due`` (datetime, 1 to 30 days after
``created_at``) on the order and payment runs (65%). The values are pseudo-random but fixed by the run's
number (a hash), so a seed is repeatable.

:func:`seed_big_run` adds one waiting run of 1,000 journal rows (``bulk_create``): 50 branches of code
(``ctx.start_branch``, in groups of 10 overlapping in time, each with its rows at ``branch_block(start) + n``),
gathers of 8 activities overlapping in time, sleeps, every 10th activity retried twice (its ``StepAttempt`` rows and
retry backoff timers), signal waits with the signals they consumed, and a last signal wait pending with its timeout
timer. Its code (:func:`big_run`) is registered, so the page's Queries panel replays the journal as for a real run.
It is deleted and written again on every timing, and deleted with the other seeded runs by :func:`cleanup`.

:func:`time_admin_pages` requests the run changelist (unfiltered, by status, by type, by a created-date
range, a search by workflow id), a run's detail page and the big run's page through Django's test ``Client`` in
this process, as a superuser. It reports the p50, p95 and max server time over ``repetitions`` requests and, from
one extra captured request per page, the number of SQL statements, their total time, and any ``COUNT(`` that is
not bounded by a ``LIMIT`` (a full-table count).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from django.db import connections, reset_queries, router
from django.test.utils import CaptureQueriesContext

from django_weft.common import clock
from django_weft.common.attributes import COLUMNS as attribute_columns
from django_weft.common.attributes import to_json
from django_weft.common.codec import encode
from django_weft.common.positions import BRANCH_BASE, branch_block
from django_weft.common.registry import workflow
from django_weft.models import (
    AttemptOutcome,
    RunStatus,
    SearchAttributeValue,
    Signal,
    StepAttempt,
    StepKind,
    StepStatus,
    Timer,
    TimerPurpose,
    Workflow,
    WorkflowStep,
)
from django_weft.runtime.activities import activity

SEED_PREFIX = "bench.seed."
SEED_ID_PREFIX = "bench-seed-"
SEED_ADMIN_USERNAME = "weft-bench-seed-admin"
SEED_CHUNK = 100_000
SQLITE_MAX_RUNS = 50_000
DEFAULT_REPETITIONS = 20  # timed requests per admin page (after one warm-up and one with its queries captured)
HISTORY_DAYS = 365
# Per mille, cumulative; the hash below spreads them over the table.
STATUS_MIX = [
    (800, RunStatus.COMPLETED), (850, RunStatus.FAILED), (870, RunStatus.CANCELLED), (880, RunStatus.TIMED_OUT),
    (960, RunStatus.WAITING), (980, RunStatus.PENDING), (995, RunStatus.RUNNING), (1000, RunStatus.SUSPENDED),
]
TYPE_MIX = [(40, "order"), (65, "payment"), (80, "email"), (90, "report"), (99, "sync"), (100, "audit")]
# Per cent, cumulative, each over its own hash of the run's number.
FAILURE_MIX = [(70, "application"), (85, "timeout"), (95, "resource"), (100, "system")]
TAG_MIX: list[tuple[int, list[str]]] = [(55, []), (70, ["batch"]), (85, ["api"]), (92, ["api", "priority"]),
                                        (97, ["batch", "nightly"]), (100, ["manual", "priority"])]
REGION_MIX = [(30, "eu-west"), (55, "us-east"), (70, "us-west"), (80, "eu-central"), (88, "ap-south"),
              (94, "ap-east"), (98, "sa-east"), (100, "af-south")]
SEED_ATTRIBUTES = {"customer_id": "int", "region": "keyword", "amount": "decimal", "due": "datetime", "vip": "bool"}
CUSTOMERS = 100_000
LARGE_CUSTOMERS = 10  # customer_id 1..10: 2% of the runs with a customer between them
MAX_AMOUNT = 10_000

Progress = Callable[[str], None]


def _noop(message: str) -> None:
    pass


def _db() -> str:
    return router.db_for_write(Workflow)


def _case(expr: str, mix: Sequence[tuple[int, Any]], fmt: Callable[[Any], str]) -> str:
    whens = " ".join(f"WHEN {expr} < {bound} THEN {fmt(value)}" for bound, value in mix[:-1])
    return f"CASE {whens} ELSE {fmt(mix[-1][1])} END"


def seed_type(i: int) -> str:
    return SEED_PREFIX + next(v for bound, v in TYPE_MIX if i % 100 < bound)


def seed_status(i: int) -> str:
    return next(v for bound, v in STATUS_MIX if (i * 7919) % 1000 < bound)


def _pick(mix: Sequence[tuple[int, Any]], value: int) -> Any:
    return next(v for bound, v in mix if value < bound)


def _hash(i: int, k: int) -> int:
    """A repeatable pseudo-random 31-bit number for run ``i`` and purpose ``k`` (the ORM path's)."""
    return int.from_bytes(hashlib.blake2b(b"%d:%d" % (i, k), digest_size=8).digest(), "big") & 0x7FFFFFFF


def seed_failure_category(i: int, status: str) -> str:
    if status == RunStatus.FAILED:
        return str(_pick(FAILURE_MIX, _hash(i, 8) % 100))
    return {str(RunStatus.CANCELLED): "cancellation", str(RunStatus.TIMED_OUT): "timeout"}.get(status, "")


def seed_attributes(i: int, created: datetime) -> dict[str, Any]:
    """The search attributes of seeded run ``i`` (the PostgreSQL path draws the same mix with its own hash)."""
    values: dict[str, Any] = {"region": _pick(REGION_MIX, _hash(i, 3) % 100), "vip": _hash(i, 6) % 100 < 5}
    if i % 100 < 80:
        customer = _hash(i, 2)
        large = _hash(i, 1) % 100 < 2
        values["customer_id"] = 1 + customer % LARGE_CUSTOMERS if large else LARGE_CUSTOMERS + 1 + customer % CUSTOMERS
    if i % 100 < 65:
        amount = math.exp(math.log(MAX_AMOUNT) * (_hash(i, 4) % 1_000_000) / 1_000_000)
        values["amount"] = Decimal(amount).quantize(Decimal("0.01"))
        due = _hash(i, 5)
        values["due"] = created + timedelta(days=1 + due % 30, hours=due // 30 % 24)
    return values


def seed(runs: int, steps_per_run: int = 10, progress: Progress | None = None, *,
         attributes: bool = False) -> dict[str, Any]:
    """Add ``runs`` seeded runs with ``steps_per_run`` journal rows each (and with ``attributes``, the search
    attributes of :data:`SEED_ATTRIBUTES`); returns counts and timings."""
    progress = progress or _noop
    connection = connections[_db()]
    started = time.perf_counter()
    if connection.vendor == "postgresql":
        _seed_postgresql(connection, runs, steps_per_run, progress, attributes)
    else:
        if runs > SQLITE_MAX_RUNS:
            raise ValueError(f"seeding more than {SQLITE_MAX_RUNS} runs needs PostgreSQL")
        _seed_orm(runs, steps_per_run, progress, attributes)
    seeded = time.perf_counter() - started
    return {"vendor": connection.vendor, "runs": runs, "steps_per_run": steps_per_run,
            "steps": runs * steps_per_run, "attributes": attributes, "seed_seconds": round(seeded, 1)}


def seeded_count() -> int:
    """The seeded runs on the database (the big run included)."""
    return Workflow.objects.using(_db()).filter(workflow_type__startswith=SEED_PREFIX).count()


def _first_index(connection: Any) -> int:
    """Seeded numbering continues after earlier seeds, so workflow ids stay unique."""
    return Workflow.objects.using(connection.alias).filter(workflow_type__startswith=SEED_PREFIX).exclude(
        workflow_id=BIG_RUN_ID).count()


def _hash_sql(k: int) -> str:
    return f"(hashint8extended(i::bigint, {k}) & 2147483647)"


def _attributes_sql() -> str:
    """The JSON of a seeded run's attributes (see :func:`seed_attributes`), over ``i`` and ``created_at``."""
    region = _case(f"mod({_hash_sql(3)}, 100)", REGION_MIX, lambda v: f"'{v}'")
    customer = (f"CASE WHEN mod({_hash_sql(1)}, 100) < 2 THEN 1 + mod({_hash_sql(2)}, {LARGE_CUSTOMERS}) "
                f"ELSE {LARGE_CUSTOMERS + 1} + mod({_hash_sql(2)}, {CUSTOMERS}) END")
    amount = f"round(exp(ln({MAX_AMOUNT}) * mod({_hash_sql(4)}, 1000000) / 1000000.0)::numeric, 2)"
    due = (f"created_at + (1 + mod({_hash_sql(5)}, 30)) * interval '1 day' "
           f"+ mod({_hash_sql(5)} / 30, 24) * interval '1 hour'")
    return f"""jsonb_strip_nulls(jsonb_build_object(
        'region', {region}, 'vip', mod({_hash_sql(6)}, 100) < 5,
        'customer_id', CASE WHEN mod(i, 100) < 80 THEN {customer} END,
        'amount', CASE WHEN mod(i, 100) < 65 THEN trim_scale({amount})::text END,
        'due', CASE WHEN mod(i, 100) < 65 THEN {due} END))"""


def _attribute_rows_sql() -> str:
    """An INSERT of the SearchAttributeValue rows of the runs ``ins`` returned, from their JSON."""
    casts = {"int": "bigint", "decimal": "numeric", "keyword": "text", "datetime": "timestamptz", "bool": "boolean"}
    columns, values = [], []
    for kind, cast in casts.items():
        names = ", ".join(f"'{name}'" for name, declared in SEED_ATTRIBUTES.items() if declared == kind) or "NULL"
        columns.append(attribute_columns[kind])
        values.append(f"CASE WHEN a.key IN ({names}) THEN (a.value #>> '{{}}')::{cast} END")
    return f"""INSERT INTO {SearchAttributeValue._meta.db_table} (run_id, name, {", ".join(columns)}, created_at)
    SELECT ins.run_id, a.key, {", ".join(values)}, ins.created_at
    FROM ins CROSS JOIN LATERAL jsonb_each(ins.search_attributes) AS a"""


def _seed_postgresql(connection: Any, runs: int, steps: int, progress: Progress, attributes: bool) -> None:
    wf, st = Workflow._meta.db_table, WorkflowStep._meta.db_table
    now = clock.now()
    first = _first_index(connection)
    status = _case("mod(i::bigint * 7919, 1000)", STATUS_MIX, lambda v: f"'{v}'")
    wtype = _case("mod(i, 100)", TYPE_MIX, lambda v: f"'{SEED_PREFIX}{v}'")
    failed_category = _case(f"mod({_hash_sql(8)}, 100)", FAILURE_MIX, lambda v: f"'{v}'")
    tags = _case(f"mod({_hash_sql(7)}, 100)", TAG_MIX, lambda v: f"'{json.dumps(v)}'::jsonb")
    open_values = ", ".join(f"'{v}'" for v in RunStatus.open_values())
    # created_at: evenly over HISTORY_DAYS, the newest at "now"; i is the insertion order.
    total = first + runs
    sql = f"""
    WITH src AS (
        SELECT i, status, workflow_type, created_at,
               {_attributes_sql() if attributes else "'{}'::jsonb"} AS search_attributes
        FROM (SELECT i, {status} AS status, {wtype} AS workflow_type,
                     %(now)s::timestamptz - ((%(total)s - i) * (%(days)s * interval '1 day') / %(total)s) AS created_at
              FROM generate_series(%(lo)s, %(hi)s) AS i) AS base
    ), ins AS (
        INSERT INTO {wf} (run_id, workflow_id, workflow_type, version, status, input, result, error, failure_category,
                          termination_reason, tags, search_attributes, runnable_at, wait_reason, lease_owner, fence,
                          inbox_seq, retries, recoveries, recovery_mark, code_errors, cancel_reason,
                          awaiting_signals, parent_close_policy, created_at, started_at, updated_at, finished_at)
        SELECT gen_random_uuid(), '{SEED_ID_PREFIX}' || i, workflow_type,
               CASE WHEN i::bigint * 3 < 2 * %(total)s THEN 1 ELSE 2 END, status,
               '\\x81a26964ce'::bytea || int4send(i::int),
               CASE WHEN status = 'completed' THEN '\\x2a'::bytea END,
               CASE WHEN status = 'failed' THEN jsonb_build_object('type', 'ValueError', 'message',
                                                                   'seeded failure ' || i) END,
               CASE status WHEN 'failed' THEN {failed_category} WHEN 'cancelled' THEN 'cancellation'
                           WHEN 'timed_out' THEN 'timeout' ELSE '' END, '',
               {tags}, search_attributes,
               CASE status WHEN 'pending' THEN created_at
                           WHEN 'running' THEN %(now)s::timestamptz + interval '5 minutes'
                           WHEN 'waiting' THEN CASE WHEN mod(i, 2) = 0 THEN created_at + interval '400 days' END
               END,
               CASE WHEN status = 'waiting' THEN CASE WHEN mod(i, 2) = 0 THEN 'sleep' ELSE 'signal approve' END
                    ELSE '' END,
               CASE WHEN status = 'running' THEN 'bench-seed-worker' ELSE '' END,
               CASE WHEN status = 'pending' THEN 0 ELSE 1 END, 0, 0, 0, 0, 0, '',
               CASE WHEN status = 'waiting' AND mod(i, 2) = 1 THEN '["approve"]'::jsonb ELSE '[]'::jsonb END,
               'terminate', created_at,
               CASE WHEN status = 'pending' THEN NULL ELSE created_at + interval '10 milliseconds' END,
               created_at + interval '2 seconds',
               CASE WHEN status IN ({open_values}) THEN NULL ELSE created_at + interval '2 seconds' END
        FROM src
        RETURNING run_id, status, created_at, search_attributes
    ), journal AS (
        INSERT INTO {st} (run_id, seq, kind, name, status, result, error, failure_category, attempt, started_at,
                          finished_at)
        SELECT ins.run_id, s, 'activity', 'bench.seed.step' || s,
               CASE WHEN s = %(steps)s AND ins.status = 'failed' THEN 'failed'
                    WHEN s = %(steps)s AND ins.status = 'waiting' THEN 'waiting' ELSE 'completed' END,
               '\\x2a'::bytea,
               CASE WHEN s = %(steps)s AND ins.status = 'failed'
                    THEN '{{"type": "ValueError", "message": "seeded failure"}}'::jsonb END,
               CASE WHEN s = %(steps)s AND ins.status = 'failed' THEN 'application' ELSE '' END,
               1, ins.created_at + s * interval '100 milliseconds',
               CASE WHEN s = %(steps)s AND ins.status = 'waiting' THEN NULL
                    ELSE ins.created_at + s * interval '100 milliseconds' + interval '50 milliseconds' END
        FROM ins CROSS JOIN generate_series(1, %(steps)s) AS s
    )
    {_attribute_rows_sql()}
    """
    tables = [wf, st] + ([SearchAttributeValue._meta.db_table] if attributes else [])
    with connection.cursor() as cursor:
        for lo in range(first, first + runs, SEED_CHUNK):
            hi = min(lo + SEED_CHUNK, first + runs) - 1
            t0 = time.perf_counter()
            cursor.execute(sql, {"now": now, "total": total, "days": HISTORY_DAYS, "lo": lo, "hi": hi,
                                 "steps": steps})
            progress(f"seeded runs {lo - first + 1}..{hi - first + 1} of {runs} "
                     f"({time.perf_counter() - t0:.1f} s)")
        progress("VACUUM ANALYZE ...")
        t0 = time.perf_counter()
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {table}")
        progress(f"VACUUM ANALYZE done ({time.perf_counter() - t0:.1f} s)")


def _seed_orm(runs: int, steps: int, progress: Progress, attributes: bool) -> None:
    alias = _db()
    now = clock.now()
    first = _first_index(connections[alias])
    total = first + runs
    history = timedelta(days=HISTORY_DAYS)
    for lo in range(first, first + runs, 5000):
        batch, journal, values = [], [], []
        for i in range(lo, min(lo + 5000, total)):
            status = seed_status(i)
            created = now - (total - i) * history / total
            is_open = status in RunStatus.open_values()
            carried = seed_attributes(i, created) if attributes else {}
            run = Workflow(
                workflow_id=f"{SEED_ID_PREFIX}{i}", workflow_type=seed_type(i), status=status,
                version=1 if i * 3 < 2 * total else 2, failure_category=seed_failure_category(i, status),
                tags=_pick(TAG_MIX, _hash(i, 7) % 100), search_attributes={k: to_json(v) for k, v in carried.items()},
                input=b"\x81\xa2id\xce" + i.to_bytes(4, "big"), result=b"\x2a" if status == "completed" else None,
                error={"type": "ValueError", "message": f"seeded failure {i}"} if status == "failed" else None,
                runnable_at=(created if status == "pending" else now + timedelta(minutes=5)
                             if status == "running" else None),
                wait_reason="signal approve" if status == "waiting" else "",
                lease_owner="bench-seed-worker" if status == "running" else "",
                created_at=created, started_at=None if status == "pending" else created,
                updated_at=created + timedelta(seconds=2),
                finished_at=None if is_open else created + timedelta(seconds=2))
            batch.append(run)
            values += [SearchAttributeValue(run=run, name=name, created_at=created,
                                            **{attribute_columns[SEED_ATTRIBUTES[name]]: value})
                       for name, value in carried.items()]
            for s in range(1, steps + 1):
                last = s == steps
                journal.append(WorkflowStep(
                    run=run, seq=s, kind="activity", name=f"bench.seed.step{s}",
                    status="failed" if last and status == "failed" else "waiting"
                    if last and status == "waiting" else "completed",
                    result=b"\x2a", started_at=created + s * timedelta(milliseconds=100),
                    finished_at=None if last and status == "waiting" else created + s * timedelta(
                        milliseconds=150)))
        Workflow.objects.using(alias).bulk_create(batch)
        WorkflowStep.objects.using(alias).bulk_create(journal, batch_size=2000)
        SearchAttributeValue.objects.using(alias).bulk_create(values, batch_size=2000)
        progress(f"seeded runs {lo - first + 1}..{lo - first + len(batch)} of {runs}")


def cleanup(progress: Progress | None = None) -> dict[str, int]:
    """Delete the seeded runs, their journal (and anything else pointing at them) and the bench superuser."""
    from django.contrib.auth import get_user_model

    progress = progress or _noop
    alias = _db()
    connection = connections[alias]
    seeded = Workflow.objects.using(alias).filter(workflow_type__startswith=SEED_PREFIX)
    # The big run first, through the ORM: its attempts, timers and signals go with it.
    big = Workflow.objects.using(alias).filter(workflow_type=BIG_RUN_TYPE).delete()[1]
    if big:
        progress(f"deleted the big run: {sum(big.values())} rows")
    if connection.vendor == "postgresql":
        wf, st = Workflow._meta.db_table, WorkflowStep._meta.db_table
        sav = SearchAttributeValue._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {sav} WHERE run_id IN (SELECT run_id FROM {wf} "
                           "WHERE workflow_type LIKE %s)", [SEED_PREFIX + "%"])
            progress(f"deleted {cursor.rowcount} search attribute rows")
            cursor.execute(f"DELETE FROM {st} WHERE run_id IN (SELECT run_id FROM {wf} "
                           "WHERE workflow_type LIKE %s)", [SEED_PREFIX + "%"])
            steps = cursor.rowcount
            progress(f"deleted {steps} journal rows")
        # Runs, in chunks (the others have no attempts, timers, signals or async rows to cascade to).
        runs = 0
        while True:
            ids = list(seeded.values_list("pk", flat=True)[:50_000])
            if not ids:
                break
            runs += Workflow.objects.using(alias).filter(pk__in=ids)._raw_delete(alias)
            progress(f"deleted {runs} runs")
        with connection.cursor() as cursor:
            for table in (wf, st, sav):
                cursor.execute(f"VACUUM ANALYZE {table}")
    else:
        steps = WorkflowStep.objects.using(alias).filter(run__workflow_type__startswith=SEED_PREFIX).delete()[0]
        runs = seeded.delete()[1].get(Workflow._meta.label, 0)
    get_user_model().objects.using(alias).filter(username=SEED_ADMIN_USERNAME).delete()
    return {"runs_deleted": runs, "steps_deleted": steps}


# --- the big run: one run page with a long journal ------------------------------------------------------

BIG_RUN_ID = SEED_ID_PREFIX + "big-run"
BIG_RUN_TYPE = SEED_PREFIX + "big"
BIG_STEP = SEED_PREFIX + "big.step"
BIG_STEPS, BIG_BRANCHES = 1000, 50
BRANCH_GROUP = 10  # code branches started together, overlapping in time
BRANCH_ROWS = 3  # each code branch's rows in its block: an activity, a one-second sleep, an activity
GATHER = 8  # activities started together (ctx.start_activity + ctx.gather), overlapping in time
BIG_SIGNALS = 5  # signal waits, each consuming a signal "approve"
RETRY_EVERY = 10  # every 10th activity of the run's own took 3 attempts (2 failed, then retry backoff timers)
BIG_SIGNAL = "approve"
BIG_PAGE = "detail big run"


@activity(name=BIG_STEP)
def big_step(i: int) -> int:
    """The big run's activity (never executed by the bench: its journal is seeded; the code replays it)."""
    return i


def big_branch(ctx: Any, k: int) -> int:
    """A code branch of the big run: an activity, a one-second sleep, an activity (its block's three rows)."""
    first = ctx.run(big_step, k)
    ctx.sleep(1)
    return first + ctx.run(big_step, k + 1)


def big_plan(steps: int, branches: int) -> list[tuple[str, int]]:
    """The operations of a big run of ``steps`` journal rows (the code branches' rows included), in order, as
    (operation, count): a cycle of 12 activities, a gather of 8, a group of up to 10 code branches (while there
    are some to start), a sleep, 4 activities and a signal wait (the first 5 cycles); the last row is a signal
    wait with a timeout, still waiting. Operations that do not fit the rows left become single activities."""
    left, branches_left, signals_left = steps - 1, branches, BIG_SIGNALS
    plan: list[tuple[str, int]] = []

    def add(op: str, count: int, rows: int) -> None:
        nonlocal left
        if rows <= left:
            plan.append((op, count))
            left -= rows
        else:
            plan.extend(("activity", 1) for _ in range(left))
            left = 0

    while left > 0:
        for _ in range(12):
            add("activity", 1, 1)
        add("gather", GATHER, GATHER)
        if branches_left:
            group = min(BRANCH_GROUP, branches_left)
            before = left
            add("branches", group, group * (1 + BRANCH_ROWS))
            if left != before - group * (1 + BRANCH_ROWS):
                break
            branches_left -= group
        add("sleep", 1, 1)
        for _ in range(4):
            add("activity", 1, 1)
        if signals_left:
            add("signal", 1, 1)
            signals_left -= 1
    if steps > 0:
        plan.append(("wait", 1))
    return plan


@workflow(name=BIG_RUN_TYPE)
def big_run(ctx: Any, spec: dict) -> int:
    """The code of the big run (registered so its page's Queries panel replays its journal, as for a real run)."""
    done = {"steps": 0}
    ctx.set_query_handler("progress", lambda: dict(done))
    for i, (op, count) in enumerate(big_plan(spec["steps"], spec["branches"])):
        if op == "activity":
            ctx.run(big_step, i)
        elif op == "gather":
            ctx.gather(*[ctx.start_activity(big_step, k) for k in range(count)])
        elif op == "branches":
            ctx.gather(*[ctx.start_branch(big_branch, k) for k in range(count)])
        elif op == "sleep":
            ctx.sleep(1)
        elif op == "signal":
            ctx.wait_for_signal(BIG_SIGNAL)
        else:
            ctx.wait_for_signal(BIG_SIGNAL, timeout=timedelta(days=400))
        done["steps"] += count
    return done["steps"]


def seed_big_run(steps: int = BIG_STEPS, branches: int = BIG_BRANCHES, *, workflow_id: str = BIG_RUN_ID,
                 using: str | None = None) -> dict[str, Any]:
    """One waiting run of ``steps`` journal rows (``bulk_create``; any earlier run of ``workflow_id`` is deleted
    first), as the engine writes them: activities in sequence, gathers of ``GATHER`` activities started together,
    ``branches`` code branches in groups of ``BRANCH_GROUP`` started together (each a row at its start position and
    ``BRANCH_ROWS`` rows at ``branch_block(start) + 1..``), sleeps with their fired timers, every ``RETRY_EVERY``th
    activity of its own retried twice (its ``StepAttempt`` rows and retry backoff timers), signal waits with the
    signals they consumed, one more signal buffered, and a last signal wait pending with its timeout timer. Returns
    the run's id and its row counts."""
    alias = using or _db()
    Workflow.objects.using(alias).filter(workflow_id=workflow_id, workflow_type=BIG_RUN_TYPE).delete()
    plan = big_plan(steps, branches)
    now = clock.now()
    at = now - timedelta(hours=1)  # the run started an hour ago; it has waited since its last step
    ms = timedelta(milliseconds=1)
    run = Workflow(workflow_id=workflow_id, workflow_type=BIG_RUN_TYPE, status=RunStatus.WAITING,
                   input=encode({"steps": steps, "branches": branches}), created_at=at, started_at=at,
                   awaiting_signals=[BIG_SIGNAL])
    journal: list[WorkflowStep] = []
    attempts: list[StepAttempt] = []
    timers: list[Timer] = []
    signals: list[Signal] = []
    executor = "bench-seed-worker"

    def step(seq: int, start: datetime, end: datetime | None, *, kind: str = StepKind.ACTIVITY,
             name: str = BIG_STEP, value: Any = None, attempt: int = 1) -> None:
        journal.append(WorkflowStep(run=run, seq=seq, kind=kind, name=name, attempt=attempt,
                                    status=StepStatus.COMPLETED if end else StepStatus.WAITING,
                                    result=None if value is None else encode(value), started_at=start,
                                    finished_at=end))

    seq, activities = 0, 0
    for i, (op, count) in enumerate(plan):
        if op == "activity":
            seq += 1
            activities += 1
            if activities % RETRY_EVERY == 0:  # two failed attempts, a backoff of 1 s then 2 s, then success
                starts = [at, at + 1050 * ms, at + 3100 * ms]
                for n, start in enumerate(starts, start=1):
                    failed = n < len(starts)
                    attempts.append(StepAttempt(
                        run=run, seq=seq, attempt=n, executor=executor, started_at=start, finished_at=start + 40 * ms,
                        outcome=AttemptOutcome.FAILED if failed else AttemptOutcome.COMPLETED,
                        error={"type": "ConnectionError", "message": "seeded flaky upstream", "attempt": n}
                        if failed else None))
                    if failed:
                        timers.append(Timer(run=run, seq=seq, purpose=TimerPurpose.RETRY_BACKOFF,
                                            fire_at=starts[n], fired_at=starts[n]))
                step(seq, at, starts[-1] + 40 * ms, value=i, attempt=len(starts))
                at = starts[-1] + 50 * ms
            else:
                step(seq, at, at + 40 * ms, value=i)
                at += 50 * ms
        elif op == "gather":
            for k in range(count):
                seq += 1
                step(seq, at + k * ms, at + (200 + 50 * k) * ms, value=k)
            at += (210 + 50 * count) * ms
        elif op == "branches":
            longest = at
            for k in range(count):
                seq += 1
                start = at + k * ms
                block = branch_block(seq)
                step(block + 1, start, start + 30 * ms, value=k)
                step(block + 2, start + 30 * ms, start + 1030 * ms, kind=StepKind.SLEEP, name="sleep")
                timers.append(Timer(run=run, seq=block + 2, purpose=TimerPurpose.SLEEP, fire_at=start + 1030 * ms,
                                    fired_at=start + 1030 * ms))
                end = start + (1060 + 20 * k) * ms
                step(block + 3, start + 1030 * ms, end, value=k + 1)
                step(seq, start, end, kind=StepKind.BRANCH, name=big_branch.__qualname__, value=2 * k + 1)
                longest = max(longest, end)
            at = longest + 10 * ms
        elif op == "sleep":
            seq += 1
            step(seq, at, at + 1000 * ms, kind=StepKind.SLEEP, name="sleep")
            timers.append(Timer(run=run, seq=seq, purpose=TimerPurpose.SLEEP, fire_at=at + 1000 * ms,
                                fired_at=at + 1000 * ms))
            at += 1010 * ms
        elif op == "signal":
            seq += 1
            payload = {"approved_by": f"operator-{len(signals) + 1}"}
            signals.append(Signal(run=run, name=BIG_SIGNAL, payload=encode(payload), sequence=len(signals) + 1,
                                  received_at=at + 2000 * ms, consumed_at=at + 2000 * ms, consumed_by_seq=seq))
            step(seq, at, at + 2000 * ms, kind=StepKind.SIGNAL, name=BIG_SIGNAL, value=payload)
            at += 2010 * ms
        else:  # the last: a signal wait with a timeout, still waiting
            seq += 1
            step(seq, at, None, kind=StepKind.SIGNAL, name=BIG_SIGNAL)
            deadline = at + timedelta(days=400)
            timers.append(Timer(run=run, seq=seq, purpose=TimerPurpose.WAIT_TIMEOUT, fire_at=deadline))
            run.runnable_at, run.wait_reason = deadline, f"waiting for signal {BIG_SIGNAL} until {deadline.isoformat()}"
    # A signal nobody waits for yet: buffered, unconsumed.
    signals.append(Signal(run=run, name="note", payload=encode({"text": "seeded"}), sequence=len(signals) + 1,
                          received_at=at))
    run.updated_at, run.inbox_seq, run.fence = at, len(signals), len(plan)
    Workflow.objects.using(alias).bulk_create([run])
    WorkflowStep.objects.using(alias).bulk_create(journal, batch_size=500)
    StepAttempt.objects.using(alias).bulk_create(attempts, batch_size=500)
    Timer.objects.using(alias).bulk_create(timers, batch_size=500)
    Signal.objects.using(alias).bulk_create(signals, batch_size=500)
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:  # the small tables' statistics: one run's rows are most of them
            for model in (StepAttempt, Timer, Signal):
                cursor.execute(f"ANALYZE {model._meta.db_table}")
    return {"run_id": str(run.pk), "workflow_id": workflow_id, "steps": len(journal),
            "branch_rows": sum(row.seq >= BRANCH_BASE for row in journal),
            "code_branches": sum(row.kind == StepKind.BRANCH for row in journal),
            "attempts": len(attempts), "timers": len(timers), "signals": len(signals)}


# --- timing the admin ---------------------------------------------------------------------------------

_BOUNDED_COUNT = re.compile(r"COUNT\(.*LIMIT", re.IGNORECASE | re.DOTALL)


def _unbounded_counts(queries: list[dict]) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and not _BOUNDED_COUNT.search(q["sql"])]


def admin_pages() -> dict[str, str]:
    """The pages to time: name -> URL (on the seeded data)."""
    from django.urls import reverse

    alias = _db()
    changelist = reverse("admin:django_weft_workflow_changelist")
    seeded = Workflow.objects.using(alias).filter(workflow_type__startswith=SEED_PREFIX)
    total = seeded.exclude(workflow_id=BIG_RUN_ID).count()
    # A run in the middle of the history (not in any cache of the newest rows).
    middle = seeded.filter(workflow_id=f"{SEED_ID_PREFIX}{total // 2 + 1}").only("pk", "workflow_id").first()
    if middle is None:
        middle = seeded.only("pk", "workflow_id").order_by("created_at").first()
    if middle is None:
        raise ValueError("no seeded runs: run the seed first")
    big = seeded.filter(workflow_id=BIG_RUN_ID, workflow_type=BIG_RUN_TYPE).only("pk").first()
    now = clock.now()
    # Aware moments, as the admin's own date filter links them (a bare date would be a naive datetime).
    week = _moment(now - timedelta(days=7)), _moment(now + timedelta(days=1))
    old = _moment(now - timedelta(days=200)), _moment(now - timedelta(days=170))
    return {
        "changelist": changelist,
        "changelist_page_20": f"{changelist}?p=20",
        "status=failed": f"{changelist}?status__exact=failed",
        "status=suspended": f"{changelist}?status__exact=suspended",
        "type=audit (1%)": f"{changelist}?workflow_type={SEED_PREFIX}audit",
        "type=order+status=failed": f"{changelist}?workflow_type={SEED_PREFIX}order&status__exact=failed",
        "created past 7 days": f"{changelist}?created_at__gte={week[0]}&created_at__lt={week[1]}",
        "created 200..170 days ago": f"{changelist}?created_at__gte={old[0]}&created_at__lt={old[1]}",
        "search workflow id": f"{changelist}?q={middle.workflow_id}",
        "search run id": f"{changelist}?q={middle.pk}",
        "detail": reverse("admin:django_weft_workflow_change", args=[middle.pk]),
        **({BIG_PAGE: reverse("admin:django_weft_workflow_change", args=[big.pk])} if big is not None else {}),
    }


def time_admin_pages(repetitions: int = DEFAULT_REPETITIONS, pages: dict[str, str] | None = None,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Server time of the run admin pages, in this process, with DEBUG off; JSON-safe."""
    from django.contrib.auth import get_user_model
    from django.test import Client, override_settings

    progress = progress or _noop
    alias = _db()
    connection = connections[alias]
    user_model = get_user_model()
    user = user_model.objects.using(alias).filter(username=SEED_ADMIN_USERNAME).first()
    if user is None:
        user = user_model.objects.db_manager(alias).create_superuser(SEED_ADMIN_USERNAME, "", None)
    pages = pages or admin_pages()
    results: dict[str, Any] = {}
    with override_settings(DEBUG=False, ALLOWED_HOSTS=["testserver"]):
        client = Client()
        client.force_login(user)
        for name, url in pages.items():
            client.get(url)  # warm up: templates, the buffer cache
            # Each request starts with reset_queries(), so capture from an empty log.
            reset_queries()
            with CaptureQueriesContext(connection) as captured:
                response = client.get(url)
            queries = list(captured.captured_queries)  # before the next request resets the log
            if response.status_code != 200:
                raise RuntimeError(f"{name}: {url} answered {response.status_code}")
            times = []
            for _ in range(repetitions):
                t0 = time.perf_counter()
                client.get(url)
                times.append((time.perf_counter() - t0) * 1000)
            slowest = max(queries, key=lambda q: float(q["time"]))
            results[name] = {
                "url": url,
                "p50_ms": round(statistics.median(times), 1),
                "p95_ms": round(_percentile(times, 95), 1),
                "max_ms": round(max(times), 1),
                "bytes": len(response.content),
                "queries": len(queries),
                "sql_ms": round(sum(float(q["time"]) for q in queries) * 1000, 1),
                "slowest_sql_ms": round(float(slowest["time"]) * 1000, 1),
                "slowest_sql": slowest["sql"][:300],
                "unbounded_counts": _unbounded_counts(queries),
            }
            progress(f"{name}: p50 {results[name]['p50_ms']} ms, p95 {results[name]['p95_ms']} ms, "
                     f"max {results[name]['max_ms']} ms, {len(queries)} queries")
    return results


def _percentile(values: list[float], pct: float) -> float:
    """Linear-interpolated percentile (0 <= pct <= 100) of a non-empty list."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _moment(moment: datetime) -> str:
    """Midnight of ``moment``'s day, UTC, as a query-string value."""
    return quote(moment.replace(hour=0, minute=0, second=0, microsecond=0).isoformat())
