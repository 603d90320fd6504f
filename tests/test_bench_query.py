"""weft_bench --query-latency at tiny sizes: its table's structure, its checks and the runs it leaves with --keep
(figures are never asserted, only that they are there)."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from bench import query_bench
from bench.query_bench import QUERY_WORKFLOW, STOP_SIGNAL, parse_lengths
from django_weft.common.codec import decode, encode
from django_weft.models import RunStatus, StepKind, StepStatus, Workflow, WorkflowStep
from django_weft.services import client, queries
from django_weft.services.maintenance import run_maintenance
from tests.bench_helpers import bench
from tests.procs import executor_row

FAST = ["--repeat", "3", "--probe-seconds", "0.05"]
ROW = re.compile(r"^\s*[\d,]+\s+[\d,]+(\s+[\d.]+){10}$")
FIGURES = ("first_ms", "p50_ms", "p95_ms", "max_ms", "ms_per_1000_steps", "replaying_p50_ms", "fetch_p50_ms",
           "replay_p50_ms", "statements_per_query")


@pytest.mark.django_db(transaction=True)
def test_query_latency_bench_times_each_length_and_deletes_its_runs():
    figures, lines = bench("--query-latency", "7,3", *FAST)

    assert figures["mode"] == "query_latency" and figures["queries_per_length"] == 3
    assert figures["raw_commits_per_second"] > 0 and figures["probe_commits"] > 0
    rows = figures["lengths"]
    # Shortest first; N steps and the signal wait in the journal.
    assert [row["steps"] for row in rows] == [3, 7] and [row["journal_rows"] for row in rows] == [4, 8]
    for row in rows:
        assert row["queries"] == 3 and row["drive_seconds"] > 0
        for key in FIGURES:
            assert row[key] > 0, (key, row)
        assert row["p50_ms"] <= row["p95_ms"] <= row["max_ms"]
    # Steps alternate an activity returning i (0, 2, 4, 6 summed) and ctx.now().
    assert [(row["answer"]["steps"], row["answer"]["total"]) for row in rows] == [(3, 0 + 2), (7, 0 + 2 + 4 + 6)]
    assert all(row["answer"]["last_at"] for row in rows)
    # A query sends as many statements however long the history.
    assert rows[0]["statements_per_query"] == rows[1]["statements_per_query"]
    assert figures["marginal_ms_per_1000_steps"] is not None and figures["runs"] == 2
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists()

    assert lines[0].startswith("weft_bench --query-latency: ") and " raw commits " in lines[0]
    table = [line for line in lines if ROW.match(line)]
    assert [line.split()[:2] for line in table] == [["3", "4"], ["7", "8"]], lines
    assert lines[-1].startswith("marginal cost: ") and lines[-1].endswith("(p50 from 3 to 7 steps)")


@pytest.mark.django_db(transaction=True)
def test_query_latency_bench_keeps_runs_the_engine_finishes_with_keep():
    figures, lines = bench("--query-latency", "5", *FAST, "--keep")
    assert figures["marginal_ms_per_1000_steps"] is None and not lines[-1].startswith("marginal")

    run = Workflow.objects.get(workflow_type=QUERY_WORKFLOW)
    assert run.status == RunStatus.WAITING
    journal = list(WorkflowStep.objects.filter(run=run).order_by("seq"))
    assert [step.kind for step in journal] == [StepKind.ACTIVITY, StepKind.NOW] * 2 + [StepKind.ACTIVITY,
                                                                                       StepKind.SIGNAL]
    assert journal[-1].name == STOP_SIGNAL and journal[-1].status == StepStatus.WAITING
    handle = client.get_handle(run.workflow_id, run.run_id)
    assert handle.query("state") == figures["lengths"][0]["answer"]
    # Signalled, it finishes from its journal with the state its queries answered.
    handle.signal(STOP_SIGNAL)
    run_maintenance()
    assert handle.result(timeout=1) == figures["lengths"][0]["answer"]
    assert WorkflowStep.objects.filter(run=run, kind=StepKind.ACTIVITY).count() == 3


@pytest.mark.django_db(transaction=True)
def test_query_latency_bench_fails_loudly_on_a_wrong_answer(monkeypatch):
    original = query_bench.expected_state
    monkeypatch.setattr(query_bench, "expected_state", lambda steps, journal: {**original(steps, journal), "total": -1})
    with pytest.raises(CommandError, match=r"weft_bench: run \S+ of 4 step\(s\): query 'state' answered "
                                           r"\{.*'total': 2, "):
        bench("--query-latency", "4", *FAST)
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_query_latency_bench_fails_loudly_on_a_query_that_writes(monkeypatch):
    original = queries.query

    def writing(run, name, args):  # a query that touches the run
        Workflow.objects.filter(pk=run.pk).update(updated_at=timezone.now() + timedelta(seconds=1))
        return original(run, name, args)

    monkeypatch.setattr(queries, "query", writing)
    with pytest.raises(CommandError, match=r"of 2 step\(s\): the queries changed the run"):
        bench("--query-latency", "2", *FAST)
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_query_latency_bench_refuses_to_run_inside_a_transaction():
    with pytest.raises(CommandError, match="inside a transaction"):
        bench("--query-latency", "2", *FAST)
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_query_latency_bench_refuses_to_run_beside_a_live_executor():
    executor_row(alive=True)
    with pytest.raises(CommandError, match="refusing to run beside live executors"):
        bench("--query-latency", "2", *FAST)
    assert not Workflow.objects.exists()


def test_query_latency_defaults_to_10_1000_10000_steps_and_20_queries(monkeypatch):
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return {"lengths": []}

    monkeypatch.setattr(query_bench, "run_query_bench", fake)
    monkeypatch.setattr(query_bench, "format_table", lambda figures: [])
    monkeypatch.setattr("bench.safety.live_executor_refusal", lambda: None)
    call_command("weft_bench", "--query-latency", stdout=StringIO(), stderr=StringIO())
    assert seen["lengths"] == [10, 1000, 10_000] and seen["repeat"] == 20 and seen["keep"] is False


@pytest.mark.parametrize("args, message", [
    (["--query-latency", "0"], "--query-latency takes history lengths (steps) of at least 1"),
    (["--query-latency", "10,x"], "--query-latency takes history lengths"),
    (["--query-latency", "10,20000"], "--query-latency 20000: the run's journal (its steps and the signal wait) "
                                      "would pass WEFT_MAX_HISTORY (20000)"),
    (["--query-latency", "10", "--repeat", "0"], "--repeat must be at least 1"),
    (["--query-latency", "10", "--probe-seconds", "0"], "--probe-seconds must be positive"),
    (["--query-latency", "10", "--workflows", "2"], "--query-latency goes alone"),
    (["--query-latency", "10", "--replay-check", "2"], "--query-latency goes alone"),
    (["--query-latency", "10", "--continue-as-new"], "--query-latency goes alone"),
    (["--query-latency", "10", "--window", "3"], "--query-latency goes alone"),
    (["--query-latency", "10", "--sleep-seconds", "1"], "--query-latency goes alone"),
    (["--workflows", "2", "--repeat", "2"], "--repeat also with --query-latency"),
])
def test_query_latency_bench_rejects_bad_arguments(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("weft_bench", *args, stdout=StringIO(), stderr=StringIO())


def test_lengths_parse_shortest_first_without_repeats():
    assert parse_lengths("10,1000,10000") == [10, 1000, 10_000]
    assert parse_lengths(" 10_000 , 10, 10 ") == [10, 10_000]
    assert parse_lengths("19999") == [19_999]
    for bad in ("", "0", "-1", "1.5", "10;20", "20000"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


def test_the_answer_is_computed_from_the_recorded_times():
    moment = timezone.now()
    journal = [WorkflowStep(seq=2, kind=StepKind.NOW, result=encode(moment)),
               WorkflowStep(seq=1, kind=StepKind.ACTIVITY)]
    assert query_bench.expected_state(2, journal) == {"steps": 2, "total": 0, "last_at": moment.isoformat()}
    assert query_bench.expected_state(1, journal[1:]) == {"steps": 1, "total": 0, "last_at": None}
    assert decode(journal[0].result) == moment
