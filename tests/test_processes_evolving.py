"""Poison runs with real processes on PostgreSQL: a run whose step kills every process that executes it
fails as a system failure after WEFT_MAX_RECOVERY_ATTEMPTS takeovers, instead of being re-claimed forever."""

from __future__ import annotations

import signal

import pytest

import django_weft as weft
from django_weft.models import RunStatus
from tests.procs import SHORT_LEASE, pids_of, wait_until
from tests.testapp.workflows import executions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def test_a_step_that_kills_every_executor_fails_the_run_after_the_recovery_limit(postgres_only, maintenance):
    handle = weft.start("evolve.poison", "poison-proc")
    env = {**SHORT_LEASE, "WEFT_MAX_RECOVERY_ATTEMPTS": "3"}
    killed = []
    for number in range(3):  # the first claim and two takeovers: each process dies in the step
        proc = maintenance(f"dies-{number}", "--interval", "0.2", **env)
        assert proc.wait(30) == -signal.SIGKILL, proc.output()
        killed.append(proc)
    assert executions("poison-proc") == 3 and executions("poison-proc:before") == 1
    last = maintenance("last", "--interval", "0.2", **env)
    wait_until(lambda: handle.refresh().is_finished, "the third takeover to fail the run", 60, [last])
    run = handle.refresh()
    assert run.status == RunStatus.FAILED and run.failure_category == "system", (run.status, run.error)
    assert "taken over 3 times at step 2 without progress" in run.error["message"]
    assert executions("poison-proc") == 3  # the last process did not run the step again
    assert sorted(pids_of("poison-proc")) == sorted(p.pid for p in killed)
