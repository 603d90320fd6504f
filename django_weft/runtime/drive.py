"""Execute runs for one Celery task: the run a ``django_weft.drive`` message names, or one batch."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .. import clock, transitions
from ..conf import weft_settings
from ..maintenance import default_owner
from ..models import Workflow
from . import executor
from .leases import LeaseKeeper

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
