"""What reaches a run from outside: signals and updates, numbered in its inbox (``inbox_seq``, their arrival
order) under the run's lock, which wake it if it waits; and the updates a run that ended never applied.
Part of the state writer: :mod:`django_weft.store.transitions` re-exports these.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from django_weft.models import RunStatus, Signal, UpdateStatus, Workflow, WorkflowUpdate
from django_weft.observability import events
from django_weft.store import wakeups


def record_event(run: Workflow, now: datetime, *, wakes: bool) -> int:
    """Count an external event for ``run`` (locked by the caller); wake it if it waits. Returns its number."""
    run.inbox_seq += 1
    fields: dict[str, Any] = {"inbox_seq": run.inbox_seq, "updated_at": now}
    if wakes and run.status == RunStatus.WAITING:
        fields.update(runnable_at=now, awaiting_signals=[])
        wakeups.runnable(run.pk, now, now)
    Workflow.objects.filter(pk=run.pk).update(**fields)
    return run.inbox_seq


def deliver_signal(run: Workflow, name: str, payload: bytes, signal_id: str | None, now: datetime) -> bool:
    """Store a signal for ``run`` (locked by the caller, open). False if ``signal_id`` was seen before."""
    if signal_id is not None and Signal.objects.filter(run=run, name=name, signal_id=signal_id).exists():
        return False
    sequence = record_event(run, now, wakes=name in (run.awaiting_signals or ()))
    signal = Signal.objects.create(run=run, name=name, payload=payload, signal_id=signal_id, sequence=sequence,
                                   received_at=now, trace_context=events.trace_context())
    events.signal_received(run, signal)
    return True


def deliver_update(run: Workflow, name: str, payload: bytes, update_id: str,
                   now: datetime) -> tuple[WorkflowUpdate, bool]:
    """Store an update for ``run`` (locked by the caller, open), numbered with its signals and waking it if it
    waits; or the one it already has with ``update_id`` (then False)."""
    existing = WorkflowUpdate.objects.filter(run=run, update_id=update_id).first()
    if existing is not None:
        return existing, False
    sequence = record_event(run, now, wakes=True)
    return WorkflowUpdate.objects.create(run=run, name=name, update_id=update_id, payload=payload, sequence=sequence,
                                         received_at=now), True


def fail_updates_of_closed_runs(now: datetime) -> int:
    """Fail the pending updates of runs that have ended (see fail_pending_updates); how many."""
    failed = 0
    closed = WorkflowUpdate.objects.filter(status__in=UpdateStatus.open_values(),
                                           run__status__in=RunStatus.terminal_values())
    # A page of ids read first, not a LIMITed subquery inside IN (which MySQL and MariaDB refuse).
    page = list(closed.order_by().values_list("run_id", flat=True).distinct()[:500])
    for run in Workflow.objects.filter(pk__in=page).only("pk", "status"):
        with transaction.atomic():
            failed += fail_pending_updates(run, now)
    return failed


def fail_pending_updates(run: Workflow, now: datetime, *, why: str = "") -> int:
    """The run closed: updates it accepted and did not apply (or whose handler had not returned) fail, and their
    callers are told. (At a continue-as-new only those whose handler runs are left: the others moved on.)"""
    pending = list(WorkflowUpdate.objects.filter(run=run, status__in=UpdateStatus.open_values())
                   .values_list("pk", flat=True))
    if not pending:
        return 0
    error = {"type": "WorkflowClosed",
             "message": why or f"the run ended ({run.status}) before it applied the update"}
    WorkflowUpdate.objects.filter(pk__in=pending, status__in=UpdateStatus.open_values()).update(
        status=UpdateStatus.FAILED, error=error, finished_at=now)
    for pk in pending:
        wakeups.update_settled(pk)
    return len(pending)


# A chain that continues as new quickly can move on while a caller waits for its run's lock: it follows.
LOCK_CHAIN_ATTEMPTS = 10


def lock_open_run(workflow_id: str) -> Workflow | None:
    """The open run of ``workflow_id``, locked (inside the caller's transaction); None if it has none."""
    runs = Workflow.objects.open().select_for_update()
    run = runs.filter(workflow_id=workflow_id).first()
    for _ in range(LOCK_CHAIN_ATTEMPTS):
        if run is not None:
            return run
        # The open run may have just continued as new: this statement waited for its lock and then saw it
        # closed; the next statement sees its successor, which is locked by its key.
        latest = Workflow.objects.latest_for(workflow_id).only("status").first()
        if latest is None or latest.is_finished:
            return None
        run = runs.filter(pk=latest.pk).first()
    return run
