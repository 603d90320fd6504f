"""Executor heartbeat rows, the stalled-runs hint and check, the executor admin, decoded payloads.

The process tests run real ``weft_maintenance`` subprocesses on the committed test database
(``transaction=True``) with a one-second heartbeat, so a killed process's row expires within seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db.backends.signals import connection_created
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

import django_weft as weft
from django_weft.checks import check_stalled_runs
from django_weft.models import AsyncActivity, Executor, ExecutorKind, Signal, Workflow, WorkflowStep
from django_weft.services import liveness
from django_weft.worker.loop import Worker
from tests.procs import SHORT_LEASE, wait_until

HINT = "no live executor; is weft_maintenance running?"


def start_stalled(count: int, minutes: float = 10) -> list:
    """Runs that were due ``minutes`` ago and that no executor has taken."""
    due = timezone.now() - timedelta(minutes=minutes)
    return [weft.start("test.steps", {"key": f"stalled{i}", "count": 1}, start_at=due) for i in range(count)]


def executor_row(*, alive: bool = True, threads: int = 2, host: str = "web-1", pid: int = 4242,
                 kind: str = ExecutorKind.LOOP) -> Executor:
    now = timezone.now()
    expires = now + timedelta(seconds=30) if alive else now - timedelta(seconds=1)
    return Executor.objects.create(kind=kind, host=host, pid=pid, threads=threads, version="0.1.0",
                                   started_at=now - timedelta(minutes=1), last_seen=now - timedelta(seconds=2),
                                   expires_at=expires)


def rows_of(pid: int) -> list[Executor]:
    return list(Executor.objects.filter(pid=pid, host=socket.gethostname()))


# --- heartbeat rows of real processes ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_running_weft_maintenance_keeps_a_live_row_and_deletes_it_on_sigterm(maintenance):
    proc = maintenance("loop", "--workers", "2", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: liveness.live_executors().filter(pid=proc.pid).exists(), "its heartbeat row", 30, [proc])
    [row] = rows_of(proc.pid)
    assert (row.kind, row.threads, row.host) == (ExecutorKind.LOOP, 2, socket.gethostname())
    assert row.started_at <= row.last_seen < row.expires_at
    # The row is refreshed with every heartbeat (one second here), so it stays live.
    wait_until(lambda: rows_of(proc.pid)[0].last_seen > row.last_seen, "a heartbeat to refresh the row", 10,
               [proc])
    assert liveness.live_executors().filter(pk=row.pk).exists()

    proc.send(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert rows_of(proc.pid) == []


@pytest.mark.django_db(transaction=True)
def test_a_killed_process_row_goes_stale_and_the_hint_and_check_then_warn(maintenance):
    proc = maintenance("doomed", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: liveness.live_executors().filter(pid=proc.pid).exists(), "its heartbeat row", 30, [proc])
    proc.send(signal.SIGKILL)
    proc.wait(10)
    # The row stays behind, but counts as dead once it missed three one-second heartbeats.
    wait_until(lambda: not liveness.live_executors().filter(pid=proc.pid).exists(), "the row to expire", 10)
    [row] = rows_of(proc.pid)
    assert not liveness.is_alive(row)
    assert liveness.stalled_hint() == ""  # nothing is pending

    start_stalled(3)
    assert liveness.stalled_hint() == f"3 runs pending for over 5 minutes and {HINT}"
    [warning] = check_stalled_runs(databases=["default"])
    assert warning.id == "weft.W002" and warning.msg == liveness.stalled_hint()
    err = StringIO()
    call_command("check", "--database", "default", stdout=StringIO(), stderr=err)
    assert "weft.W002" in err.getvalue() and "3 runs pending" in err.getvalue()

    # An hour after it expired, the maintenance pass deletes the dead row.
    weft.run_maintenance(now=row.expires_at + liveness.DEAD_KEPT + timedelta(seconds=1))
    assert rows_of(proc.pid) == []


class StatementLog:
    """Every statement on every connection opened while installed, with the thread that sent it."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, str]] = []

    def __call__(self, execute, sql, params, many, context):
        self.statements.append((threading.current_thread().name, sql))
        return execute(sql, params, many, context)

    def install(self, sender, connection, **kwargs) -> None:
        if self not in connection.execute_wrappers:  # MySQL's backend can announce one connection twice
            connection.execute_wrappers.append(self)

    def on_executor_table(self) -> list[str]:
        table = Executor._meta.db_table
        return [sql.split()[0].upper() for _, sql in self.statements if table in sql]



@pytest.mark.django_db(transaction=True)
@override_settings(WEFT_HEARTBEAT_SECONDS=0.1)
def test_an_idle_worker_costs_one_small_update_per_heartbeat():
    log = StatementLog()
    connection_created.connect(log.install, dispatch_uid="test-executor-log")
    worker = Worker(threads=1, interval=0.2)
    thread = threading.Thread(target=worker.run)
    try:
        began = time.monotonic()
        thread.start()
        wait_until(lambda: liveness.live_executors().filter(pid=os.getpid()).exists(), "the worker's row", 10)
        [row] = liveness.live_executors().filter(pid=os.getpid())
        assert (row.kind, row.threads) == (ExecutorKind.LOOP, 1)
        time.sleep(1.0)
    finally:
        worker.stop()
        thread.join(30)
        connection_created.disconnect(dispatch_uid="test-executor-log")
    elapsed = time.monotonic() - began
    assert not Executor.objects.exists()  # deleted at the clean stop
    # One INSERT at the start, then the heartbeat thread's updates: holding no lease, it sends nothing else.
    assert log.on_executor_table().count("INSERT") == 1
    # Django's MySQL backend reads the server's version and settings, and sets the session, once per connection.
    sent = [sql for name, sql in log.statements
            if name == "weft-heartbeat" and not sql.strip().startswith(("SELECT VERSION()", "SET "))]
    beats = [sql.split()[0].upper() for sql in sent]
    assert set(beats) == {"UPDATE"} and 5 <= len(beats) <= elapsed / 0.1 + 1, beats
    assert all(Executor._meta.db_table in sql for sql in sent)


# --- the hint and the check -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_no_hint_while_an_executor_is_alive_or_nothing_is_pending():
    assert liveness.stalled_hint() == ""  # nothing pending, nothing alive
    start_stalled(2)
    assert liveness.stalled_hint() == f"2 runs pending for over 5 minutes and {HINT}"
    row = executor_row(alive=True)
    assert liveness.stalled_hint() == ""
    assert check_stalled_runs(databases=["default"]) == []
    row.delete()
    executor_row(alive=False)
    assert liveness.stalled_hint().startswith("2 runs pending")


@pytest.mark.django_db
def test_recent_runs_and_leased_runs_are_not_stalled():
    weft.start("test.steps", {"key": "fresh", "count": 1})  # due now: an executor has 5 minutes
    weft.start("test.steps", {"key": "later", "count": 1}, start_after=timedelta(hours=1))
    assert liveness.stalled_runs() == 0 and liveness.stalled_hint() == ""
    # Five minutes on, the first one is stalled, the delayed one is not due yet.
    assert liveness.stalled_runs(timezone.now() + timedelta(minutes=6)) == 1


@pytest.mark.django_db
def test_a_maintenance_only_process_is_no_executor():
    start_stalled(1)
    executor_row(alive=True, threads=0)
    assert liveness.stalled_hint() == f"1 run pending for over 5 minutes and {HINT}"
    assert liveness.live_executors().count() == 1  # the admin still lists it


@pytest.mark.django_db
def test_the_stalled_count_is_bounded():
    start_stalled(3)
    assert liveness.stalled_runs(cap=2) == 3  # cap + 1: "more than the cap"
    assert liveness.stalled_runs() == 3


@pytest.mark.django_db
@override_settings(WEFT_EXECUTOR="celery")
def test_the_hint_asks_about_celery_workers_when_celery_executes():
    start_stalled(1)  # its drive task would be sent after commit: never, in this test's transaction
    assert "are Celery workers running" in liveness.stalled_hint()


@pytest.mark.django_db
def test_the_check_runs_only_when_asked_to_check_the_database():
    start_stalled(1)
    assert check_stalled_runs(databases=None) == []
    assert [w.id for w in check_stalled_runs(databases=["default"])] == ["weft.W002"]


@pytest.mark.django_db
def test_dead_rows_are_purged_after_an_hour_live_ones_never():
    dead = executor_row(alive=False, pid=1)
    live = executor_row(alive=True, pid=2)
    weft.run_maintenance()
    assert set(Executor.objects.values_list("pid", flat=True)) == {1, 2}
    weft.run_maintenance(now=dead.expires_at + liveness.DEAD_KEPT + timedelta(seconds=1))
    assert list(Executor.objects.values_list("pk", flat=True)) == [live.pk]


# --- Celery worker processes ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@override_settings(WEFT_EXECUTOR="celery", WEFT_HEARTBEAT_SECONDS=0)
def test_a_celery_worker_process_that_runs_django_weft_tasks_has_a_row_until_it_shuts_down():
    from celery import current_app
    from celery.signals import worker_process_shutdown

    previous = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True
    try:
        handle = weft.start("test.steps", {"key": "celery-row", "count": 1})  # drive runs here, after commit
    finally:
        current_app.conf.task_always_eager = previous
    assert handle.refresh().status == "completed"
    [row] = liveness.live_executors().filter(pid=os.getpid())
    assert (row.kind, row.threads) == (ExecutorKind.CELERY, 1)
    assert liveness.stalled_hint() == ""
    worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
    assert not Executor.objects.filter(pid=os.getpid()).exists()


# --- the admin --------------------------------------------------------------------------------------------


@pytest.fixture
def superuser_client(client):
    client.force_login(get_user_model().objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


@pytest.mark.django_db
def test_the_executor_list_shows_host_pid_threads_and_whether_alive(superuser_client):
    executor_row(alive=True, host="web-1", pid=4242, threads=3)
    executor_row(alive=False, host="worker-9", pid=77, threads=1)
    url = reverse("admin:django_weft_executor_changelist")
    body = superuser_client.get(url).content.decode()
    assert "web-1" in body and "4242" in body and "worker-9" in body
    assert body.count('alt="True"') == 1 and body.count('alt="False"') == 1
    alive_only = superuser_client.get(url, {"alive": "yes"}).context["cl"].result_list
    assert [row.host for row in alive_only] == ["web-1"]


@pytest.mark.django_db
def test_executors_cannot_be_added_changed_or_deleted_by_anyone(superuser_client):
    row = executor_row()
    detail = superuser_client.get(reverse("admin:django_weft_executor_change", args=[row.pk]))
    assert detail.status_code == 200 and b"web-1" in detail.content
    assert b'name="_save"' not in detail.content
    assert superuser_client.get(reverse("admin:django_weft_executor_add")).status_code == 403
    changed = superuser_client.post(reverse("admin:django_weft_executor_change", args=[row.pk]),
                                    {"host": "evil", "pid": 1, "threads": 1})
    assert changed.status_code == 403
    assert superuser_client.post(reverse("admin:django_weft_executor_delete", args=[row.pk]),
                                 {"post": "yes"}).status_code == 403
    listing = superuser_client.get(reverse("admin:django_weft_executor_changelist")).content.decode()
    assert 'name="action"' not in listing  # no bulk actions, not even delete_selected
    row.refresh_from_db()
    assert row.host == "web-1"


@pytest.mark.django_db
def test_staff_need_the_view_permission(client):
    staff = get_user_model().objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    client.force_login(staff)
    url = reverse("admin:django_weft_executor_changelist")
    assert client.get(url).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_executor"))
    assert client.get(url).status_code == 200


# --- decoded payloads -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_decoded_payloads_round_trip_on_the_models(weft_env):
    spec = {"key": "dec", "count": 1, "when": timezone.now(), "amount": Decimal("9.99"), "pair": (1, 2),
            "tags": {"a", "b"}}
    handle = weft.start("test.steps", spec)
    weft_env.drive()
    run = Workflow.objects.get(pk=handle.run_id)
    assert run.decoded_input == spec and isinstance(run.decoded_input["pair"], tuple)
    assert run.decoded_result == ["DEC:0"] == handle.result(timeout=0)
    [step] = WorkflowStep.objects.filter(run=run)
    assert step.decoded_result == "DEC:0"

    collector = weft.start("test.collect", 1, workflow_id="dec-signals")
    weft.signal("dec-signals", "item", {"n": Decimal("1.5")})
    assert Signal.objects.get(run_id=collector.run_id).decoded_payload == {"n": Decimal("1.5")}

    asking = weft.start("test.async", "dec-async")
    weft_env.drive()
    pending = AsyncActivity.objects.get(run_id=asking.run_id)
    assert pending.decoded_result is None
    weft.complete_async_activity(pending.token, {"approved": True, "at": (2024, 1)})
    pending.refresh_from_db()
    assert pending.decoded_result == {"approved": True, "at": (2024, 1)}

    unstarted = Workflow(input=None, result=None)
    assert unstarted.decoded_input is None and unstarted.decoded_result is None
