"""Fork: a new run that keeps a copy of another run's journal before a step and executes from there (the way
to run step 4 again after fixing a bug in it).

The fork is a run of the same type and version (its journal must replay with the same code), with the same
input, tags and search attributes, recording ``restarted_from`` = the source. It and every row it copies
commit in one transaction; the source is only read (locked while it is copied, so an executor committing a
step of an open source waits for the copy instead of being half in it), and keeps running if it is open.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max, Min, Q

from django_weft.common.positions import BRANCH_BASE, BRANCH_SPAN, branch_block
from django_weft.common.registry import get_workflow
from django_weft.exceptions import InvalidArgument, WorkflowAlreadyExists, WorkflowNotFound
from django_weft.models import Signal, StepKind, StepStatus, Workflow, WorkflowStep, WorkflowUpdate
from django_weft.store.starts import MAX_ID_LENGTH, check_id
from django_weft.store.transitions import insert_run

# Updates and handled signals, applied between the workflow's operations (runtime/replay/inbox.py).
HANDLER_KINDS = (StepKind.UPDATE, StepKind.SIGNAL_HANDLER)
STEP_COLUMNS = ("seq", "kind", "name", "status", "result", "error", "attempt", "failure_category", "started_at",
                "finished_at")
SIGNAL_COLUMNS = ("name", "payload", "signal_id", "sequence", "received_at", "consumed_at", "consumed_by_seq")
UPDATE_COLUMNS = ("name", "update_id", "payload", "sequence", "status", "result", "error", "received_at",
                  "applied_seq", "finished_at")

def fork(source_id: Any, from_step: Any, now: datetime, *, workflow_id: str | None = None) -> Workflow:
    """Insert a fork of run ``source_id`` that keeps its journal before step ``from_step`` and executes from
    there. Raises InvalidArgument (naming the step) where a copy would not be sound, WorkflowAlreadyExists if
    ``workflow_id`` has an open run, WorkflowNotRegistered if the source's version is not deployed."""
    if isinstance(from_step, bool) or not isinstance(from_step, int):
        raise InvalidArgument(f"from_step must be an int (a journal position, from 1), got {from_step!r}")
    if workflow_id is not None:
        check_id(workflow_id, "workflow_id")
    with transaction.atomic():
        source = Workflow.objects.select_for_update().filter(pk=source_id).first()
        if source is None:
            raise WorkflowNotFound(f"no workflow run with run id {source_id}; nothing to fork")
        get_workflow(source.workflow_type, version=source.version)  # its journal replays only with that code
        steps = _copied_steps(source, from_step)
        run = _new_run(source, now)
        if workflow_id is not None:
            if Workflow.objects.open().filter(workflow_id=workflow_id).exists():
                raise WorkflowAlreadyExists(f"workflow id {workflow_id!r} already has an open run; fork under "
                                            "another id, or let the fork derive one")
            run.workflow_id = workflow_id
            _insert(run)
        else:
            run.workflow_id = _derived_id(source.workflow_id, from_step, suffixed=False)
            try:
                _insert(run)
            except WorkflowAlreadyExists:  # another fork took the derived id meanwhile
                run.workflow_id = _derived_id(source.workflow_id, from_step, suffixed=True)
                _insert(run)
        _copy_rows(source, run, steps, from_step, now)
    return run


def _copied_steps(source: Workflow, from_step: int) -> list[WorkflowStep]:
    """The journal rows before ``from_step``, refused where copying them would not be sound."""
    end = WorkflowStep.objects.filter(run=source, seq__lt=BRANCH_BASE).aggregate(end=Max("seq"))["end"] or 0
    if not 1 <= from_step <= end + 1:
        raise InvalidArgument(f"from_step={from_step} is outside the journal of run {source.pk}, which ends at step "
                              f"{end}: fork from a step between 1 and {end + 1}")
    by_seq = {step.seq: step for step in WorkflowStep.objects.filter(run=source, seq__lte=from_step)}
    first = by_seq.pop(from_step, None)
    if first is not None and first.kind in HANDLER_KINDS:
        # Handler rows belong to the operation before them (applied before its outcome reached the code): a
        # copy of that outcome without them would not match the state the fork's code has.
        operation = max((seq for seq, step in by_seq.items() if step.kind not in HANDLER_KINDS), default=1)
        after = WorkflowStep.objects.filter(run=source, seq__gt=from_step, seq__lt=BRANCH_BASE).exclude(
            kind__in=HANDLER_KINDS)
        resume = after.aggregate(seq=Min("seq"))["seq"] or end + 1
        raise InvalidArgument(f"cannot fork run {source.pk} from step {from_step}: it is {first.kind} {first.name!r}, "
                              f"applied within step {operation}; fork from step {operation} or {resume}")
    for seq in range(1, from_step):
        step = by_seq.get(seq)
        if step is None:
            why = "has no recorded outcome (a branch that had not settled)"
        elif step.status == StepStatus.WAITING:
            why = (f"({step.kind} {step.name!r}) is still waiting (a sleep, a retry backoff, an async activity, a "
                   "signal or condition wait)")
        elif step.kind == StepKind.CHILD:
            why = f"started child {step.name!r}, which belongs to the source run (the fork would share it)"
        else:
            continue
        raise InvalidArgument(f"cannot fork run {source.pk} from step {from_step}: step {seq} {why}; fork from "
                              f"from_step={seq} or earlier")
    copied = [by_seq[seq] for seq in range(1, from_step)]
    # A branch of workflow code that settled before the fork point keeps its own rows (its block of positions).
    for start in [step.seq for step in copied if step.kind == StepKind.BRANCH]:
        block = branch_block(start)
        copied += list(WorkflowStep.objects.filter(run=source, seq__gt=block, seq__lt=block + BRANCH_SPAN)
                       .order_by("seq"))
    return copied


def _new_run(source: Workflow, now: datetime) -> Workflow:
    # Not the source's parent, schedule, idempotency key or delayed start: a fork is an operator's run of its
    # own. started_at is set, so its first claim reads the copied journal (a run claimed for the first time
    # has none); it gets as long to its execution deadline as the source had from its creation.
    deadline = None if source.execution_deadline is None else now + (source.execution_deadline - source.created_at)
    return Workflow(
        run_id=uuid.uuid4(), workflow_type=source.workflow_type, version=source.version, input=source.input,
        tags=list(source.tags or ()), search_attributes=dict(source.search_attributes or {}),
        restarted_from=source, inbox_seq=source.inbox_seq, runnable_at=now, execution_deadline=deadline,
        created_at=now, started_at=now, updated_at=now,
    )


def _derived_id(workflow_id: str, from_step: int, *, suffixed: bool) -> str:
    """``<id>:fork:<N>``, with a short random suffix if that id has an open run (or ``suffixed``)."""
    suffix = f":fork:{from_step}"
    candidate = workflow_id[:MAX_ID_LENGTH - len(suffix)] + suffix
    if not suffixed and not Workflow.objects.open().filter(workflow_id=candidate).exists():
        return candidate
    suffix += f":{uuid.uuid4().hex[:8]}"
    return workflow_id[:MAX_ID_LENGTH - len(suffix)] + suffix


def _insert(run: Workflow) -> None:
    try:
        with transaction.atomic():  # a savepoint: a lost race leaves the transaction usable
            insert_run(run, delayed_until=None)
    except IntegrityError:
        raise WorkflowAlreadyExists(f"workflow id {run.workflow_id!r} was started concurrently by another "
                                    "caller") from None


def _copy_rows(source: Workflow, run: Workflow, steps: list[WorkflowStep], from_step: int, now: datetime) -> None:
    """The journal rows, and what the copied part of the journal consumed or applied.

    Signals it consumed (and the consumed copies the source kept from the runs before it in its chain) are
    copied as consumed: their payloads are already in the copied rows, so the fork never consumes them again,
    and a sender repeating one (same signal_id) to a fork that took the source's workflow id finds it
    delivered instead of having it consumed a second time by a later wait. Updates it applied are copied for
    the same reason (a repeated update_id gets its reply, not a second application). Signals and updates the
    source took at or after ``from_step``, or has not taken, stay with the source: send them again.
    """
    WorkflowStep.objects.bulk_create([WorkflowStep(run=run, **_values(step, STEP_COLUMNS)) for step in steps])
    consumed = Signal.objects.filter(Q(consumed_by_seq__lt=from_step)
                                     | Q(consumed_by_seq__isnull=True, consumed_at__isnull=False), run=source)
    Signal.objects.bulk_create([Signal(run=run, **_values(s, SIGNAL_COLUMNS)) for s in consumed.order_by("sequence")])
    applied = WorkflowUpdate.objects.filter(run=source, applied_seq__lt=from_step).order_by("sequence")
    WorkflowUpdate.objects.bulk_create([WorkflowUpdate(run=run, **_values(u, UPDATE_COLUMNS)) for u in applied])
    # The indexed search attribute rows come with the run: insert_run writes them from its search_attributes.


def _values(row: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    return {column: getattr(row, column) for column in columns}
