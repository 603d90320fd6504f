"""The Celery tasks of django_weft (``WEFT_EXECUTOR = "celery"``); Celery's autodiscovery finds them.

* ``django_weft.drive``: execute one run (or a batch); sent after commit whenever a run becomes runnable.
* ``django_weft.services.maintenance``: the maintenance pass; ``manage.py weft_maintenance --install-beat`` makes
  django-celery-beat send it every few seconds.
* ``django_weft.tick``: a schedule tick at an exact instant, sent ahead by the maintenance pass and when a
  schedule is created, changed or resumed.

Each task is safe to run twice or late: runs are claimed through the fenced claim, schedules through
``SKIP LOCKED`` rows. Importing this module (and .task_sends, how they are sent) needs Celery; nothing else
in django_weft does.

A worker process that runs ``drive`` or ``maintenance`` keeps a heartbeat row (models.Executor, refreshed at
most every WEFT_HEARTBEAT_SECONDS), deleted when the process shuts down cleanly.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown
from django.db import close_old_connections, connections

from django_weft.common import clock
from django_weft.store import wakeups
from django_weft.worker.task_sends import publish


def _recycle_connections() -> None:
    """Apply Django's CONN_MAX_AGE and CONN_HEALTH_CHECKS per task, as Django does per request: a connection
    that broke (a database restart) is replaced instead of failing every later task. (With
    CELERY_DB_REUSE_MAX set, Celery no longer closes the connection around every task, which costs a
    reconnect each.) Not inside a transaction: an eager task may run in one (tests)."""
    if not any(conn.in_atomic_block for conn in connections.all(initialized_only=True)):
        close_old_connections()


def _forget_process(**kwargs: Any) -> None:
    from django_weft.worker.celery_drive import forget_worker_process

    forget_worker_process()


def _wake_held_runs(**kwargs: Any) -> None:
    """A worker starts, perhaps with newly deployed code: runs held because their code raised (on_error="hold")
    are tried again now, as when weft_maintenance starts."""
    from django_weft.store import transitions

    try:
        transitions.wake_held_runs(clock.now())
    finally:
        connections.close_all()


worker_ready.connect(_wake_held_runs, weak=False, dispatch_uid="django_weft.wake_held_runs")


# Pool processes (prefork) and the worker itself (solo and thread pools run tasks in it).
worker_process_shutdown.connect(_forget_process, weak=False, dispatch_uid="django_weft.forget_process")
worker_shutdown.connect(_forget_process, weak=False, dispatch_uid="django_weft.forget_worker")


@shared_task(name="django_weft.drive", ignore_result=True)
def drive(run_id: str | None = None) -> dict[str, int]:
    from django_weft.worker.celery_drive import beat_worker_process, drive_runs

    _recycle_connections()
    beat_worker_process()
    return dict(drive_runs(run_id))


@shared_task(name="django_weft.maintenance", ignore_result=True)
def maintenance(every: float = 5.0) -> dict[str, Any]:
    from django_weft.services.maintenance import maintenance_pass, tick_ahead
    from django_weft.worker.celery_drive import beat_worker_process

    _recycle_connections()
    beat_worker_process()
    now = clock.now()
    report = maintenance_pass(now, window=every).as_dict()
    report["ticks_sent"] = tick_ahead(now, every)
    return report


@shared_task(name="django_weft.tick", ignore_result=True)
def tick() -> int:
    from django_weft.services.maintenance import tick_when_due

    _recycle_connections()
    return tick_when_due()


wakeups.use_celery_tasks(drive=drive, tick=tick, publish=publish)
