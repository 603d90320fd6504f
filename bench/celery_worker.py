"""``manage.py weft_bench --celery-workers C``: one Celery worker subprocess executes the runs.

A Celery worker (prefork, C processes) with ``WEFT_EXECUTOR = "celery"``, driven and timed as the
``--processes`` mode is (:func:`bench.processes.drive_bench`). The worker imports this module
(``-I``), which registers the ``weft.bench`` workflow and points ``WEFT_CELERY_QUEUE`` at the bench's queue.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.test.utils import override_settings

from bench.core import BenchError
from bench.processes import drive_bench
from bench.subprocesses import READY_SECONDS, Children, child_env
from django_weft.conf import weft_settings

DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
# Environment of the bench's Celery worker: the queue of the bench, for the tasks it sends itself too.
ENV_CELERY_QUEUE = "WEFT_BENCH_CELERY_QUEUE"


if os.environ.get(ENV_CELERY_QUEUE):  # imported (-I) by the bench's Celery worker
    settings.WEFT_CELERY_QUEUE = os.environ[ENV_CELERY_QUEUE]
    weft_settings.reload()  # read again: assigned directly


def _sanitize(url: str) -> str:
    from kombu.utils.url import maybe_sanitize_url

    return maybe_sanitize_url(url)


def _reset_producers(app: Any) -> None:
    """Drop the app's cached broker connection and producer pools, so the next send uses its current
    ``broker_url`` (what Celery itself does after a fork)."""
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def run_celery_bench(*, workflows: int, steps: int, celery_workers: int, celery_app: str = "testproject",
                     broker: str = DEFAULT_BROKER, probe_seconds: float = 2.0, timeout: float = 600.0,
                     keep: bool = False, prestart: bool = False,
                     progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """A Celery worker (prefork, ``celery_workers`` processes) executes ``workflows`` bench runs started
    from this process with ``WEFT_EXECUTOR = "celery"``: each start sends ``django_weft.drive`` after commit.
    With ``prestart`` the worker stops consuming its queue until every run is started.

    The tasks go to a queue of this bench alone (``weft_bench.<tag>``, deleted afterwards), consumed by a
    worker named ``weft-bench-<tag>@<host>``, so other workers on the same broker neither take them nor
    answer the readiness ping. Raises BenchError if runs fail or time out."""
    from celery._state import get_current_app
    from celery.app.utils import find_app

    try:
        app = find_app(celery_app)
    except Exception as exc:
        raise BenchError(f"cannot load the Celery app {celery_app!r}: {exc}") from None
    tag = uuid.uuid4().hex[:8]
    queue = f"weft_bench.{tag}"
    node = f"weft-bench-{tag}@{socket.gethostname()}"
    previous_app = get_current_app()
    previous_conf = {key: app.conf.get(key) for key in ("broker_url", "task_always_eager")}

    def purge_and_delete(delete: bool) -> int | None:
        try:
            with app.connection_for_write() as conn:
                channel = conn.default_channel
                purged = channel.queue_purge(queue)
                if delete:
                    channel.queue_delete(queue)
                return purged
        except Exception as exc:
            progress(f"note: could not {'delete' if delete else 'purge'} queue {queue}: {exc}")
            return None

    def launch(children: Children) -> dict[str, Any]:
        env = child_env(WEFT_EXECUTOR="celery", CELERY_BROKER_URL=broker, **{ENV_CELERY_QUEUE: queue})
        env.pop("CELERY_TASK_ALWAYS_EAGER", None)
        argv = [sys.executable, "-m", "celery", "-A", celery_app, "worker", "--concurrency", str(celery_workers),
                "--pool", "prefork", "-I", __name__, "-Q", queue, "-n", node, "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        worker = children.start("celery-worker", argv, env)
        deadline = time.monotonic() + READY_SECONDS
        while True:
            children.check_alive("waiting for it to answer a ping")
            try:
                replies = app.control.ping(destination=[node], timeout=1.0)
            except Exception as exc:
                raise BenchError(f"cannot reach the broker {_sanitize(broker)}: {exc}\n{children.describe()}") from None
            if replies:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"the Celery worker {node} did not answer a ping within {READY_SECONDS:g}s\n"
                                 f"{children.describe()}")
        progress(f"celery worker {node} (pid {worker.pid}) is up, consuming {queue}")
        purged = purge_and_delete(False)
        if prestart:
            app.control.cancel_consumer(queue, destination=[node], reply=True, timeout=5.0)
            progress(f"the worker stopped consuming {queue} until every run is started")
        return {"celery_queue": queue, "purged_before": purged}

    def go() -> None:
        app.control.add_consumer(queue, destination=[node], reply=True, timeout=5.0)

    app.set_current()
    app.conf.broker_url = broker
    app.conf.task_always_eager = False
    _reset_producers(app)
    try:
        with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_QUEUE=queue):
            return drive_bench(mode="celery", workflows=workflows, steps=steps, probe_seconds=probe_seconds,
                               timeout=timeout, keep=keep, progress=progress, launch=launch,
                               go=go if prestart else None,
                               extra={"celery_workers": celery_workers, "celery_pool": "prefork",
                                      "celery_app": celery_app, "broker": _sanitize(broker)})
    finally:
        purge_and_delete(True)
        for key, value in previous_conf.items():
            app.conf[key] = value
        _reset_producers(app)
        previous_app.set_current()
