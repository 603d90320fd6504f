"""A run's admin page costs a bounded number of queries: the same for a run of 10 steps as for one of 300 with
branches of code, retried steps (their attempt history), signals and timers, and no more past the inlines' row cap.
The runs are those ``weft_bench --seed-runs`` times (bench.seed.seed_big_run); timings are the bench's, never
asserted here."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from bench import seed
from django_weft.admin.common import MAX_INLINE_ROWS
from django_weft.common.positions import BRANCH_BASE, position_label
from django_weft.models import RunAction, Signal, StepAttempt, Timer, Workflow, WorkflowStep

pytestmark = pytest.mark.django_db


def page_queries(client, run_id: str) -> tuple[list[str], str]:
    """The statements one view of the run's page sends (after a first view), and the page."""
    url = reverse("admin:django_weft_workflow_change", args=[run_id])
    assert client.get(url).status_code == 200
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return [query["sql"] for query in captured.captured_queries], response.content.decode()


def test_a_run_page_costs_the_same_queries_for_10_steps_and_for_300_with_branches_attempts_signals_timers(
        weft_env, staff_client):
    small = seed.seed_big_run(10, 0, workflow_id="page-cost-10")
    large = seed.seed_big_run(300, 15, workflow_id="page-cost-300")
    # What the large run holds that the small one does not.
    assert small == {**small, "steps": 10, "branch_rows": 0, "code_branches": 0, "attempts": 0}
    assert large["steps"] == WorkflowStep.objects.filter(run_id=large["run_id"]).count() == 300
    assert WorkflowStep.objects.filter(run_id=large["run_id"], seq__gt=BRANCH_BASE).count() == large["branch_rows"] > 0
    assert large["code_branches"] == 15
    assert StepAttempt.objects.filter(run_id=large["run_id"]).count() == large["attempts"] > 0
    assert Timer.objects.filter(run_id=large["run_id"]).count() == large["timers"] > small["timers"]
    assert Signal.objects.filter(run_id=large["run_id"]).count() == large["signals"] > small["signals"]

    small_queries, _ = page_queries(staff_client, small["run_id"])
    large_queries, body = page_queries(staff_client, large["run_id"])

    assert len(large_queries) == len(small_queries), "\n".join(large_queries)
    # The page shows all of it: every journal row (branch rows by their position "start.n"), the attempts,
    # the timers and the signals, and the timeline, without a query of its own.
    assert body.count('<tr class="form-row has_original" id="steps-') == 300
    assert body.count('<tr class="form-row has_original" id="attempts-') == large["attempts"]
    assert body.count('<tr class="form-row has_original" id="timers-') == large["timers"]
    assert body.count('<tr class="form-row has_original" id="signals-') == large["signals"]
    first_branch_row = WorkflowStep.objects.filter(run_id=large["run_id"], seq__gt=BRANCH_BASE).order_by("seq")[0]
    assert f"<p>{position_label(first_branch_row.seq)}</p>" in body
    assert body.count('class="weft-bar ') == 300


def test_past_the_row_cap_the_page_costs_no_more_queries(weft_env, staff_client):
    """At the cap (the journal inline shows its first MAX_INLINE_ROWS rows) the Queries panel counts the journal to
    tell whether the inline has it all: one more query when it has (the replay reuses its rows); when it has not, the
    panel loads the journal itself (three more: the counts and the load), and no more however long it is."""
    small = seed.seed_big_run(10, 0, workflow_id="page-cost-10")
    at_cap = seed.seed_big_run(MAX_INLINE_ROWS, 50, workflow_id="page-cost-cap")
    past_cap = seed.seed_big_run(MAX_INLINE_ROWS + 200, 50, workflow_id="page-cost-past-cap")

    small_queries, _ = page_queries(staff_client, small["run_id"])
    at_cap_queries, body = page_queries(staff_client, at_cap["run_id"])
    past_cap_queries, _ = page_queries(staff_client, past_cap["run_id"])

    assert len(at_cap_queries) == len(small_queries) + 1, "\n".join(at_cap_queries)
    assert len(past_cap_queries) <= len(small_queries) + 3, "\n".join(past_cap_queries)
    assert body.count('<tr class="form-row has_original" id="steps-') == MAX_INLINE_ROWS


@pytest.mark.django_db(transaction=True)
def test_weft_bench_seed_times_the_big_run_page_beside_a_normal_one():
    out = StringIO()
    call_command("weft_bench", "--seed-runs", "30", "--seed-steps", "3", "--repeat", "1", "--probe-seconds", "0.05",
                 stdout=out, stderr=StringIO())
    lines = out.getvalue().strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["raw_commits_per_second"] > 0 and figures["seeded_runs"] == 31
    assert figures["big_run"]["steps"] == seed.BIG_STEPS and figures["big_run"]["code_branches"] == seed.BIG_BRANCHES
    pages = figures["admin"]
    for name in ("detail", seed.BIG_PAGE):
        assert pages[name]["p50_ms"] <= pages[name]["p95_ms"] <= pages[name]["max_ms"] and pages[name]["queries"] > 0
        assert any(line.startswith(f"{name}: p50 ") and f"{pages[name]['queries']} queries" in line for line in lines)
    assert figures["cleanup"]["runs_deleted"] == 30 and not Workflow.objects.exists()  # the big run went first


def test_an_operator_action_on_the_run_as_a_whole_shows_no_step(weft_env, staff_client):
    """A RunAction without a journal position (seq is nullable) is listed with "—" in its step column."""
    run = seed.seed_big_run(3, 0, workflow_id="page-action-no-step")
    RunAction.objects.create(run_id=run["run_id"], seq=None, action="fire_now", at=timezone.now())
    RunAction.objects.create(run_id=run["run_id"], seq=2, action="reset_attempts", at=timezone.now())
    _, body = page_queries(staff_client, run["run_id"])
    assert body.count('<tr class="form-row has_original" id="operator_actions-') == 2
    assert '<td class="field-position"><p>—</p></td>' in body
    assert '<td class="field-position"><p>2</p></td>' in body


def test_the_run_pages_tables_show_times_as_its_summary_does(weft_env, staff_client):
    """Every time in the inlines (attempts, timers, signals) has the page's one format and zone, never Django's
    "Dec. 5, 2026, 4:48 p.m."."""
    run = seed.seed_big_run(40, 3, workflow_id="page-times")
    _, body = page_queries(staff_client, run["run_id"])
    attempt = StepAttempt.objects.filter(run_id=run["run_id"]).exclude(started_at=None).first()
    assert attempt is not None
    from django_weft.admin.common import moment

    assert f'<td class="field-started_at"><p>{moment(attempt.started_at)}</p></td>' in body
    import re
    assert not re.findall(r".{120}[ap]\.m\..{20}", body), re.findall(r".{120}[ap]\.m\..{20}", body)[:3]
