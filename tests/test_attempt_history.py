"""The attempt history of a step (design 9.1): a step that took more than one attempt keeps each one (start,
end, outcome, error), shown by the admin and ``weft_runs show``, so earlier errors stay visible after the step
succeeds; a step done on its first try writes nothing more than before. Lost attempts are proven with real
processes in tests/test_processes_attempts.py."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_weft as weft
from django_weft.models import AttemptOutcome, StepAttempt, WorkflowStep

pytestmark = pytest.mark.django_db


def retried_run(weft_env, key: str) -> weft.WorkflowHandle:
    """``flaky`` fails twice, then succeeds at its third attempt."""
    handle = weft.start("test.retry", {"key": key, "failures": 2})
    weft_env.drive()
    weft_env.advance(timedelta(seconds=1))
    weft_env.advance(timedelta(seconds=2))
    assert handle.result() == "ok"
    return handle


def test_errors_of_failed_attempts_stay_visible_after_the_step_succeeds(weft_env):
    handle = retried_run(weft_env, "hist")
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=1)
    assert (step.status, step.attempt) == ("completed", 3)
    rows = list(StepAttempt.objects.filter(run_id=handle.run_id).order_by("attempt"))
    assert [(r.seq, r.attempt, r.outcome) for r in rows] == [
        (1, 1, AttemptOutcome.FAILED), (1, 2, AttemptOutcome.FAILED), (1, 3, AttemptOutcome.COMPLETED)]
    assert [r.error["message"] for r in rows[:2]] == ["failure 1 of hist", "failure 2 of hist"]
    assert rows[2].error is None
    assert all(r.started_at is not None and r.finished_at >= r.started_at for r in rows)
    assert rows[0].finished_at < rows[1].started_at  # the backoff lies between them


def test_a_step_done_on_its_first_try_writes_no_attempt_row(weft_env):
    table = StepAttempt._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        handle = weft.start("test.steps", {"key": "first-try", "count": 3})
        weft_env.drive()
    assert handle.result() == ["FIRST-TRY:0", "FIRST-TRY:1", "FIRST-TRY:2"]
    assert not [q["sql"] for q in queries.captured_queries if table in q["sql"]]
    assert not StepAttempt.objects.filter(run_id=handle.run_id).exists()


def test_weft_runs_show_lists_the_attempts(weft_env):
    handle = retried_run(weft_env, "cli")
    out = StringIO()
    call_command("weft_runs", "show", str(handle.run_id), stdout=out)
    text = out.getvalue()
    assert "attempts (3):" in text
    assert "    tests.testapp.workflows.Flaky: failure 1 of cli\n" in text
    assert "    tests.testapp.workflows.Flaky: failure 2 of cli\n" in text

    out = StringIO()
    call_command("weft_runs", "show", str(handle.run_id), "--json", stdout=out)
    attempts = json.loads(out.getvalue())["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "failed"), (2, "failed"), (3, "completed")]
    assert attempts[1]["error"]["message"] == "failure 2 of cli"


def test_the_admin_run_page_shows_the_attempt_history(weft_env, staff_client):
    handle = retried_run(weft_env, "admin")
    page = staff_client.get(reverse("admin:django_weft_workflow_change", args=[handle.run_id])).content.decode()
    assert "Attempt history" in page
    assert "failure 1 of admin" in page and "failure 2 of admin" in page


def test_the_api_returns_each_steps_attempts(weft_env, api):
    handle = retried_run(weft_env, "api")
    weft.start("test.steps", {"key": "api-plain", "count": 2}, workflow_id="plain")
    weft_env.drive()
    body = api.get(f"runs/{handle.workflow_id}/steps").json()
    [step] = body["results"]
    assert (step["status"], step["attempt"], body["next"]) == ("completed", 3, None)
    assert [(a["attempt"], a["outcome"]) for a in step["attempts"]] == [(1, "failed"), (2, "failed"),
                                                                       (3, "completed")]
    assert step["attempts"][0]["error"]["message"] == "failure 1 of api"
    page = api.get("runs/plain/steps", {"limit": 1}).json()
    assert [s["attempts"] for s in page["results"]] == [[]] and page["next"]
    rest = api.get("runs/plain/steps", {"limit": 1, "cursor": page["next"]}).json()
    assert [s["seq"] for s in rest["results"]] == [2] and rest["next"] is None
