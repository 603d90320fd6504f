"""An operator's controls of one step of a run (design 9.5): fire its timer or retry backoff now, reset its attempt
count, pause and unpause its retries, replace its retry policy or timeouts.

Each is one transaction that locks the run row first (an executor's claim of the run waits for it, and then reads
what it wrote), checks that the control still applies to the step, writes, records a :class:`RunAction`, and wakes
the run where the control makes it due. A run an executor is executing right now is refused: its executor holds the
step's state in memory; the control applies once the run waits.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import router, transaction

from django_weft.exceptions import TransitionNotAllowed
from django_weft.models import (
    RunAction,
    RunStatus,
    StepControl,
    StepKind,
    StepStatus,
    Timer,
    TimerPurpose,
    Workflow,
    WorkflowStep,
)
from django_weft.store import lock_retries, wakeups
from django_weft.store.transitions import locked_run

# The timers an operator may fire early: a sleep, a retry backoff, a signal wait's timeout.
FIRABLE = (TimerPurpose.SLEEP, TimerPurpose.RETRY_BACKOFF, TimerPurpose.WAIT_TIMEOUT)


def _controlled(action: str, run_id: Any, seq: int, now: datetime, requested_by: str,
                change: Callable[[Workflow], dict[str, Any]]) -> None:
    with transaction.atomic(using=router.db_for_write(Workflow)):
        run = locked_run(run_id)
        if run.status == RunStatus.RUNNING:
            raise TransitionNotAllowed(
                f"run {run.pk} is being executed right now; step controls apply to a run that waits: try again once "
                "it parks (its wait reason shows it)")
        if run.is_finished or run.status == RunStatus.QUEUED:
            raise TransitionNotAllowed(f"run {run.pk} is {run.status}: no step of it waits")
        detail = change(run)
        RunAction.objects.create(run=run, seq=seq, action=action, detail=detail, requested_by=requested_by[:255],
                                 at=now)


def _waiting_step(run: Workflow, seq: int) -> WorkflowStep:
    step = WorkflowStep.objects.filter(run=run, seq=seq, kind__in=[StepKind.ACTIVITY, StepKind.TRANSACTION]).first()
    if step is None:
        raise TransitionNotAllowed(f"step {seq} of run {run.pk} is not an activity step (or has not begun)")
    if step.status != StepStatus.WAITING:
        raise TransitionNotAllowed(f"step {seq} of run {run.pk} ({step.name}) is {step.status}: it no longer waits")
    return step


def _backoff_timer(run: Workflow, seq: int) -> Timer | None:
    return Timer.objects.filter(run=run, seq=seq, purpose=TimerPurpose.RETRY_BACKOFF, fired_at__isnull=True).first()


def _control(run: Workflow, seq: int, now: datetime) -> StepControl:
    control, _created = StepControl.objects.get_or_create(run=run, seq=seq, defaults={"updated_at": now})
    if not run.has_step_controls:
        Workflow.objects.filter(pk=run.pk).update(has_step_controls=True)
    return control


def _wake(run: Workflow, at: datetime, now: datetime) -> None:
    """Make a waiting run due at ``at`` (or sooner, if it already was)."""
    if run.status != RunStatus.WAITING:
        return
    if run.runnable_at is not None and run.runnable_at <= at:
        return
    Workflow.objects.filter(pk=run.pk).update(runnable_at=at, updated_at=now)
    wakeups.runnable(run.pk, at, now)


def _next_wake(run: Workflow, now: datetime, *, leaving_out: int) -> datetime | None:
    """When the waiting run is next due once timer ``leaving_out`` no longer wakes it: its other unfired timers
    (those of paused retries left out too)."""
    paused = StepControl.objects.filter(run=run, retries_paused=True).values_list("seq", flat=True)
    timers = (Timer.objects.filter(run=run, fired_at__isnull=True).exclude(pk=leaving_out)
              .exclude(purpose=TimerPurpose.RETRY_BACKOFF, seq__in=list(paused)))
    first = timers.order_by("fire_at").values_list("fire_at", flat=True).first()
    return None if first is None else max(first, now)


@lock_retries.retrying("fire_timer_now")
def fire_now(run_id: Any, seq: int, now: datetime, requested_by: str = "") -> None:
    def change(run: Workflow) -> dict[str, Any]:
        timer = Timer.objects.filter(run=run, seq=seq, purpose__in=FIRABLE, fired_at__isnull=True).first()
        if timer is None:
            raise TransitionNotAllowed(f"step {seq} of run {run.pk} has no timer waiting to fire (it fired already, "
                                       "or the step does not wait on a sleep, a retry backoff or a wait's timeout)")
        if timer.purpose == TimerPurpose.RETRY_BACKOFF and StepControl.objects.filter(
                run=run, seq=seq, retries_paused=True).exists():
            raise TransitionNotAllowed(f"the retries of step {seq} of run {run.pk} are paused: unpause them first")
        was = timer.fire_at
        Timer.objects.filter(pk=timer.pk).update(fire_at=now)
        _wake(run, now, now)
        return {"purpose": timer.purpose, "was_due_at": was.isoformat()}

    _controlled("fire_timer_now", run_id, seq, now, requested_by, change)


@lock_retries.retrying("reset_attempts")
def reset_attempts(run_id: Any, seq: int, now: datetime, requested_by: str = "") -> None:
    def change(run: Workflow) -> dict[str, Any]:
        step = _waiting_step(run, seq)
        retrying = _backoff_timer(run, seq) is not None or bool(step.error)
        # The attempt that begins next (or waits now, for an async completion) counts as the first again.
        counted_after = step.attempt if retrying else step.attempt - 1
        control = _control(run, seq, now)
        StepControl.objects.filter(pk=control.pk).update(attempts_reset_after=counted_after, updated_at=now)
        return {"attempts_so_far": step.attempt, "next_counts_as": 1}

    _controlled("reset_attempts", run_id, seq, now, requested_by, change)


@lock_retries.retrying("pause_retries")
def pause_retries(run_id: Any, seq: int, now: datetime, requested_by: str = "", *, paused: bool = True) -> None:
    def change(run: Workflow) -> dict[str, Any]:
        step = _waiting_step(run, seq)
        timer = _backoff_timer(run, seq)
        control = StepControl.objects.filter(run=run, seq=seq).first()
        if paused:
            if timer is None:
                raise TransitionNotAllowed(f"step {seq} of run {run.pk} ({step.name}) is not waiting to retry")
            if control is not None and control.retries_paused:
                raise TransitionNotAllowed(f"the retries of step {seq} of run {run.pk} are paused already")
            control = _control(run, seq, now)
            StepControl.objects.filter(pk=control.pk).update(retries_paused=True, updated_at=now)
            if run.status == RunStatus.WAITING:
                Workflow.objects.filter(pk=run.pk).update(
                    runnable_at=_next_wake(run, now, leaving_out=timer.pk), updated_at=now,
                    wait_reason=f"retries of {step.name} (step {seq}) paused by an operator"[:255])
            return {"retry_was_due_at": timer.fire_at.isoformat()}
        if control is None or not control.retries_paused:
            raise TransitionNotAllowed(f"the retries of step {seq} of run {run.pk} are not paused")
        StepControl.objects.filter(pk=control.pk).update(retries_paused=False, updated_at=now)
        if timer is not None:
            due = max(timer.fire_at, now)
            if run.status == RunStatus.WAITING:
                Workflow.objects.filter(pk=run.pk).update(
                    wait_reason=f"retrying {step.name} (step {seq}) at {due.isoformat()}"[:255])
            _wake(run, due, now)
        return {"retry_due_at": max(timer.fire_at, now).isoformat() if timer else None}

    _controlled("pause_retries" if paused else "unpause_retries", run_id, seq, now, requested_by, change)


@lock_retries.retrying("set_activity_options")
def set_options(run_id: Any, seq: int, now: datetime, options: dict[str, Any], requested_by: str = "") -> None:
    """``options``: any of ``retry`` (a checked RetryPolicy's fields), ``timeout``, ``schedule_to_close_timeout``
    (seconds; None: the activity's own again)."""
    def change(run: Workflow) -> dict[str, Any]:
        step = _waiting_step(run, seq)
        control = _control(run, seq, now)
        StepControl.objects.filter(pk=control.pk).update(**options, updated_at=now)
        if "schedule_to_close_timeout" in options:  # an async wait's deadline moves with it
            close = options["schedule_to_close_timeout"]
            timer = Timer.objects.filter(run=run, seq=seq, purpose=TimerPurpose.ACTIVITY_TIMEOUT,
                                         fired_at__isnull=True).first()
            if timer is not None and close is not None:
                deadline = step.started_at + timedelta(seconds=close)
                Timer.objects.filter(pk=timer.pk).update(fire_at=deadline)
                _wake(run, max(deadline, now), now)
        return {key: value for key, value in options.items()}

    _controlled("set_activity_options", run_id, seq, now, requested_by, change)
