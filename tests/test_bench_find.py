"""weft_bench --find at tiny sizes, on SQLite and PostgreSQL: the seeded attributes, the table and plans it prints,
the runs it keeps (or drops) and its checks. Timings are never asserted, only that they are there."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

import django_weft as weft
from bench import find_bench, seed
from django_weft.models import RunStatus, SearchAttributeValue, Workflow, WorkflowStep
from tests.procs import executor_row

FAST = ["--repeat", "2", "--probe-seconds", "0.05"]
COLUMNS = {"int": "int_value", "keyword": "keyword_value", "decimal": "decimal_value", "datetime": "datetime_value",
           "bool": "bool_value"}


def bench(*args: str) -> tuple[dict, list[str]]:
    out = StringIO()
    call_command("weft_bench", "--find", *args, stdout=out, stderr=StringIO())
    lines = out.getvalue().strip().splitlines()
    return json.loads(lines[-1]), lines[:-1]


def rows_of(run: Workflow) -> dict[str, object]:
    return {row.name: getattr(row, COLUMNS[seed.SEED_ATTRIBUTES[row.name]])
            for row in SearchAttributeValue.objects.filter(run=run)}


@pytest.mark.django_db(transaction=True)
def test_find_bench_seeds_times_every_query_prints_its_plan_and_keeps_the_runs():
    figures, lines = bench("--seed-runs", "400", "--seed-steps", "1", *FAST)

    assert figures["mode"] == "find" and figures["vendor"] == connection.vendor
    assert figures["raw_commits_per_second"] > 0 and figures["probe_commits"] > 0
    assert figures["seed"]["runs"] == 400 and figures["seed"]["attributes"] is True
    assert figures["seeded_runs"] == figures["runs"] == 400 and figures["cleanup"] is None
    assert figures["attribute_rows"] == SearchAttributeValue.objects.count() > 400
    names = [name for name, _, _ in find_bench.queries(find_bench.query_values("default"))]
    rows = figures["queries"]
    assert [row["name"] for row in rows] == names and len(names) == len(set(names))
    kinds = {row["kind"] for row in rows}
    assert kinds == {"page", "count"}
    for row in rows:
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"] and row["first_ms"] > 0, row
        assert row["plan"] and row["under_target"] == (row["max_ms"] < find_bench.TARGET_MS)
        assert row["rows"] <= (find_bench.PAGE if row["kind"] == "page" else 8)
        if connection.vendor == "postgresql":
            assert row["scans"] and row["execution_ms"] is not None, row
    # Pages and counts find what is there (the large customers hold runs at any size).
    by_name = {row["name"]: row for row in rows}
    assert by_name["count by status"]["rows"] > 1 and by_name["count by region"]["rows"] == len(seed.REGION_MIX)
    assert by_name["customer_id = x (~8 runs)"]["rows"] > 0 and by_name["region = eu-west (30%)"]["rows"] == 50
    assert figures["over_target"] == [row["name"] for row in rows if not row["under_target"]]

    # Kept: the runs, their journal and their attribute rows.
    assert Workflow.objects.count() == 400 and WorkflowStep.objects.count() == 400

    assert lines[0].startswith("weft_bench --find: ") and " raw commits " in lines[0]
    assert lines[1].startswith("400 runs (400 seeded), ") and "seeded 400 in " in lines[1]
    header = next(i for i, line in enumerate(lines) if line.startswith("query "))
    table = lines[header + 1:header + 1 + len(rows)]
    assert [line[:34].rstrip() for line in table] == names
    assert all(re.search(r"\s\d+(\s+[\d.]+){4}", line) for line in table), table
    assert lines[header + 1 + len(rows) + 1].startswith(f"over {find_bench.TARGET_MS} ms: ")
    explained = [re.match(r"EXPLAIN (.*) \((page|count), \{.*\}\):$", line) for line in lines
                 if line.startswith("EXPLAIN ")]
    assert [match.group(1) for match in explained if match] == names
    if connection.vendor == "postgresql":
        assert sum(line.strip().startswith("Execution Time:") for line in lines) == len(rows)


@pytest.mark.django_db(transaction=True)
def test_find_bench_times_the_runs_seeded_before_and_drops_them_when_asked():
    seed.seed(120, 0, attributes=True)
    figures, _ = bench(*FAST, "--drop-seeded")
    assert figures["seed"] is None and figures["seeded_runs"] == 120
    assert figures["cleanup"]["runs_deleted"] == 120
    assert not Workflow.objects.exists() and not SearchAttributeValue.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_find_bench_refuses_without_seeded_runs_or_without_their_attributes():
    with pytest.raises(CommandError, match=r"no seeded runs on this database: seed them with weft_bench --find "
                                           r"--seed-runs N"):
        bench(*FAST)
    seed.seed(50, 0)  # the admin bench's seed: no attributes
    with pytest.raises(CommandError, match="the seeded runs carry no search attributes"):
        bench(*FAST)
    assert Workflow.objects.count() == 50  # kept, as --find keeps them
    seed.cleanup()


@pytest.mark.django_db
def test_find_bench_refuses_to_run_beside_a_live_executor():
    executor_row(alive=True)
    with pytest.raises(CommandError, match="refusing to run beside live executors"):
        bench("--seed-runs", "10", *FAST)
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("args, message", [
    (["--workflows", "2"], "--find goes alone"),
    (["--schedules", "2"], "--find goes alone"),
    (["--query-latency", "10"], "--find goes alone"),
    (["--continue-as-new"], "--find goes alone"),
    (["--parallel", "2"], "--find goes alone"),
    (["--keep", "--drop-seeded"], "pass --keep or --drop-seeded, not both"),
    (["--seed-runs", "0"], "--seed-runs must be at least 1"),
    (["--seed-runs", "5", "--seed-steps", "-1"], "--seed-steps 0 or more"),
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--probe-seconds", "0"], "--probe-seconds must be positive"),
])
def test_find_bench_rejects_bad_arguments(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        bench(*args)


def test_drop_seeded_goes_with_find():
    with pytest.raises(CommandError, match="--drop-seeded goes with --find"):
        call_command("weft_bench", "--drop-seeded", "--workflows", "2", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db(transaction=True)
def test_seeded_attributes_agree_with_the_run_rows_and_follow_the_mix():
    seed.seed(1000, 0, attributes=True)
    runs = list(Workflow.objects.filter(workflow_type__startswith=seed.SEED_PREFIX))
    assert len(runs) == 1000
    vip = customers = 0
    for run in runs[::10]:
        rows = rows_of(run)
        assert set(rows) == set(run.search_attributes), run.workflow_id
        with override_settings(WEFT_SEARCH_ATTRIBUTES=seed.SEED_ATTRIBUTES):
            assert weft.list_runs(workflow_id_prefix=run.workflow_id, attributes={"region": rows["region"]}).exists()
        assert rows["region"] in dict((v, b) for b, v in seed.REGION_MIX)
        assert run.search_attributes["region"] == rows["region"] and run.search_attributes["vip"] == rows["vip"]
        if "customer_id" in rows:
            customers += 1
            assert 1 <= rows["customer_id"] <= seed.LARGE_CUSTOMERS + seed.CUSTOMERS
            assert run.search_attributes["customer_id"] == rows["customer_id"]
        assert ("amount" in rows) == ("due" in rows)
        if "amount" in rows:
            assert run.workflow_type in (seed.SEED_PREFIX + "order", seed.SEED_PREFIX + "payment")
            assert Decimal("1") <= rows["amount"] <= Decimal(seed.MAX_AMOUNT)
            assert Decimal(run.search_attributes["amount"]) == rows["amount"]
            assert timedelta(days=1) <= rows["due"] - run.created_at < timedelta(days=32)
        vip += rows["vip"]
    assert 70 <= customers <= 90 and vip <= 20  # 80% of the runs have a customer, 5% are vip
    for run in runs:
        assert run.tags in [tags for _, tags in seed.TAG_MIX]
        assert run.version in (1, 2)
        if run.status == RunStatus.FAILED:
            assert run.failure_category in dict((v, b) for b, v in seed.FAILURE_MIX)
        elif run.status in (RunStatus.CANCELLED, RunStatus.TIMED_OUT):
            assert run.failure_category == ("cancellation" if run.status == RunStatus.CANCELLED else "timeout")
        else:
            assert run.failure_category == ""
    assert {run.failure_category for run in runs if run.status == RunStatus.FAILED} >= {"application"}
    assert sum(bool(run.tags) for run in runs) > 300
    cleaned = seed.cleanup()
    assert cleaned["runs_deleted"] == 1000 and not SearchAttributeValue.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_admin_seed_mode_still_seeds_times_and_deletes():
    out = StringIO()
    call_command("weft_bench", "--seed-runs", "30", "--seed-steps", "2", stdout=out, stderr=StringIO())
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    assert report["seed"]["runs"] == 30 and report["seed"]["attributes"] is False
    assert report["admin"]["changelist"]["queries"] > 0
    assert report["cleanup"] == {"runs_deleted": 30, "steps_deleted": 60}
    assert not Workflow.objects.exists()


def test_a_postgresql_plan_is_summed_up_as_its_scans_and_times():
    plan = [
        "Limit  (cost=0.85..36.20 rows=50 width=917) (actual time=0.050..0.300 rows=50 loops=1)",
        "  ->  Nested Loop  (cost=0.85..1000.00 rows=2000 width=917) (actual time=0.049..0.290 rows=50 loops=1)",
        "        ->  Index Scan using weft_attr_keyword_idx on django_weft_searchattributevalue  (cost=0.43..90.00 "
        "rows=2000 width=24) (actual time=0.020..0.100 rows=51 loops=1)",
        "        ->  Index Scan using django_weft_workflow_pkey on django_weft_workflow  (cost=0.42..0.45 rows=1 "
        "width=917) (actual time=0.003..0.003 rows=1 loops=51)",
        "        ->  Parallel Seq Scan on django_weft_workflow  (cost=0.00..44874.38 rows=416738 width=25) "
        "(actual time=0.027..453.988 rows=333333 loops=3)",
        "Planning Time: 0.2 ms",
        "  Timing: Generation 1.081 ms, Inlining 0.000 ms, Optimization 20.952 ms, Emission 51.151 ms, Total 73.183 ms",
        "Execution Time: 0.400 ms",
    ]
    assert find_bench.summarize(plan) == {
        "scans": ["Index Scan weft_attr_keyword_idx 51", "Index Scan django_weft_workflow_pkey 51 (51 loops)",
                  "Parallel Seq Scan workflow 999999 (3 loops)"],
        "execution_ms": 0.4, "jit_ms": 73.183}
    assert find_bench.summarize(["2 | 0 | 0 | SCAN django_weft_workflow"]) == {
        "scans": [], "execution_ms": None, "jit_ms": None}
