"""Telling executors that a run became runnable, so it starts now rather than at the next poll.

:func:`runnable` is called by :mod:`django_weft.transitions` inside the transaction that makes a run
runnable (a start, a signal or completion that wakes it, a resume, a retry, a short timer). It is only a
hint: every executor still claims through the fenced claim query, and the maintenance pass finds anything a
lost hint left behind.

* PostgreSQL (``WEFT_NOTIFY``): one ``NOTIFY`` on :data:`CHANNEL` right after the transaction commits
  (never for a rollback), however many runs it made runnable. Idle ``weft_maintenance`` loops LISTEN
  (:mod:`django_weft.runtime.listener`). Not inside the transaction: a transaction that notifies holds a
  database-wide lock through its commit, which serialised concurrent commits (pgbench, 8 clients, on this
  project's machine: 1,100-1,500 commits/s with ``pg_notify`` in the transaction, 3,500-4,300 with it right
  after, 4,800-5,100 without). Only runs due within :data:`NOTIFY_HORIZON` are announced: a loop that wakes
  recomputes when the next run is due, so a later one is not missed either way.
* ``WEFT_EXECUTOR = "celery"``: the task ``django_weft.drive`` for that run, sent after commit (with an ETA
  when the run is due later, within ``WEFT_CELERY_ETA_HORIZON``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router, transaction

from .conf import weft_settings

logger = logging.getLogger("django_weft.wakeups")

CHANNEL = "django_weft_runnable"
NOTIFY_HORIZON = timedelta(seconds=60)
# An ETA closer than this is not worth one: the task is sent for immediate delivery.
ETA_MIN = timedelta(milliseconds=200)


def _alias() -> str:
    from .models import Workflow

    return router.db_for_write(Workflow)


def celery_executes() -> bool:
    return weft_settings.EXECUTOR == "celery"


def runnable(run_id: Any, at: datetime, now: datetime) -> None:
    """Announce that run ``run_id`` can be claimed from ``at`` on; call it in the transaction that made it so."""
    alias = _alias()
    connection = connections[alias]
    soon = at - now
    if connection.vendor == "postgresql" and weft_settings.NOTIFY and soon <= NOTIFY_HORIZON:
        _notify_after_commit(alias)
    if celery_executes() and soon <= timedelta(seconds=weft_settings.CELERY_ETA_HORIZON):
        eta = at if soon > ETA_MIN else None
        transaction.on_commit(lambda: send_drive(run_id, eta), using=alias)


_notifiers: dict[str, Callable[[], None]] = {}


def _notify_after_commit(alias: str) -> None:
    notify = _notifiers.get(alias)
    if notify is None:
        notify = _notifiers[alias] = lambda: _notify(alias)
    connection = connections[alias]
    # Once per transaction: the pending after-commit callbacks (which a rolled-back savepoint drops) are
    # the record of whether this transaction already asked.
    if connection.in_atomic_block and any(entry[1] is notify for entry in connection.run_on_commit):
        return
    transaction.on_commit(notify, using=alias)


def _notify(alias: str) -> None:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    except Exception:
        # Only a hint: idle loops poll anyway.
        logger.exception("NOTIFY %s failed; idle loops find the run at their next poll", CHANNEL)


def send_drive(run_id: Any | None, eta: datetime | None = None) -> bool:
    """Send ``django_weft.drive`` (for one run, or for a batch when ``run_id`` is None). A broker error is
    logged, not raised: the change it announces has committed, and the maintenance pass delivers it."""
    from .tasks import drive

    options: dict[str, Any] = {"ignore_result": True}
    if eta is not None:
        options["eta"] = eta
    if weft_settings.CELERY_QUEUE:
        options["queue"] = weft_settings.CELERY_QUEUE
    try:
        drive.apply_async(args=[None if run_id is None else str(run_id)], **options)
    except Exception:
        logger.exception("could not send django_weft.drive for run %s; the maintenance pass will", run_id)
        return False
    return True
