"""PostgreSQL LISTEN/NOTIFY wake-ups of idle ``weft_maintenance`` loops, with real processes.

The loops poll every 60 s here, so a run that finishes within seconds was woken by a notification, and
one that does not (WEFT_NOTIFY=0) shows that nothing else woke it. Latency figures are in
``manage.py weft_bench --latency``; these tests prove cause and fallback, not speed.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, connections, transaction

import django_weft as weft
from django_weft.models import RunStatus, Schedule, Workflow
from django_weft.store.wakeups import CHANNEL, SCHEDULE_CHANNEL
from tests.procs import wait_until
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_POLL = "60"
LISTEN_LAST = f"LISTEN {SCHEDULE_CHANNEL}"  # the listener's last statement, as pg_stat_activity shows it
WOKEN_WITHIN = 15.0  # seconds: far below the poll interval


def idle_loop(maintenance, name: str, *args: str, **env: str):
    proc = maintenance(name, "--interval", SLOW_POLL, *args, **env)
    wait_until(lambda: "running with" in proc.stdout(), f"{name} to start", 30, [proc])
    return proc


def listening_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
                       [LISTEN_LAST])
        return cursor.fetchone()[0]


def test_a_start_and_a_signal_wake_an_idle_loop_at_once(postgres_only, maintenance):
    loop = idle_loop(maintenance, "listening")
    assert "LISTEN/NOTIFY wake-ups" in loop.stdout()
    wait_until(lambda: listening_backends() == 1, "the loop to LISTEN", 30, [loop])
    time.sleep(1)  # the loop is idle now, in a 60 s wait

    handle = weft.start("test.approval", "woken")
    wait_until(lambda: handle.refresh().status == RunStatus.WAITING, "the start to be executed", WOKEN_WITHIN,
               [loop])
    time.sleep(0.5)
    weft.signal(handle.workflow_id, "approval", "go")
    wait_until(lambda: handle.refresh().is_finished, "the signal to resume the run", WOKEN_WITHIN, [loop])
    assert handle.result(timeout=0) == "go"
    assert (executions("woken:before"), executions("woken:after")) == (1, 1)


def test_without_notify_an_idle_loop_waits_for_its_poll(postgres_only, maintenance):
    loop = idle_loop(maintenance, "polling", WEFT_NOTIFY="0")
    assert "polling every 60.0s" in loop.stdout()
    time.sleep(1)
    handle = weft.start("test.steps", {"key": "unheard", "count": 1})
    time.sleep(5)
    assert loop.alive, loop.output()
    assert handle.refresh().status == RunStatus.PENDING, "something other than the poll woke the loop"
    assert executions("unheard:0") == 0


def test_a_lost_listen_connection_is_reestablished(postgres_only, maintenance):
    loop = idle_loop(maintenance, "reconnecting")
    wait_until(lambda: listening_backends() == 1, "the loop to LISTEN", 30, [loop])
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND query = %s", [LISTEN_LAST])
    wait_until(lambda: "LISTEN connection failed" in loop.stderr(), "the loop to notice", 30, [loop])
    wait_until(lambda: listening_backends() == 1, "the loop to LISTEN again", 30, [loop])
    time.sleep(1)

    handle = weft.start("test.steps", {"key": "after-reconnect", "count": 2})
    wait_until(lambda: handle.refresh().is_finished, "the run to be executed", WOKEN_WITHIN, [loop])
    assert handle.refresh().status == RunStatus.COMPLETED


def test_one_notification_per_committed_transaction_and_none_for_a_rollback(postgres_only):
    listener = connections.create_connection("default")
    listener.ensure_connection()
    raw = listener.connection
    raw.autocommit = True
    raw.execute(f"LISTEN {CHANNEL}")
    try:
        def heard() -> int:
            return sum(1 for _ in raw.notifies(timeout=0.5))

        with transaction.atomic():
            for i in range(3):
                weft.start("test.steps", {"key": f"batch{i}", "count": 1})
        assert heard() == 1

        with pytest.raises(RuntimeError), transaction.atomic():
            weft.start("test.steps", {"key": "rolled-back", "count": 1})
            raise RuntimeError("rollback")
        assert heard() == 0

        with transaction.atomic():
            with pytest.raises(RuntimeError), transaction.atomic():  # a savepoint rolled back ...
                weft.start("test.steps", {"key": "inner", "count": 1})
                raise RuntimeError("savepoint rollback")
            weft.start("test.steps", {"key": "outer", "count": 1})  # ... does not silence the outer start
        assert heard() == 1

        weft.start("test.steps", {"key": "autocommit", "count": 1})
        assert heard() == 1
    finally:
        listener.close()


def test_a_new_schedule_wakes_an_idle_maintenance_loop_for_its_first_occurrence(postgres_only, maintenance):
    loop = idle_loop(maintenance, "ticking", "--no-execute")
    wait_until(lambda: listening_backends() == 1, "the loop to LISTEN", 30, [loop])
    time.sleep(1)  # idle in a 60 s wait: no schedule exists yet

    schedule = weft.create_schedule("soon", "test.steps", {"key": "first", "count": 1}, every=3)
    wait_until(lambda: Workflow.objects.filter(schedule=schedule.pk).exists(), "the first occurrence", WOKEN_WITHIN,
               [loop])
    stored = Schedule.objects.get(pk=schedule.pk)
    assert stored.missed_fire_count == 0, "the first occurrence was ticked late"
    run = Workflow.objects.get(schedule=schedule.pk)
    assert run.status == RunStatus.PENDING  # --no-execute: started, not executed
