"""run_maintenance, the weft_maintenance command, fencing, retention and system checks."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import django_weft as weft
from django_weft.checks import check_sqlite_transaction_mode, check_unregistered_open_runs
from django_weft.models import Signal, Timer, Workflow, WorkflowStep
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


def test_run_maintenance_reports_what_it_did(weft_env):
    weft.start("test.steps", {"key": "m", "count": 2, "sleep": 10})
    weft.start("test.steps", {"key": "n", "count": 1})
    report = weft.run_maintenance()
    assert (report.claimed, report.started) == (2, 2)
    assert report.outcomes == {"waiting": 1, "completed": 1}
    report = weft.run_maintenance(now=weft_env.now() + timedelta(seconds=10))
    assert (report.claimed, report.woken, report.outcomes["completed"]) == (1, 1, 1)
    assert "woken=1" in str(report)


def test_run_maintenance_acts_as_of_now(weft_env):
    handle = weft.start("test.long_sleep")
    weft.run_maintenance()
    weft.run_maintenance(now=weft_env.now() + timedelta(days=1))
    assert handle.status == "waiting"
    weft.run_maintenance(now=weft_env.now() + timedelta(days=2))
    assert handle.result() == "woke"
    with pytest.raises(ValueError, match="aware"):
        weft.run_maintenance(now=weft_env.now().replace(tzinfo=None))


@pytest.mark.django_db(transaction=True)
def test_terminate_during_a_step_refuses_the_executors_late_commit(weft_env):
    handle = weft.start("test.terminated_mid_step", "mid", workflow_id="mid")
    report = weft_env.drive()
    assert report.outcomes == {"lost": 1}
    run = handle.refresh()
    assert run.status == "timed_out" and "operator terminated mid-step" in run.error["message"]
    # The step that was running when the terminate landed is not recorded, and nothing after it ran.
    assert list(WorkflowStep.objects.filter(run_id=handle.run_id).values_list("seq", flat=True)) == [1]
    assert executions("mid") == 1 and executions("mid:never") == 0


@pytest.mark.django_db(transaction=True)
def test_a_cancel_during_a_step_lets_it_commit_and_the_next_call_raises(weft_env):
    handle = weft.start("test.cancelled_mid_step", "midc", workflow_id="midc")
    report = weft_env.drive()
    assert report.outcomes == {"cancelled": 1}
    run = handle.refresh()
    assert run.status == "cancelled" and run.error["message"] == "operator cancelled mid-step"
    steps = list(WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq").values_list("seq", "status"))
    assert steps == [(1, "completed"), (2, "completed"), (3, "cancelled")]
    assert executions("midc") == 1 and executions("midc:never") == 0


def test_expired_lease_makes_the_run_runnable_again(weft_env):
    from django.db.models import F

    handle = weft.start("test.steps", {"key": "l", "count": 1})
    # An executor on another host claimed the run (30 s lease) and died without a word.
    Workflow.objects.filter(pk=handle.run_id).update(
        status="running", lease_owner="dead-host:1", fence=F("fence") + 1,
        runnable_at=weft_env.now() + timedelta(seconds=30),
    )
    assert weft.run_maintenance(now=weft_env.now() + timedelta(seconds=29)).claimed == 0
    assert executions("l:0") == 0
    report = weft.run_maintenance(now=weft_env.now() + timedelta(seconds=31))
    assert (report.recovered, report.outcomes["completed"]) == (1, 1)
    assert handle.result() == ["L:0"]
    assert handle.refresh().fence == 2  # claimed by the dead executor, then by the one that recovered it


@override_settings(WEFT_RETENTION={"completed": timedelta(days=1), "failed": None})
def test_retention_deletes_finished_runs_per_status(weft_env):
    done = weft.start("test.steps", {"key": "old", "count": 2, "sleep": 1})
    weft.signal(done.workflow_id, "ignored", "kept until retention")
    failed = weft.start("test.uncaught", "old-failure")
    open_run = weft.start("test.long_sleep")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=1))
    assert done.status == "completed" and failed.status == "failed"
    assert weft.run_maintenance(now=weft_env.now() + timedelta(hours=23)).purged == 0
    report = weft.run_maintenance(now=weft_env.now() + timedelta(days=1, seconds=1))
    assert report.purged == 1
    assert set(Workflow.objects.values_list("pk", flat=True)) == {failed.run_id, open_run.run_id}
    assert not WorkflowStep.objects.filter(run_id=done.run_id).exists()
    assert not Timer.objects.filter(run_id=done.run_id).exists()
    assert not Signal.objects.filter(run_id=done.run_id).exists()


def test_weft_maintenance_once_command(weft_env):
    handle = weft.start("test.steps", {"key": "cmd", "count": 2})
    out = StringIO()
    call_command("weft_maintenance", "--once", stdout=out)
    assert handle.status == "completed"
    assert "claimed=1" in out.getvalue() and "runs_completed=1" in out.getvalue()


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--interval", "0"], "--interval must be positive"),
])
def test_weft_maintenance_rejects_bad_options(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("weft_maintenance", *args)


def test_unknown_workflow_type_is_put_back_not_failed(weft_env):
    handle = weft.start("test.steps", {"key": "u", "count": 1})
    Workflow.objects.filter(pk=handle.run_id).update(workflow_type="retired.workflow")
    report = weft_env.drive()
    assert report.outcomes == {"released": 1}
    run = handle.refresh()
    assert run.status == "running" and "retired.workflow" in run.wait_reason
    assert run.runnable_at == weft_env.now() + timedelta(seconds=60)


def test_check_warns_about_open_runs_of_unregistered_types():
    assert check_unregistered_open_runs(databases=["default"]) == []
    handle = weft.start("test.steps", {"key": "w", "count": 1})
    Workflow.objects.filter(pk=handle.run_id).update(workflow_type="gone.workflow")
    [warning] = check_unregistered_open_runs(databases=["default"])
    assert warning.id == "weft.W001" and "gone.workflow" in warning.msg


def test_check_requires_immediate_transactions_on_sqlite(settings):
    from django.db import connections

    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:", "OPTIONS": {}}
    original = connections["default"].settings_dict
    connections["default"].settings_dict = {**original, **sqlite}
    try:
        [error] = check_sqlite_transaction_mode()
        assert error.id == "weft.E001" and "IMMEDIATE" in error.hint
        connections["default"].settings_dict["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}
        assert check_sqlite_transaction_mode() == []
    finally:
        connections["default"].settings_dict = original


@pytest.mark.django_db(transaction=True)
@override_settings(WEFT_LEASE_SECONDS=1.0, WEFT_HEARTBEAT_SECONDS=0.2)
def test_lease_is_renewed_while_a_long_activity_runs():
    import threading
    import time

    from django.db import connection

    handle = weft.start("test.slow", {"key": "long", "seconds": 3})
    reports = []

    def executor_thread():
        try:
            reports.append(weft.run_maintenance())
        finally:
            connection.close()

    thread = threading.Thread(target=executor_thread)
    thread.start()
    deadline = time.monotonic() + 10
    while executions("long") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    rivals = []
    while thread.is_alive() and time.monotonic() < deadline:
        rivals.append(weft.run_maintenance())  # a second executor, looking for expired leases
        time.sleep(0.1)
    thread.join()
    assert sum(r.claimed for r in rivals) == 0, "the rival took over a run whose lease was being renewed"
    assert len(rivals) > 10
    assert reports[0].outcomes == {"completed": 1}
    assert executions("long") == 1
    assert handle.result() == "slept"


def test_a_database_error_while_committing_a_step_does_not_fail_the_run(weft_env, monkeypatch):
    from django.db import OperationalError

    original_save = WorkflowStep.save
    failures = []

    def flaky_save(self, *args, **kwargs):
        if not failures:
            failures.append(self.seq)
            raise OperationalError("server closed the connection unexpectedly")
        return original_save(self, *args, **kwargs)

    monkeypatch.setattr(WorkflowStep, "save", flaky_save)
    handle = weft.start("test.steps", {"key": "dberr", "count": 2})
    report = weft_env.drive()
    assert report.outcomes == {"lost": 1}
    run = handle.refresh()
    assert run.status == "running" and run.error is None, "a commit failure must not fail the run"
    assert not WorkflowStep.objects.filter(run_id=handle.run_id).exists()
    weft_env.advance(timedelta(seconds=31))  # the lease expires; the run is retried from its journal
    assert handle.result() == ["DBERR:0", "DBERR:1"]
    assert executions("dberr:0") == 2, "the step whose commit failed runs again (at least once)"
    assert executions("dberr:1") == 1
