"""Terminate: an operator ends a run at once, wherever it is.

Like every external transition it locks the run (and its owners) with ``select_for_update()`` and bumps the
fence, so an executor still holding the run has its next commit refused; closing it applies its children's
parent_close_policy, fails the updates it did not apply and wakes a parent waiting for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from django_weft.models import FailureCategory, Workflow
from django_weft.store import lock_retries
from django_weft.store.transitions import (
    S,
    close_from_outside,
    locked_with_owners,
)

TERMINATED = "terminated"  # termination_reason of a run ended by handle.terminate / weft.terminate

# A chain that continues as new while the terminate waits for its run's lock: follow it this many times.
CHAIN_ATTEMPTS = 10


@lock_retries.retrying("terminate")
def terminate(run_id: Any, now: datetime, reason: str = "", *, follow_chain: bool = True) -> bool:
    """End the run (or, if it continued as new and ``follow_chain``, the run its chain has reached) as
    ``timed_out`` with ``termination_reason="terminated"``. False if it had already finished."""
    with transaction.atomic():
        run = locked_with_owners(run_id)
        for _ in range(CHAIN_ATTEMPTS if follow_chain else 0):
            if run.status != S.CONTINUED:
                break
            following = Workflow.objects.end_of_chain(run)
            if following.pk == run.pk:
                break
            run = locked_with_owners(following.pk)
        if run.is_finished:
            return False
        message = f"terminated: {reason}" if reason else "terminated by an operator"
        # The status says the run did not finish its work (timed_out, as Temporal's terminate); the category
        # says why: an operator ended it, which is a cancellation, not a deadline that passed.
        close_from_outside(run, S.TIMED_OUT, now, {"type": "Terminated", "message": message, "reason": reason},
               termination_reason=TERMINATED, category=FailureCategory.CANCELLATION)
    return True
