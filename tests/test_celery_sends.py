"""WEFT_EXECUTOR = "celery" against a broker that accepts connections and never answers: a send of a
django_weft task gives up within WEFT_CELERY_SEND_TIMEOUT, the caller of weft.start() goes on, and the
maintenance pass delivers the run later.

The starts run in a subprocess (a fresh process, as a web worker is) whose broker is a socket server thread
of this test: silent from the first byte (Redis, RabbitMQ), or a proxy to the machine's RabbitMQ that goes
silent once the connection is up. Every wait has a deadline, so a send that hangs fails the test instead of
hanging it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from celery import current_app
from django.test import override_settings

from django_weft import tasks
from django_weft.models import RunStatus, Workflow
from django_weft.testing import WeftTestEnv
from tests.procs import REPO_ROOT, Proc, wait_until
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

SEND_TIMEOUT = 2  # WEFT_CELERY_SEND_TIMEOUT in the subprocesses
# A send that hangs never ends; one bounded by SEND_TIMEOUT ends long before this (Django's start included).
PROCESS_DEADLINE = 45
FAILED_SEND = "could not send django_weft.drive"
RABBITMQ_PORT = 5672


class SilentBroker:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte; or, with ``upstream``, relays to that port
    until :meth:`go_silent`, then swallows what it receives and answers nothing (a broker that hangs)."""

    def __init__(self, upstream: int | None = None) -> None:
        self.upstream = upstream
        self.silent = upstream is None
        self.sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, name="silent-broker", daemon=True).start()

    def go_silent(self) -> None:
        self.silent = True

    def close(self) -> None:
        for sock in [self.listener, *self.sockets]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.sockets.append(client)
            if self.upstream is not None:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
                server.settimeout(None)
                self.sockets.append(server)
                self._relay(client, server)
                self._relay(server, client)

    def _relay(self, source: socket.socket, target: socket.socket) -> None:
        def pump() -> None:
            while True:
                try:
                    data = source.recv(65536)
                    if not data:
                        return
                    if not self.silent:
                        target.sendall(data)
                except OSError:
                    return
        threading.Thread(target=pump, name="silent-broker-relay", daemon=True).start()


@pytest.fixture
def broker() -> Iterator[Callable[..., SilentBroker]]:
    """``broker(upstream=None)`` starts a :class:`SilentBroker`; all are closed at the end."""
    started: list[SilentBroker] = []

    def start(upstream: int | None = None) -> SilentBroker:
        started.append(SilentBroker(upstream))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture
def script(tmp_path: Path):
    """``script(name, code, broker_url)``: a Python subprocess on the test database whose Celery broker is
    ``broker_url``; killed at the end."""
    started: list[Proc] = []

    def start(name: str, code: str, broker_url: str) -> Proc:
        env = {"CELERY_BROKER_URL": broker_url,
               "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "testproject"), str(REPO_ROOT)])}
        started.append(Proc(name, tmp_path, [sys.executable, "-c", textwrap.dedent(code)], env))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()


@contextmanager
def broker_back() -> Iterator[None]:
    """The broker answers again: here, Celery runs the tasks in this thread as they are sent."""
    previous = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True
    try:
        with override_settings(WEFT_EXECUTOR="celery"):
            yield
    finally:
        current_app.conf.task_always_eager = previous


def finished(proc: Proc) -> dict:
    """The JSON line ``proc`` printed last, once it exited 0 within PROCESS_DEADLINE seconds."""
    assert proc.wait(PROCESS_DEADLINE) == 0, proc.output()
    return json.loads(proc.stdout().strip().splitlines()[-1])


def delivered_by_the_maintenance_pass(run_ids: list[str]) -> None:
    runs = Workflow.objects.filter(pk__in=run_ids)
    assert set(runs.values_list("status", flat=True)) == {RunStatus.PENDING}  # committed, never sent
    with broker_back(), WeftTestEnv(runs.latest("created_at").created_at + timedelta(seconds=10),
                                    send_celery_tasks=True):
        report = tasks.maintenance(every=5)
    assert report["dispatched"] >= 1
    assert set(runs.values_list("status", flat=True)) == {RunStatus.COMPLETED}


START_THREE = f"""
    import json, time
    import django
    django.setup()
    from django.db import transaction
    from django.test import override_settings
    import django_weft as weft

    with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_SEND_TIMEOUT={SEND_TIMEOUT}):
        began = time.monotonic()
        with transaction.atomic():  # three drive tasks after this commit
            handles = [weft.start("test.steps", {{"key": f"silent{{i}}", "count": 1}}) for i in range(3)]
        print(json.dumps({{"run_ids": [str(h.run_id) for h in handles], "seconds": time.monotonic() - began}}))
"""


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{port}/0", "amqp://guest:guest@127.0.0.1:{port}//"],
                         ids=["redis", "amqp"])
def test_starts_return_when_the_broker_never_answers_and_the_maintenance_pass_delivers_them(broker, script, url):
    silent = broker()
    proc = script("starts", START_THREE, url.format(port=silent.port))
    result = finished(proc)  # with Celery's defaults a Redis send waits forever here

    # One send waited for the broker and gave up; the two after it were not tried (sends pause after a failure).
    assert proc.stderr().count(FAILED_SEND) == 1, proc.output()
    print(f"\nthree starts with a silent {url.split(':')[0]} broker returned after {result['seconds']:.1f} s")
    delivered_by_the_maintenance_pass(result["run_ids"])
    assert [executions(f"silent{i}:0") for i in range(3)] == [1, 1, 1]


def rabbitmq_reachable() -> bool:
    try:
        socket.create_connection(("127.0.0.1", RABBITMQ_PORT), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def rabbitmq_queue() -> Iterator[str]:
    if not rabbitmq_reachable():
        pytest.skip(f"needs RabbitMQ at 127.0.0.1:{RABBITMQ_PORT} (CI's machine runs it)")
    name = f"weft-test-{uuid.uuid4().hex[:10]}"
    yield name
    try:
        with current_app.connection_for_write(f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}//") as conn:
            conn.default_channel.queue_delete(name)
    except Exception:  # never declared
        pass


def test_a_start_returns_when_rabbitmq_stops_answering_a_live_connection(broker, script, rabbitmq_queue,
                                                                         tmp_path):
    hangs = broker(upstream=RABBITMQ_PORT)
    go_on = tmp_path / "go-on"
    proc = script("starts", f"""
        import json, pathlib, time
        import django
        django.setup()
        from django.test import override_settings
        from testproject.celery import app
        import django_weft as weft

        app.conf.broker_transport_options = {{"confirm_publish": True}}  # each send waits for RabbitMQ's ack
        with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_SEND_TIMEOUT={SEND_TIMEOUT},
                               WEFT_CELERY_QUEUE="{rabbitmq_queue}"):
            first = weft.start("test.steps", {{"key": "acked", "count": 1}})
            print("first sent", flush=True)
            while not pathlib.Path({str(go_on)!r}).exists():
                time.sleep(0.05)
            began = time.monotonic()
            second = weft.start("test.steps", {{"key": "unacked", "count": 1}})
            print(json.dumps({{"run_ids": [str(second.run_id)], "seconds": time.monotonic() - began}}))
    """, f"amqp://guest:guest@127.0.0.1:{hangs.port}//")
    wait_until(lambda: "first sent" in proc.stdout(), "the first start to be sent", PROCESS_DEADLINE, [proc])
    hangs.go_silent()
    go_on.touch()
    result = finished(proc)  # with Celery's defaults the publisher confirm is awaited forever

    assert proc.stderr().count(FAILED_SEND) == 1, proc.output()  # the second; the first was acknowledged
    print(f"\na start on a RabbitMQ connection that went silent returned after {result['seconds']:.1f} s")
    delivered_by_the_maintenance_pass(result["run_ids"])
    assert executions("unacked:0") == 1
