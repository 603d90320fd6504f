"""Telling executors that a run became runnable, so it starts now rather than at the next poll.

:func:`runnable` is called by :mod:`django_weft.store.transitions` inside the transaction that makes a run
runnable (a start, a signal or completion that wakes it, a resume, a retry, a short timer). It is only a
hint: every executor still claims through the fenced claim query, and the maintenance pass finds anything a
lost hint left behind.

* PostgreSQL (``WEFT_NOTIFY``): one ``NOTIFY`` on :data:`CHANNEL` right after the transaction commits
  (never for a rollback), however many runs it made runnable. Idle ``weft_maintenance`` loops LISTEN
  (:mod:`django_weft.worker.listener`). Not inside the transaction: a transaction that notifies holds a
  database-wide lock through its commit, which serialised concurrent commits (pgbench, 8 clients, on this
  project's machine: 1,100-1,500 commits/s with ``pg_notify`` in the transaction, 3,500-4,300 with it right
  after, 4,800-5,100 without). Only runs due within :data:`NOTIFY_HORIZON` are announced: a loop that wakes
  recomputes when the next run is due, so a later one is not missed either way.
* ``WEFT_EXECUTOR = "celery"``: the task ``django_weft.drive`` for that run, sent after commit (with an ETA
  when the run is due later, within ``WEFT_CELERY_ETA_HORIZON``), within ``WEFT_CELERY_SEND_TIMEOUT``
  seconds (:mod:`django_weft.worker.task_sends`).

:func:`schedule_due` does the same for a schedule created, changed or resumed: maintenance loops hear it
on :data:`SCHEDULE_CHANNEL` (their sleep may be longer than the way to its first occurrence, and a late
tick counts as missed); with Celery a ``django_weft.tick`` is sent for that instant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.signals import setting_changed
from django.db import connections, router, transaction

from django_weft.conf import weft_settings

logger = logging.getLogger("django_weft.wakeups")

CHANNEL = "django_weft_runnable"
SCHEDULE_CHANNEL = "django_weft_schedules"
# An update's reply was stored (the payload is the update's pk): callers of handle.update() wait on it.
UPDATE_CHANNEL = "django_weft_updates"
# A run set an event or wrote to a stream (the payload is its run id): readers of handle.get_event and
# handle.read_stream wait on it.
EVENTS_CHANNEL = "django_weft_events"
NOTIFY_HORIZON = timedelta(seconds=60)


def _alias() -> str:
    from django_weft.models import Workflow

    return router.db_for_write(Workflow)


def notifies(alias: str) -> bool:
    return connections[alias].vendor == "postgresql" and bool(weft_settings.NOTIFY)


def can_listen(alias: str) -> bool:
    """A connection to ``alias`` can LISTEN for these NOTIFYs: they are sent, and psycopg 3 (whose
    ``notifies()`` the listeners use) is the driver."""
    if not notifies(alias):
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


def celery_executes() -> bool:
    return weft_settings.EXECUTOR == "celery"


def runnable(run_id: Any, at: datetime, now: datetime) -> None:
    """Announce that run ``run_id`` can be claimed from ``at`` on; call it in the transaction that made it so."""
    # Always with its ETA when it is due later, however soon: a worker claiming early finds nothing.
    _announce(at, now, CHANNEL, lambda: send_drive(run_id, at if at > now else None))


def schedule_due(due_at: datetime | None, now: datetime) -> None:
    """Announce a schedule whose next occurrence is ``due_at``; call it in the transaction that set it."""
    if due_at is not None:
        _announce(due_at, now, SCHEDULE_CHANNEL, lambda: send_tick(due_at))


def _announce(at: datetime, now: datetime, channel: str, send: Callable[[], bool]) -> None:
    """After commit, if ``at`` is soon enough: NOTIFY ``channel`` (PostgreSQL) and ``send`` (Celery)."""
    alias = _alias()
    soon = at - now
    if notifies(alias) and soon <= NOTIFY_HORIZON:
        _notify_after_commit(alias, channel)
    if celery_executes() and soon <= timedelta(seconds=weft_settings.CELERY_ETA_HORIZON):
        transaction.on_commit(send, using=alias)


_notifiers: dict[tuple[str, str], Callable[[], None]] = {}


def _notify_after_commit(alias: str, channel: str) -> None:
    notify = _notifiers.get((alias, channel))
    if notify is None:
        notify = _notifiers[(alias, channel)] = lambda: _notify(alias, channel)
    connection = connections[alias]
    # Once per transaction: the pending after-commit callbacks (which a rolled-back savepoint drops) are
    # the record of whether this transaction already asked.
    if connection.in_atomic_block and any(entry[1] is notify for entry in connection.run_on_commit):
        return
    transaction.on_commit(notify, using=alias)


def update_settled(update_pk: int) -> None:
    """Tell a caller waiting for update ``update_pk`` that its reply is stored (after this transaction commits;
    PostgreSQL with WEFT_NOTIFY; elsewhere the caller polls)."""
    alias = _alias()
    if notifies(alias):
        transaction.on_commit(lambda: _notify(alias, UPDATE_CHANNEL, str(update_pk)), using=alias)


def published(run_id: Any) -> None:
    """Tell readers waiting for run ``run_id``'s events and streams that it wrote some (after this transaction
    commits; once per transaction and run)."""
    alias = _alias()
    if not notifies(alias):
        return
    key = str(run_id)
    connection = connections[alias]
    if connection.in_atomic_block and any(getattr(entry[1], "weft_published", None) == key
                                          for entry in connection.run_on_commit):
        return

    def notify() -> None:
        _notify(alias, EVENTS_CHANNEL, key)

    notify.weft_published = key  # type: ignore[attr-defined]
    transaction.on_commit(notify, using=alias)


def _notify(alias: str, channel: str, payload: str = "") -> None:
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
    except Exception:
        # Only a hint: idle loops poll anyway.
        logger.exception("NOTIFY %s failed; idle loops find the change at their next poll", channel)


# The Celery tasks and their sender, registered by django_weft.tasks when it is imported (the app's ready()
# imports it where Celery is installed): the state writer announces wake-ups without importing the executor
# layer, or Celery.
_tasks: dict[str, Any] = {}


def use_celery_tasks(*, drive: Any, tick: Any, publish: Callable[[Any, list, dict[str, Any]], None]) -> None:
    """``publish(task, args, options)`` sends ``task``: django_weft.worker.task_sends.publish, which bounds the send."""
    _tasks.update(drive=drive, tick=tick, publish=publish)


def _task(name: str) -> Any:
    task = _tasks.get(name)
    if task is None:
        raise RuntimeError("the django_weft Celery tasks are not loaded; is Celery installed "
                           "(pip install 'django-weft[celery]')?")
    return task


def send_drive(run_id: Any | None, eta: datetime | None = None) -> bool:
    """Send ``django_weft.drive`` (for one run, or for a batch when ``run_id`` is None), to the Celery queue of
    the run's queue if WEFT_QUEUES routes it (celery_queue), else to WEFT_CELERY_QUEUE."""
    return _send("drive", [None if run_id is None else str(run_id)], eta,
                 f"django_weft.drive for run {run_id}; the maintenance pass will",
                 queue=None if run_id is None else _routed_queue(run_id))


def _routed_queue(run_id: Any) -> str | None:
    """The Celery queue WEFT_QUEUES routes run ``run_id``'s queue to (read after the commit that made it
    runnable); None without routes, the cost of every send then."""
    from django_weft.common.queues import celery_routes
    from django_weft.models import Workflow

    routes = celery_routes()
    if not routes:
        return None
    queue = Workflow.objects.filter(pk=run_id).values_list("queue", flat=True).first()
    return routes.get(queue or "")


def send_tick(eta: datetime | None) -> bool:
    """Send ``django_weft.tick`` for the schedule instant ``eta``."""
    return _send("tick", [], eta, f"django_weft.tick for {eta}; the next maintenance pass ticks")


# After a send failed, this process sends nothing for WEFT_CELERY_SEND_TIMEOUT seconds (time.monotonic()
# until then): a transaction that woke many runs, or a maintenance pass, would otherwise wait as long for
# each of its sends to a broker that does not answer. The maintenance pass delivers what was not sent.
_paused_until = 0.0


def _send(name: str, args: list, eta: datetime | None, what: str, *, queue: str | None = None) -> bool:
    """Send task ``name`` on WEFT_CELERY_QUEUE, within WEFT_CELERY_SEND_TIMEOUT seconds. A broker error or
    timeout is logged, not raised: the change the task announces has committed, and the maintenance pass
    delivers it; False then, and while sends pause after a failure."""
    if time.monotonic() < _paused_until:
        logger.debug("skipped %s (sends pause after a failed one)", what)
        return False
    try:
        _task("publish")(_task(name), args, _message_options(eta, queue))
    except Exception:
        logger.exception("could not send %s (sends from this process pause for %g s)", what, _pause_sends())
        return False
    return True


def _message_options(eta: datetime | None, queue: str | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"ignore_result": True}
    if eta is not None:
        options["eta"] = eta
    if queue or weft_settings.CELERY_QUEUE:
        options["queue"] = queue or weft_settings.CELERY_QUEUE
    return options


def _pause_sends() -> float:
    """Pause sends for WEFT_CELERY_SEND_TIMEOUT seconds from now; returns that."""
    global _paused_until
    pause = float(weft_settings.CELERY_SEND_TIMEOUT)
    _paused_until = time.monotonic() + pause
    return pause


def _resume_sends(*, setting: str, **kwargs: Any) -> None:
    """A change of settings (override_settings in tests) starts without the pause of an earlier failure."""
    global _paused_until
    if setting.startswith("WEFT_"):
        _paused_until = 0.0


setting_changed.connect(_resume_sends, dispatch_uid="django_weft.wakeups.resume_sends")
