"""The operator's repairs of one run: suspend and resume it, retry it after it failed.

Like every external transition they lock the run (and its owners) with ``select_for_update()``, check the
transition table and bump the fence, so an executor still holding the run loses it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F

from django_weft import signals
from django_weft.exceptions import TransitionNotAllowed
from django_weft.models import ActivityHeartbeat, AsyncActivity, StepAttempt, StepStatus, Timer, Workflow, WorkflowStep
from django_weft.observability import events
from django_weft.store import activity_slots, admissions, lock_retries, wakeups
from django_weft.store.transitions import S, check_transition, locked_run, locked_with_owners


@lock_retries.retrying("suspend")
def suspend(run_id: Any, now: datetime, reason: str = "") -> Workflow:
    """Pause a run: nothing executes it until resume(); an executor holding it loses it."""
    with transaction.atomic():
        run = locked_run(run_id)
        check_transition(run, S.SUSPENDED)
        Workflow.objects.filter(pk=run.pk).update(
            status=S.SUSPENDED, fence=F("fence") + 1, runnable_at=None, lease_owner="",
            wait_reason=(reason or "suspended by an operator")[:255], updated_at=now,
        )
        # Its attempts of limited activities that have not begun give their slots and places in a rate's window
        # to other runs while it is paused; resumed, it asks again (an attempt already running keeps its slot).
        activity_slots.forget_run(run.pk, waiting_only=True)
        run.refresh_from_db()
        events.operator_event(signals.workflow_suspended, run, reason=reason)
    return run


@lock_retries.retrying("resume")
def resume(run_id: Any, now: datetime) -> Workflow:
    """Make a suspended run runnable again; it replays and re-parks on whatever it was waiting for."""
    with transaction.atomic():
        run = locked_run(run_id)
        if run.status != S.SUSPENDED:
            raise TransitionNotAllowed(f"run {run.pk} is {run.status}, not suspended; only suspended runs resume")
        # A run suspended before its delayed start began waits for that start again: it goes back to
        # pending at the start time, not runnable at once.
        delayed = Timer.objects.filter(run=run, purpose="delayed_start", fired_at__isnull=True).only("fire_at").first()
        if run.started_at is None and delayed is not None and delayed.fire_at > now:
            status, wake_at = S.PENDING, delayed.fire_at
        else:
            status, wake_at = S.RUNNING, now
            if delayed is not None:  # its start time passed while it was suspended
                Timer.objects.filter(pk=delayed.pk).update(fired_at=now)
        Workflow.objects.filter(pk=run.pk).update(
            status=status, runnable_at=wake_at, wait_reason="", updated_at=now,
        )
        wakeups.runnable(run.pk, wake_at, now)
        run.refresh_from_db()
        events.operator_event(signals.workflow_resumed, run)
    return run



@lock_retries.retrying("retry_failed")
def retry_failed(run_id: Any, now: datetime) -> Workflow:
    """Take a failed run back to running, from its failed step.

    The failed step(s) at the end of the journal are deleted (with their timers and async attempts), so
    the step runs again from attempt 1; the rest of the journal is kept and replays. A run that failed by
    an uncaught exception after its last step simply replays. The run loses its error, failure category and
    finish time and becomes runnable now (a run of a queue: queued, until its queue admits it). Raises
    TransitionNotAllowed unless the run is failed, or if another
    run of its workflow id is open (one open run per workflow id).
    """
    with transaction.atomic():
        run = locked_with_owners(run_id)
        if run.status != S.FAILED:
            raise TransitionNotAllowed(f"run {run.pk} is {run.status}, not failed; only failed runs can be retried")
        if Workflow.objects.open().filter(workflow_id=run.workflow_id).exclude(pk=run.pk).exists():
            raise TransitionNotAllowed(
                f"another run of {run.workflow_id!r} is open; run {run.pk} cannot be retried while it is"
            )
        statuses = list(WorkflowStep.objects.filter(run=run).order_by("-seq").values_list("seq", "status")[:100])
        first_failed = None
        for seq, status in statuses:
            if status != StepStatus.FAILED:
                break
            first_failed = seq
        if first_failed is not None:
            WorkflowStep.objects.filter(run=run, seq__gte=first_failed).delete()
            StepAttempt.objects.filter(run=run, seq__gte=first_failed).delete()  # they run again from attempt 1
            Timer.objects.filter(run=run, seq__gte=first_failed).delete()
            AsyncActivity.objects.filter(run=run, seq__gte=first_failed).delete()
            _restart_heartbeats(run, seq__gte=first_failed)
        failed_step = (run.error or {}).get("step")
        if isinstance(failed_step, int):
            # A branch's failure: branches that settled after it keep their rows; the failed ones from
            # there on run again.
            failed = WorkflowStep.objects.filter(run=run, seq__gte=failed_step, status=StepStatus.FAILED)
            seqs = list(failed.values_list("seq", flat=True))
            failed.delete()
            StepAttempt.objects.filter(run=run, seq__in=seqs).delete()
            Timer.objects.filter(run=run, seq__in=seqs).delete()
            AsyncActivity.objects.filter(run=run, seq__in=seqs).delete()
            _restart_heartbeats(run, seq__in=seqs)
        # A run of a queue takes a slot again: it waits, queued, for its queue to admit it.
        queued = {"status": S.QUEUED, "runnable_at": None, "admit_at": now} if run.queue else {}
        Workflow.objects.filter(pk=run.pk).update(**{
            "status": S.RUNNING, "fence": F("fence") + 1, "runnable_at": now, "lease_owner": "", "wait_reason": "",
            "error": None, "result": None, "finished_at": None, "cancel_requested_at": None, "awaiting_signals": [],
            "failure_category": "", "termination_reason": "", "retries": F("retries") + 1, "updated_at": now,
            **queued})
        if run.queue:
            admissions.admit_after_commit(run.queue)
        else:
            wakeups.runnable(run.pk, now, now)
    run.refresh_from_db()
    return run


def _restart_heartbeats(run: Workflow, **steps: Any) -> None:
    """Steps that run again from attempt 1 keep their last heartbeat details (progress to resume from) as those
    of an attempt 0, which the new attempts' beats replace (a beat never replaces a later attempt's row)."""
    ActivityHeartbeat.objects.filter(run=run, **steps).update(attempt=0)
