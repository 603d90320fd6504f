"""Poison runs with real processes on PostgreSQL: a run whose step kills every process that executes it
fails as a system failure after WEFT_MAX_RECOVERY_ATTEMPTS takeovers, instead of being re-claimed forever."""

from __future__ import annotations

import signal

import pytest

import django_weft as weft
from django_weft.models import RunStatus
from tests.procs import SHORT_LEASE, pids_of, wait_until
from tests.testapp.workflows import executions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrent]


def test_a_step_that_kills_every_executor_fails_the_run_after_the_recovery_limit(row_locks, maintenance):
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


def test_signals_sent_while_a_run_keeps_continuing_as_new_are_all_consumed_once(row_locks, maintenance):
    """Two threads signal the workflow id as fast as they can while a weft_maintenance process executes the
    chain, which continues as new every 5 signals: every signal reaches a run of the chain, once."""
    import threading

    from django.db import connections

    weft.start("evolve.counter", {"total": 0, "every": 5}, workflow_id="busy-counter")
    proc = maintenance("loop", "--interval", "0.2", **SHORT_LEASE)
    sent = {"count": 0}
    lock = threading.Lock()

    def sender() -> None:
        try:
            for _ in range(100):
                weft.signal("busy-counter", "tick", 1)
                with lock:
                    sent["count"] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sent["count"] == 200
    weft.signal("busy-counter", "stop")
    handle = weft.get_handle("busy-counter")
    wait_until(lambda: weft.get_handle("busy-counter").refresh().status == RunStatus.COMPLETED,
               "the chain to consume every signal and stop", 120, [proc])
    outcome = weft.get_handle("busy-counter").result(timeout=0)
    assert outcome["total"] == 200, (outcome, proc.output())
    assert outcome["generation"] >= 39  # it continued every 5 ticks
    assert handle.workflow_id == "busy-counter"
