"""Issue 10's crash paths with real processes on PostgreSQL: a completion sent while no executor holds the
run (its executor was SIGKILLed after handing the token out), and error text PostgreSQL cannot store."""

from __future__ import annotations

import signal
import time

import pytest

import django_weft as weft
from django_weft.models import AsyncActivity, RunStatus
from tests.procs import SHORT_LEASE, assert_ran_in, journal, wait_until
from tests.testapp.models import Execution
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_completion_sent_after_the_executor_died_is_applied_by_the_next(row_locks, maintenance):
    handle = weft.start("hardening.async_crash", ["killed", "kill"])
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    assert first.wait(30) == -signal.SIGKILL, first.output()  # the activity body killed its own process
    [marker] = Execution.objects.filter(key__startswith="killed:token:").values_list("key", flat=True)
    token = marker.removeprefix("killed:token:")
    assert handle.status == RunStatus.RUNNING and journal(handle.run_id) == []

    weft.complete_async_activity(token, {"approved": "while nobody held the run"})
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().is_finished, "the second process to apply the stored completion", 60,
               [second], describe=lambda: f"run: {handle.refresh().status} {handle.refresh().wait_reason!r}")
    assert handle.result(timeout=0) == {"approved": "while nobody held the run"}
    assert_ran_in("killed:body", first)  # its token was answered: applied at the takeover, the body not run again
    assert_ran_in("killed:after", second)
    assert AsyncActivity.objects.get(run_id=handle.run_id).status == "completed"
    with pytest.raises(weft.TaskTokenAlreadyUsed):
        weft.complete_async_activity(token, "twice")


@pytest.mark.postgres  # NUL in text is what PostgreSQL refuses
def test_error_text_postgresql_cannot_store_fails_the_run_once(postgres_only, maintenance):
    activity = weft.start("hardening.poison_activity", "pg")
    workflow = weft.start("hardening.poison_workflow", "pgwf")
    proc = maintenance("loop", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: activity.refresh().is_finished and workflow.refresh().is_finished,
               "both runs to fail", 60, [proc])
    time.sleep(4)  # past a lease: nothing is executed again
    for handle in (activity, workflow):
        run = handle.refresh()
        assert run.status == RunStatus.FAILED, (run.status, run.error, proc.output())
        assert "\\x00" in run.error["message"]
    assert executions("pg:poison") == 2  # its retry policy's two attempts, no more
    assert executions("pg:after") == 1 and executions("pgwf:after") == 1
    assert "DataError" not in proc.stderr() + proc.stdout(), proc.output()
