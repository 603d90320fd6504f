"""Is anything executing? Executors' heartbeat rows, and the hint a newcomer needs when nothing is.

Each executing process keeps a row in :class:`~django_weft.models.Executor` (``weft_maintenance`` from start
to stop, a Celery worker process while it runs django_weft tasks) whose ``expires_at`` it pushes forward
with every heartbeat. A row is *live* until then; past it, the process died or hangs. The queries here use
the ``expires_at`` index of that small table and the runnable-runs index of the runs, and count at most
:data:`COUNT_CAP` rows, so the admin and the system check can call them on every request.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import QuerySet

from django_weft.common import clock
from django_weft.conf import weft_settings
from django_weft.models import Executor, Workflow

# Runs runnable (due, unclaimed) this long count as stalled when no executor is live.
STALLED_AFTER = timedelta(minutes=5)
# Stalled runs are counted up to this many ("1000+ runs").
COUNT_CAP = 1000
# Rows of dead executors are kept this long past their expiry (the admin shows when they were last seen),
# then the maintenance pass deletes them.
DEAD_KEPT = timedelta(hours=1)


def live_executors(now: datetime | None = None) -> QuerySet[Executor]:
    """Heartbeat rows of processes alive as of ``now`` (default: the engine's clock), by host and pid.
    Maintenance-only processes (``weft_maintenance --no-execute``) are included, with ``threads=0``."""
    return Executor.objects.filter(expires_at__gt=now or clock.now()).order_by("host", "pid")


def is_alive(executor: Executor, now: datetime | None = None) -> bool:
    return executor.expires_at > (now or clock.now())


def stalled_runs(now: datetime | None = None, *, cap: int = COUNT_CAP) -> int:
    """How many runs have been runnable for over :data:`STALLED_AFTER` without an executor taking them,
    counting at most ``cap + 1`` (a COUNT over a LIMIT subquery, on the runnable index).

    Runnable means ``runnable_at`` has passed: a pending run due to start, a waiting run whose timer is
    due, a running run whose executor's lease expired. A run an executor holds has its ``runnable_at`` at
    its lease expiry, ahead of now; suspended and finished runs have none.
    """
    since = (now or clock.now()) - STALLED_AFTER
    return Workflow.objects.runnable(since).order_by()[: cap + 1].count()


def stalled_hint(now: datetime | None = None) -> str:
    """A one-line hint when runs have been pending for a while and no executor is alive, else ``""``.

    For example: "12 runs pending for over 5 minutes and no live executor; is weft_maintenance running?"
    One query when an executor is live (the small executor table), two otherwise.
    """
    now = now or clock.now()
    if live_executors(now).filter(threads__gt=0).exists():
        return ""
    count = stalled_runs(now)
    if not count:
        return ""
    shown = f"{COUNT_CAP}+" if count > COUNT_CAP else str(count)
    runs = "run" if count == 1 else "runs"
    minutes = int(STALLED_AFTER.total_seconds() // 60)
    if weft_settings.EXECUTOR == "celery":
        question = "are Celery workers running the django_weft tasks (WEFT_EXECUTOR = 'celery')?"
    else:
        question = "is weft_maintenance running?"
    return f"{shown} {runs} pending for over {minutes} minutes and no live executor; {question}"


def dead_executors(now: datetime | None = None) -> QuerySet[Executor]:
    """Rows of executors dead for over :data:`DEAD_KEPT`: what the maintenance pass deletes."""
    return Executor.objects.filter(expires_at__lt=(now or clock.now()) - DEAD_KEPT)
