"""Execute runs for one Celery task: the run a ``django_weft.drive`` message names, or one batch; and the
heartbeat row of the Celery worker process that runs django_weft's tasks."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router

from django_weft.common import clock
from django_weft.conf import weft_settings
from django_weft.models import Executor, ExecutorKind, Workflow
from django_weft.runtime import executor
from django_weft.runtime.lease_keeper import ExecutorRow, LeaseKeeper
from django_weft.services.maintenance import default_owner
from django_weft.store import transitions

NOT_RUNNABLE = "not_runnable"
# A message for a run due this soon is early (clocks of hosts differ a little): wait for it, once.
EARLY_WAIT = timedelta(seconds=2)


def drive_runs(run_id: Any | None = None) -> Counter:
    """Claim run ``run_id`` (or up to WEFT_CLAIM_BATCH_SIZE runnable runs) and drive each until it parks
    or finishes, or until WEFT_CELERY_TASK_SECONDS have passed: then the run is handed back after its
    current step and another task goes on with it (so a worker's warm shutdown is not held up by a long
    workflow). A run someone else holds, or that is not runnable (a duplicate or late message, a finished
    run), is counted as ``not_runnable`` and left alone: the fenced claim decides, not the message.
    """
    outcomes: Counter = Counter()
    limit = 1 if run_id is not None else weft_settings.CLAIM_BATCH_SIZE
    claims = transitions.claim(default_owner(), clock.now(), limit, run_id=run_id)
    if not claims and run_id is not None and clock.sleep_until(_runnable_at(run_id), within=EARLY_WAIT):
        claims = transitions.claim(default_owner(), clock.now(), limit, run_id=run_id)
    if not claims:
        outcomes[NOT_RUNNABLE] += 1
        return outcomes
    claimed_at = time.monotonic()
    with LeaseKeeper() as leases:
        leases.hold(claims)
        for held in claims:
            try:
                if time.monotonic() - claimed_at > executor.BATCH_HOLD_SECONDS:
                    outcomes[executor.hand_back(held)] += 1
                else:
                    budget = _budget(claimed_at + weft_settings.CELERY_TASK_SECONDS)
                    outcomes[executor.execute(held, budget)] += 1
            finally:
                leases.drop(held)
    return outcomes


def _budget(deadline: float) -> Callable[[], bool]:
    """The executor's stop check: true once the deadline has passed, but never before the first new step
    (it is asked before each one), so every task moves its run forward."""
    asked = 0

    def exhausted() -> bool:
        nonlocal asked
        asked += 1
        return asked > 1 and time.monotonic() > deadline

    return exhausted


def _runnable_at(run_id: Any) -> datetime | None:
    return Workflow.objects.filter(pk=run_id).values_list("runnable_at", flat=True).first()


# --- the worker process's heartbeat row -----------------------------------------------------------------

# A Celery worker process counts as live this long after the last django_weft task it ran: an idle worker
# gets no task to beat with, and the maintenance task (every few seconds) reaches each process only now and
# then.
CELERY_ROW_GRACE = timedelta(minutes=5)

_row: ExecutorRow | None = None
_last_beat: float | None = None
_row_lock = threading.Lock()


def beat_worker_process() -> None:
    """Insert or refresh this worker process's heartbeat row, at most once every WEFT_HEARTBEAT_SECONDS
    (one small UPDATE); nothing inside a transaction (an eager task in a test). Called by the tasks."""
    global _row, _last_beat
    if connections[router.db_for_write(Executor)].in_atomic_block:
        return
    with _row_lock:
        if _row is None or _row.pid != os.getpid():  # the first task here, or in a forked pool process
            _row, _last_beat = ExecutorRow(ExecutorKind.CELERY, 1, grace=CELERY_ROW_GRACE), None
        moment = time.monotonic()
        if _last_beat is not None and moment - _last_beat < weft_settings.HEARTBEAT_SECONDS:
            return
        _last_beat = moment
        row = _row
    row.try_beat(clock.now())


def forget_worker_process() -> None:
    """Delete this worker process's heartbeat row (a clean shutdown of the process)."""
    global _row, _last_beat
    with _row_lock:
        row, _row, _last_beat = _row, None, None
    if row is not None and row.pid == os.getpid():
        row.try_remove()
