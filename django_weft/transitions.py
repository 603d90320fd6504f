"""The only code that writes a run's status, lease and fence.

Every function is one transaction over one run row (or one page of rows for claims):

* executor writes (step commits, parking, completion) are compare-and-set ``UPDATE``s on
  ``(run_id, fence, status='running')``; the UPDATE takes the row lock for the rest of the transaction,
  and zero rows updated means the run was taken away, so the write is refused with FencingError;
* external transitions (cancel, suspend, resume, time out) lock the row with ``select_for_update()``,
  check the transition table, and bump ``fence`` so the executor holding the run loses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce

from . import journal, signals
from .conf import weft_settings
from .exceptions import FencingError, TransitionNotAllowed, WorkflowNotFound
from .models import RunStatus, Timer, Workflow

logger = logging.getLogger("django_weft.transitions")

S = RunStatus
ALLOWED: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.SUSPENDED, S.CANCELLED, S.TIMED_OUT}),
    S.RUNNING: frozenset({S.RUNNING, S.WAITING, S.SUSPENDED, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT}),
    S.WAITING: frozenset({S.RUNNING, S.SUSPENDED, S.CANCELLED, S.TIMED_OUT}),
    S.SUSPENDED: frozenset({S.RUNNING, S.CANCELLED, S.TIMED_OUT}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}

FINISH_SIGNALS = {
    S.COMPLETED: signals.workflow_completed,
    S.FAILED: signals.workflow_failed,
    S.CANCELLED: signals.workflow_cancelled,
    S.TIMED_OUT: signals.workflow_timed_out,
}


def can_transition(current: str, target: str) -> bool:
    return target in ALLOWED[current]


def _lease_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=weft_settings.LEASE_SECONDS)


def _send_on_commit(signal: Any, run: Workflow) -> None:
    transaction.on_commit(lambda: signal.send_robust(sender=Workflow, run=run))


# --- creating runs -----------------------------------------------------------------------------------


def insert_run(run: Workflow, *, delayed_until: datetime | None) -> Workflow:
    """Insert a new run (inside the caller's transaction). Pending until claimed."""
    run.status = S.PENDING
    run.save(force_insert=True)
    if delayed_until is not None:
        Timer.objects.create(run=run, purpose="delayed_start", fire_at=delayed_until)
    _send_on_commit(signals.workflow_started, run)
    return run


# --- claims, leases and executor writes --------------------------------------------------------------


@dataclass(eq=False)  # identity semantics: claims live in sets while held
class Claim:
    """An executor's hold on one run: valid while the run's fence still equals ``fence``."""

    run: Workflow
    fence: int
    owner: str
    previous_status: str
    previous_owner: str = ""
    lost: bool = False
    # First claim ever (started_at was unset): the run has no journal to read yet.
    fresh: bool = False
    # Writes folded into the run's next fenced commit (a fired timer, a step result), costing no commit.
    deferred: list[journal.JournalWrite] = field(default_factory=list)


def claim(owner: str, now: datetime, limit: int) -> list[Claim]:
    """Take up to ``limit`` runnable runs (due timers, delayed starts, expired leases) for ``owner``."""
    with transaction.atomic():
        # SKIP LOCKED: concurrent claimers take disjoint pages instead of queueing on the same rows.
        rows = list(
            Workflow.objects.runnable(now)
            .order_by("runnable_at")
            .select_for_update(skip_locked=True)[:limit]
        )
        if not rows:
            return []
        Workflow.objects.filter(pk__in=[r.pk for r in rows]).update(
            status=S.RUNNING,
            fence=F("fence") + 1,
            lease_owner=owner,
            runnable_at=_lease_expiry(now),
            wait_reason="",
            started_at=Coalesce("started_at", now),
            updated_at=now,
        )
        delayed = [r.pk for r in rows if r.status == S.PENDING and r.runnable_at > r.created_at]
        if delayed:
            Timer.objects.filter(run_id__in=delayed, purpose="delayed_start", fired_at__isnull=True).update(
                fired_at=now
            )
    claims = []
    for row in rows:
        previous, previous_owner, fresh = row.status, row.lease_owner, row.started_at is None
        row.fence += 1
        row.status = S.RUNNING
        row.lease_owner = owner
        row.started_at = row.started_at or now
        claims.append(Claim(run=row, fence=row.fence, owner=owner, previous_status=previous,
                            previous_owner=previous_owner, fresh=fresh))
    return claims


def _refused(claim: Claim) -> FencingError:
    claim.lost = True
    return FencingError(
        f"run {claim.run.pk} was taken from this executor (cancelled, suspended, timed out or "
        "re-claimed after its lease expired); the write was refused"
    )


def _fenced_write(claim: Claim, now: datetime, writes: Sequence[journal.JournalWrite] = (),
                  **fields: Any) -> None:
    """Update the held run and apply journal writes (the deferred ones first) if the fence holds."""
    pending = [*claim.deferred, *writes]
    claim.deferred = []
    fields["updated_at"] = now
    fast = journal.write_in_one_statement(claim.run.pk, claim.fence, S.RUNNING, fields, pending)
    if fast is False:
        raise _refused(claim)
    if fast is None:
        with transaction.atomic():
            updated = Workflow.objects.filter(pk=claim.run.pk, fence=claim.fence, status=S.RUNNING).update(
                **fields
            )
            if updated == 0:
                raise _refused(claim)
            journal.apply(pending)


def commit(claim: Claim, now: datetime, writes: Sequence[journal.JournalWrite] = ()) -> None:
    """Commit journal writes for a run this executor holds, renewing its lease, in one transaction."""
    _fenced_write(claim, now, writes, runnable_at=_lease_expiry(now))


def park(claim: Claim, now: datetime, *, wake_at: datetime | None, reason: str,
         writes: Sequence[journal.JournalWrite] = ()) -> None:
    """Park the run (waiting) until ``wake_at`` or until something external wakes it."""
    _fenced_write(claim, now, writes, status=S.WAITING, runnable_at=wake_at, wait_reason=reason[:255],
                  lease_owner="")


def finish(claim: Claim, now: datetime, status: str, *, result: bytes | None = None,
           error: dict | None = None) -> None:
    """Complete or fail a run this executor holds."""
    assert status in (S.COMPLETED, S.FAILED), status
    _fenced_write(claim, now, status=status, result=result, error=error, runnable_at=None, lease_owner="",
                  wait_reason="", finished_at=now)
    run = claim.run
    run.status, run.result, run.error, run.finished_at = status, result, error, now
    _send_on_commit(FINISH_SIGNALS[status], run)


def release(claim: Claim, now: datetime, *, retry_at: datetime | None = None, reason: str = "") -> bool:
    """Give a held run back so any executor can take it at ``retry_at`` (default: now)."""
    try:
        _fenced_write(claim, now, runnable_at=retry_at or now, lease_owner="", wait_reason=reason[:255])
    except FencingError:
        return False
    return True


def renew(claims: Iterable[Claim], now: datetime) -> None:
    """Extend the leases of runs held by a live executor; mark the ones it lost."""
    expiry = _lease_expiry(now)
    for held in claims:
        if held.lost:
            continue
        # The owner check keeps a renewal racing a release() from re-leasing a run just handed back.
        updated = Workflow.objects.filter(
            pk=held.run.pk, fence=held.fence, status=S.RUNNING, lease_owner=held.owner
        ).update(runnable_at=expiry)
        if updated == 0:
            held.lost = True


# --- external transitions ----------------------------------------------------------------------------


def _locked(run_id: Any) -> Workflow:
    try:
        return Workflow.objects.select_for_update().get(pk=run_id)
    except Workflow.DoesNotExist:
        raise WorkflowNotFound(f"no workflow run with run id {run_id}") from None


def _check(run: Workflow, target: str) -> None:
    if not can_transition(run.status, target):
        raise TransitionNotAllowed(
            f"run {run.pk} of {run.workflow_id!r} is {run.status}; it cannot become {target}"
        )


def _close(run: Workflow, status: str, now: datetime, error: dict) -> None:
    Workflow.objects.filter(pk=run.pk).update(
        status=status, fence=F("fence") + 1, runnable_at=None, lease_owner="", wait_reason="",
        finished_at=now, updated_at=now, error=error,
    )
    Timer.objects.filter(run=run, fired_at__isnull=True).delete()
    run.status, run.finished_at, run.error, run.fence = status, now, error, run.fence + 1
    _send_on_commit(FINISH_SIGNALS[status], run)


def cancel(run_id: Any, now: datetime, reason: str = "") -> bool:
    """Cancel a run wherever it is; an executor holding it loses it. False if it had already finished."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.is_finished:
            return False
        _close(run, S.CANCELLED, now, {"type": "Cancelled", "message": reason or "cancelled"})
    return True


def time_out(run_id: Any, now: datetime) -> bool:
    with transaction.atomic():
        run = _locked(run_id)
        if run.is_finished or run.execution_deadline is None or run.execution_deadline > now:
            return False
        _close(run, S.TIMED_OUT, now, {
            "type": "TimedOut",
            "message": f"execution timeout reached at {run.execution_deadline.isoformat()}",
        })
    return True


def suspend(run_id: Any, now: datetime, reason: str = "") -> Workflow:
    """Pause a run: nothing executes it until resume(); an executor holding it loses it."""
    with transaction.atomic():
        run = _locked(run_id)
        _check(run, S.SUSPENDED)
        Workflow.objects.filter(pk=run.pk).update(
            status=S.SUSPENDED, fence=F("fence") + 1, runnable_at=None, lease_owner="",
            wait_reason=(reason or "suspended by an operator")[:255], updated_at=now,
        )
    run.refresh_from_db()
    return run


def resume(run_id: Any, now: datetime) -> Workflow:
    """Make a suspended run runnable again; it replays and re-parks on whatever it was waiting for."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.status != S.SUSPENDED:
            raise TransitionNotAllowed(f"run {run.pk} is {run.status}, not suspended; only suspended runs resume")
        Workflow.objects.filter(pk=run.pk).update(
            status=S.RUNNING, runnable_at=now, wait_reason="", updated_at=now,
        )
    run.refresh_from_db()
    return run

