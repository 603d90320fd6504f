"""Starts with flow options: ``debounce`` (starts within a window collapse into one run, the last input winning)
and ``on_conflict`` (what a start to a busy ``concurrency_key`` does). Both look at the queue's runs and then
write, so each runs in one transaction that holds the queue's admission lock (store/admissions): no admission
pass, and no other such start on that queue, changes what it saw before it commits."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction

from django_weft.common import clock
from django_weft.common.durations import to_seconds
from django_weft.exceptions import InvalidArgument
from django_weft.models import RunStatus, Workflow
from django_weft.store import admissions, transitions

ON_CONFLICT_CHOICES = ("queue", "skip", "replace")
REPLACED = "replaced"  # termination_reason of a run cancelled by a start with on_conflict="replace"


def check_flow_options(*, debounce: Any, on_conflict: Any, workflow_id: str | None, idempotency_key: str | None,
                       concurrency_key: str | None) -> float | None:
    """The debounce window in seconds (None: no debounce); InvalidArgument for a bad combination."""
    if on_conflict not in ON_CONFLICT_CHOICES:
        raise InvalidArgument(f"on_conflict must be one of {ON_CONFLICT_CHOICES}, got {on_conflict!r}")
    if on_conflict != "queue" and concurrency_key is None:
        raise InvalidArgument(f'on_conflict={on_conflict!r} needs a concurrency_key: it is what makes a start '
                              "conflict with the runs already there")
    if debounce is None:
        return None
    seconds = to_seconds(debounce, "debounce", allow_zero=False)
    if idempotency_key is None and concurrency_key is None:
        raise InvalidArgument("debounce needs an idempotency_key or a concurrency_key: starts with the same one "
                              "within the window become one run")
    if workflow_id is not None:
        raise InvalidArgument("debounce collapses starts into the first one's run, so it takes no workflow_id; "
                              "pass idempotency_key or concurrency_key")
    return seconds


def start_with_flow_options(run: Workflow, *, debounce: float | None, on_conflict: str,
                            insert: Any) -> tuple[Any, Any, bool]:
    """Start ``run`` (prepared, unsaved) by its flow options; ``insert()`` writes it as a plain start would.
    Returns the (workflow_id, run_id) the caller gets, and whether ``run`` was written."""
    with transaction.atomic():
        now = clock.now()
        admissions.lock_queue(run.queue, now)
        if debounce is not None:
            pending = _debounced_run(run, now)
            if pending is not None:
                # Still waiting out its window: it takes this start's input, and its window starts again.
                Workflow.objects.filter(pk=pending.pk, status=RunStatus.QUEUED).update(
                    input=run.input, admit_at=now + timedelta(seconds=debounce), updated_at=now)
                return pending.workflow_id, pending.run_id, False
        if run.concurrency_key is not None and on_conflict != "queue":
            busy = list(Workflow.objects.open().filter(queue=run.queue, concurrency_key=run.concurrency_key)
                        .order_by("created_at").values_list("workflow_id", "run_id"))
            if busy and on_conflict == "skip":
                return busy[0][0], busy[0][1], False
            for _, run_id in busy:  # "replace": each is cancelled (its code may clean up), then this one queues
                transitions.cancel(run_id, now, f"replaced by a new start of concurrency key {run.concurrency_key!r}",
                                   termination_reason=REPLACED)
        if debounce is not None:
            run.status, run.runnable_at = RunStatus.QUEUED, None
            run.admit_at = max(run.admit_at or now, now) + timedelta(seconds=debounce)
        written = insert()
        return run.workflow_id, run.run_id, written


def _debounced_run(run: Workflow, now: Any) -> Workflow | None:
    """The queued run this start joins: same idempotency key (or, without one, same type, queue and
    concurrency_key) and still in its debounce window."""
    candidates = Workflow.objects.filter(status=RunStatus.QUEUED, admit_at__gt=now)
    if run.idempotency_key is not None:
        candidates = candidates.filter(idempotency_key=run.idempotency_key)
    else:
        candidates = candidates.filter(workflow_type=run.workflow_type, queue=run.queue,
                                       concurrency_key=run.concurrency_key)
    return candidates.select_for_update().order_by("created_at").only("pk", "workflow_id", "run_id").first()
