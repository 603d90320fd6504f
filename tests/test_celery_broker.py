"""WEFT_EXECUTOR = "celery" end to end: real Celery workers and beat (subprocesses) on the machine's RabbitMQ
and Redis, against the test database.

Each test uses its own queue (WEFT_CELERY_QUEUE), so nothing else on the broker takes its messages, and
deletes it at the end. Skipped with a reason when the broker is not reachable (a fresh machine has none;
CI's machine runs both). Every wait has a deadline; every process is killed at the end; failures carry
the processes' output.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest
from celery import current_app
from django.core.management import call_command
from django.test import override_settings

import django_weft as weft
from django_weft import tasks
from django_weft.models import RunStatus, Schedule, Workflow
from tests.procs import REPO_ROOT, SHORT_LEASE, Proc, outputs, wait_until
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

AMQP = "amqp://guest:guest@127.0.0.1:5672//"
REDIS = "redis://127.0.0.1:6379/0"


def reachable(url: str) -> bool:
    port = 5672 if url.startswith("amqp") else 6379
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def needs(url: str) -> None:
    if not reachable(url):
        pytest.skip(f"needs a broker at {url} (CI's machine runs RabbitMQ and Redis)")


@pytest.fixture
def queue():
    name = f"weft-test-{uuid.uuid4().hex[:10]}"
    yield name
    if reachable(AMQP):
        try:
            with current_app.connection_for_write(AMQP) as conn:
                conn.default_channel.queue_delete(name)
        except Exception:  # the queue may never have been declared
            pass


class Celery:
    """Starts Celery workers and beat for one test, all on ``queue`` at ``broker``."""

    def __init__(self, processes, queue: str, broker: str) -> None:
        self.processes = processes
        self.queue = queue
        self.broker = broker
        self.procs: list[Proc] = []

    def env(self, **extra: str) -> dict[str, str]:
        return {"WEFT_EXECUTOR": "celery", "WEFT_CELERY_QUEUE": self.queue, "CELERY_BROKER_URL": self.broker,
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "testproject"), str(REPO_ROOT)]), **extra}

    def worker(self, name: str, *, pool: str = "prefork", concurrency: int = 2, **env: str) -> Proc:
        proc = self.processes(name, [
            sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool", pool,
            "--concurrency", str(concurrency), "-Q", self.queue, "-n", f"{name}-{self.queue}@%h",
            "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ], **self.env(**env))
        self.procs.append(proc)
        wait_until(lambda: " ready." in proc.stderr(), f"Celery worker {name} to be ready", 60, [proc])
        return proc

    def beat(self, tmp_path: Path, **env: str) -> Proc:
        proc = self.processes("beat", [
            sys.executable, "-m", "celery", "-A", "testproject", "beat", "--loglevel", "INFO",
            "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler", "--max-interval", "1",
            "--pidfile", str(tmp_path / "beat.pid"),
        ], **self.env(**env))
        self.procs.append(proc)
        return proc

    def script(self, name: str, code: str, **env: str) -> Proc:
        proc = self.processes(name, [sys.executable, "-c", textwrap.dedent(code)], **self.env(**env))
        self.procs.append(proc)
        return proc

    def wait(self, predicate, what: str, timeout: float = 60, *, alive: list[Proc] | None = None) -> None:
        wait_until(predicate, what, timeout, self.procs if alive is None else alive,
                   describe=lambda: f"runs: {Counter(Workflow.objects.values_list('status', flat=True))}")


@pytest.fixture
def celery(processes, queue):
    def start(broker: str) -> Celery:
        needs(broker)
        return Celery(processes, queue, broker)
    return start


def test_a_worker_drives_activities_sleeps_and_signals_to_completion(celery, queue):
    cel = celery(AMQP)
    cel.worker("worker")
    with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_QUEUE=queue):
        steps = [weft.start("test.steps", {"key": f"steps{i}", "count": 3}) for i in range(8)]
        sleepers = [weft.start("test.steps", {"key": f"sleep{i}", "count": 2, "sleep": 1}) for i in range(4)]
        approvals = [weft.start("test.approval", f"approval{i}") for i in range(4)]
        cel.wait(lambda: all(h.refresh().status == RunStatus.WAITING for h in approvals), "approvals to wait")
        for i, handle in enumerate(approvals):
            weft.signal(handle.workflow_id, "approval", f"yes-{i}")
        everything = steps + sleepers + approvals
        cel.wait(lambda: all(h.refresh().is_finished for h in everything), "every run to finish")

    assert Counter(h.refresh().status for h in everything) == {RunStatus.COMPLETED: 16}, outputs(cel.procs)
    assert [h.result(timeout=0) for h in approvals] == [f"yes-{i}" for i in range(4)]
    for i in range(8):
        assert [executions(f"steps{i}:{j}") for j in range(3)] == [1, 1, 1]
    for i, handle in enumerate(sleepers):
        run = handle.refresh()
        assert [executions(f"sleep{i}:{j}") for j in range(2)] == [1, 1]
        assert (run.finished_at - run.started_at).total_seconds() >= 1.0  # the durable sleep was slept


def test_beat_runs_maintenance_schedules_long_timers_and_lost_deliveries(celery, queue, tmp_path,
                                                                         monkeypatch):
    cel = celery(AMQP)
    # Timers longer than half a second get no ETA message when they are set: only the beat-driven
    # maintenance pass can send them.
    horizon = {"WEFT_CELERY_ETA_HORIZON": "0.5"}
    cel.worker("worker", **horizon)
    with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_QUEUE=queue, WEFT_CELERY_ETA_HORIZON=0.5):
        # Passes every 3 s, a schedule every 2 s: its occurrences between passes need the ticks sent ahead.
        call_command("weft_maintenance", "--install-beat", "--every", "3")
        long_sleep = weft.start("test.steps", {"key": "long", "count": 2, "sleep": 3})
        with monkeypatch.context() as broken:
            broken.setattr(tasks.drive, "apply_async", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
            lost = weft.start("test.steps", {"key": "lost", "count": 1})
        schedule = weft.create_schedule("celery-every-2s", "test.steps", {"key": "tick", "count": 1}, every=2,
                                        overlap="allow_all")
        cel.beat(tmp_path, **horizon)
        cel.wait(lambda: Workflow.objects.filter(schedule=schedule.pk, status=RunStatus.COMPLETED).count() >= 3,
                 "three scheduled runs to complete", 90)
        weft.get_schedule("celery-every-2s").pause()
        cel.wait(lambda: not Workflow.objects.open().exists(), "every open run to finish", 60)

    assert lost.refresh().status == RunStatus.COMPLETED and executions("lost:0") == 1
    run = long_sleep.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error)
    assert (run.finished_at - run.started_at).total_seconds() >= 3.0
    scheduled = Workflow.objects.filter(schedule=schedule.pk)
    moments = list(scheduled.values_list("scheduled_for", flat=True))
    assert len(moments) == len(set(moments)) >= 3
    assert set(scheduled.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    assert executions("tick:0") == len(moments)
    stored = Schedule.objects.get(pk=schedule.pk)
    print(f"\nbeat test: {len(moments)} scheduled runs, {stored.missed_fire_count} missed occurrence(s)")


def test_a_run_in_a_killed_worker_is_recovered_through_beat(celery, queue, tmp_path):
    cel = celery(AMQP)
    # The solo pool executes in the worker's own process, so SIGKILL ends the activity in flight.
    first = cel.worker("first", pool="solo", concurrency=1, **SHORT_LEASE)
    release = tmp_path / "release"
    with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_QUEUE=queue):
        call_command("weft_maintenance", "--install-beat", "--every", "1")
        handle = weft.start("test.crash", {"key": "crash", "path": str(release), "max_wait": 60})
        cel.wait(lambda: executions("crash:start") == 1, "the activity to start in the first worker")
        first.popen.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert handle.refresh().status == RunStatus.RUNNING  # claimed by a dead worker until its lease ends

        release.touch()
        alive = [cel.worker("second", **SHORT_LEASE), cel.beat(tmp_path, **SHORT_LEASE)]
        cel.wait(lambda: handle.refresh().is_finished, "the run to be recovered", 90, alive=alive)

    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, outputs(cel.procs))
    assert handle.result(timeout=0) == "released"
    # The recorded step ran once; the one in flight when the worker died ran again (at least once).
    assert (executions("crash:before"), executions("crash:start"), executions("crash:after")) == (1, 2, 1)


def test_a_worker_on_redis_drives_runs_started_and_signalled_by_another_process(celery):
    cel = celery(REDIS)
    cel.worker("worker")
    client = cel.script("client", """
        import json, time
        import django
        django.setup()
        import django_weft as weft
        from django_weft.models import RunStatus

        steps = [weft.start("test.steps", {"key": f"redis{i}", "count": 2}) for i in range(5)]
        approvals = [weft.start("test.approval", f"redis-approval{i}") for i in range(3)]
        deadline = time.monotonic() + 60
        while not all(h.refresh().status == RunStatus.WAITING for h in approvals):
            assert time.monotonic() < deadline, "approvals did not park"
            time.sleep(0.05)
        for h in approvals:
            weft.signal(h.workflow_id, "approval", "ok")
        print(json.dumps([str(h.run_id) for h in steps + approvals]))
    """)
    assert client.wait(90) == 0, client.output()
    run_ids = json.loads(client.stdout().strip().splitlines()[-1])
    runs = Workflow.objects.filter(pk__in=run_ids)
    cel.wait(lambda: all(r.is_finished for r in runs.all()), "every run to finish", alive=cel.procs[:1])
    assert Counter(runs.values_list("status", flat=True)) == {RunStatus.COMPLETED: 8}
    assert [executions(f"redis{i}:1") for i in range(5)] == [1] * 5
    assert [executions(f"redis-approval{i}:after") for i in range(3)] == [1] * 3
