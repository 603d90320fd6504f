"""weft_bench --parallel at a tiny size: its table's structure and its runs' results (figures are never asserted)."""

from __future__ import annotations

import json
import re
from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings

from bench.parallel import (
    NOOP_REPEAT_FACTOR,
    PARALLEL_WORKFLOW,
    SLEEP_ACTIVITY,
    max_overlap,
    parse_branch_counts,
)
from django_weft.common.codec import decode
from django_weft.models import RunStatus, StepKind, StepStatus, Workflow, WorkflowStep
from django_weft.testing import ActivityMock
from tests.procs import executor_row


def run_parallel_bench(*args: str) -> tuple[dict, list[str]]:
    out = StringIO()
    call_command("weft_bench", "--parallel", *args, stdout=out, stderr=StringIO())
    lines = out.getvalue().strip().splitlines()
    return json.loads(lines[-1]), lines[:-1]


def table_rows(lines: list[str], k: int, limit: str) -> list[str]:
    return [line for line in lines if re.match(rf"^\s*{k}\s+{re.escape(limit)}\s", line)]


@pytest.mark.django_db(transaction=True)
def test_parallel_bench_reports_each_k_beside_its_sequential_form_and_at_the_configured_limit():
    with override_settings(WEFT_MAX_PARALLEL_ACTIVITIES=2):
        figures, lines = run_parallel_bench("1,3", "--sleep-seconds", "0.01", "--repeat", "1")

    assert figures["mode"] == "parallel" and figures["configured_max_parallel_activities"] == 2
    # K=3 is above the configured limit 2: measured at 3 and again at 2.
    assert [(row["branches"], row["limit"], row["at_configured_limit"]) for row in figures["rows"]] == [
        (1, 2, True), (3, 3, False), (3, 2, True),
    ]
    assert [row["ideal_seconds"] for row in figures["rows"]] == [0.01, 0.01, 0.02]
    for row in figures["rows"]:
        assert row["sequential"]["max_concurrent"] == 1
        for form in ("gather", "async_gather", "noop_gather"):
            assert 1 <= row[form]["max_concurrent"] <= row["limit"], (form, row)
        for key in ("sequential", "gather", "async_gather", "noop_sequential", "noop_gather"):
            assert row[key]["seconds"] > 0, (key, row)
    # A warm-up and the empty runs; per K the two sequential forms, per limit the three gathers (no-op ones
    # and empty ones noop_repeat times).
    n = figures["noop_repeat"]
    assert figures["repeat"] == 1 and n == NOOP_REPEAT_FACTOR
    assert figures["runs"] == 1 + n + (1 + n + (2 + n)) + (1 + n + 2 * (2 + n))
    assert not Workflow.objects.exists()  # deleted afterwards

    assert "WEFT_MAX_PARALLEL_ACTIVITIES: configured 2" in lines[1]
    assert any(line.startswith("an empty run (no activity): ") for line in lines)
    # Each (K, limit) has a row in the sleeping table and one in the no-op table; * marks the configured
    # limit below K.
    for k, limit in ((1, "2"), (3, "3"), (3, "2*")):
        assert len(table_rows(lines, k, limit)) == 2, (k, limit, lines)
    assert len([line for line in lines if re.match(r"^\s*\d+\s+\d+\*?\s", line)]) == 6


@pytest.mark.django_db(transaction=True)
def test_parallel_bench_runs_complete_with_one_result_per_activity_through_the_attempt_pool():
    figures, lines = run_parallel_bench("2", "--sleep-seconds", "0.01", "--repeat", "1", "--keep")

    assert [(row["branches"], row["limit"]) for row in figures["rows"]] == [(2, 8)]
    assert len(table_rows(lines, 2, "8")) == 2
    runs = list(Workflow.objects.filter(workflow_type=PARALLEL_WORKFLOW))
    n = figures["noop_repeat"]
    assert len(runs) == figures["runs"] == 1 + n + (1 + n) + (2 + n)
    specs = Counter()
    for run in runs:
        assert run.status == RunStatus.COMPLETED, (run.pk, run.error)
        spec, result = decode(run.input), decode(run.result)
        specs[spec["form"], spec["branches"], spec["async"], spec["seconds"]] += 1
        assert [entry[0] for entry in result] == list(range(spec["branches"]))
        assert WorkflowStep.objects.filter(run=run, kind=StepKind.ACTIVITY,
                                           status=StepStatus.COMPLETED).count() == spec["branches"]
    assert specs == {
        ("empty", 0, False, 0): 1 + n,  # with the warm-up
        ("sequential", 2, False, 0.01): 1, ("sequential", 2, False, 0): n,
        ("gather", 2, False, 0.01): 1, ("gather", 2, True, 0.01): 1, ("gather", 2, False, 0): n,
    }


@pytest.mark.django_db(transaction=True)
def test_parallel_bench_fails_on_a_wrong_result_and_still_deletes_its_runs():
    with ActivityMock(SLEEP_ACTIVITY, return_value=[0, 0.0, 0.0, 0]), \
            pytest.raises(CommandError, match=r"K=2\) returned .*not one result per activity 0\.\.1"):
        run_parallel_bench("2", "--sleep-seconds", "0.01", "--repeat", "1")
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_parallel_bench_refuses_to_run_inside_a_transaction():
    # The test database wraps this test in a transaction: every attempt would run inline.
    with pytest.raises(CommandError, match="inside a transaction"):
        run_parallel_bench("2", "--repeat", "1")
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_parallel_bench_refuses_to_run_beside_a_live_executor():
    executor_row(alive=True)
    with pytest.raises(CommandError, match="refusing to run beside live executors"):
        run_parallel_bench("2", "--repeat", "1")
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("args, message", [
    (["--parallel", "0"], "branch counts from 1 to 1000"),
    (["--parallel", "1,x"], "branch counts from 1 to 1000"),
    (["--parallel", ""], "branch counts from 1 to 1000"),
    (["--parallel", "2", "--workflows", "3"], "--parallel goes alone"),
    (["--parallel", "2", "--latency", "3"], "--parallel goes alone"),
    (["--parallel", "2", "--sleep-seconds", "0"], "--sleep-seconds must be positive"),
    (["--parallel", "2", "--repeat", "0"], "--repeat must be at least 1"),
    (["--workflows", "2", "--repeat", "2"], "go with --parallel"),
])
def test_parallel_bench_rejects_bad_arguments(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("weft_bench", *args, stdout=StringIO(), stderr=StringIO())


def test_branch_counts_and_overlaps():
    assert parse_branch_counts("1,8,32") == [1, 8, 32]
    assert parse_branch_counts(" 8 ") == [8]
    assert parse_branch_counts("8,8,1") == [8, 1]
    with pytest.raises(ValueError):
        parse_branch_counts("1001")
    assert max_overlap([]) == 0
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # one ending as the next begins
    assert max_overlap([(0, 3), (1, 2), (1.5, 4), (3.5, 5)]) == 3
