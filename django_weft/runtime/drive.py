"""Execute runs for one Celery task: the run a ``django_weft.drive`` message names, or one batch."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .. import clock, transitions
from ..conf import weft_settings
from ..maintenance import default_owner
from . import executor
from .leases import LeaseKeeper

NOT_RUNNABLE = "not_runnable"
# Runs still waiting in a batch after this long go back to the pool for other tasks.
BATCH_HOLD_SECONDS = 2.0


def drive_runs(run_id: Any | None = None) -> Counter:
    """Claim run ``run_id`` (or up to WEFT_CLAIM_BATCH_SIZE runnable runs) and drive each until it parks
    or finishes. A run someone else holds, or that is not runnable (a duplicate or late message, a
    finished run), is counted as ``not_runnable`` and left alone: the fenced claim decides, not the message.
    """
    outcomes: Counter = Counter()
    limit = 1 if run_id is not None else weft_settings.CLAIM_BATCH_SIZE
    claims = transitions.claim(default_owner(), clock.now(), limit, run_id=run_id)
    if not claims:
        outcomes[NOT_RUNNABLE] += 1
        return outcomes
    claimed_at = time.monotonic()
    with LeaseKeeper() as leases:
        leases.hold(claims)
        for held in claims:
            try:
                if time.monotonic() - claimed_at > BATCH_HOLD_SECONDS:
                    released = transitions.release(held, clock.now())
                    outcomes[executor.RELEASED if released else executor.LOST] += 1
                else:
                    outcomes[executor.execute(held)] += 1
            finally:
                leases.drop(held)
    return outcomes
