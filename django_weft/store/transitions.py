"""A run's transitions: the executor's (claim, commit, park, finish, release) and the external ones (cancel,
time out), with the table of which status may follow which. The other operators' transitions (``repairs``,
``terminations``) and the one-statement forms (``claim_statement``, ``signal_statement``) make the same moves;
together, :mod:`django_weft.store` is the only code that writes a run's status, lease and fence.

Every function is one transaction over one run row (or one page of rows for claims):

* executor writes (step commits, parking, completion) are compare-and-set ``UPDATE``s on
  ``(run_id, fence, status='running')``; the UPDATE takes the row lock for the rest of the transaction,
  and zero rows updated means the run was taken away, so the write is refused with FencingError;
* external transitions (cancel, suspend, resume, time out) lock the row with ``select_for_update()``,
  check the transition table, and bump ``fence`` so the executor holding the run loses it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import router, transaction
from django.db.models import Case, F, Value, When

from django_weft import signals
from django_weft.common.registry import get_workflow
from django_weft.conf import weft_settings
from django_weft.exceptions import FencingError, TransitionNotAllowed, WorkflowNotFound, WorkflowNotRegistered
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    FailureCategory,
    ParentClosePolicy,
    RunStatus,
    Schedule,
    Signal,
    Timer,
    UpdateStatus,
    Workflow,
    WorkflowUpdate,
)
from django_weft.observability import events
from django_weft.store import (
    activity_slots,
    admissions,
    claim_statement,
    inbox,
    journal,
    lock_retries,
    search_rows,
    wakeups,
)
from django_weft.store.leases import lease_expiry as _lease_expiry

logger = logging.getLogger("django_weft.transitions")

S = RunStatus
ALLOWED: dict[str, frozenset[str]] = {
    # Admission (store/admissions) makes a queued run pending; until then it can only be ended.
    S.QUEUED: frozenset({S.PENDING, S.CANCELLED, S.TIMED_OUT}),
    S.PENDING: frozenset({S.RUNNING, S.SUSPENDED, S.CANCELLED, S.TIMED_OUT}),
    S.RUNNING: frozenset({S.RUNNING, S.WAITING, S.SUSPENDED, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT}),
    S.WAITING: frozenset({S.RUNNING, S.SUSPENDED, S.CANCELLED, S.TIMED_OUT}),
    S.SUSPENDED: frozenset({S.PENDING, S.RUNNING, S.CANCELLED, S.TIMED_OUT}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
    S.CONTINUED: frozenset(),
}

FINISH_SIGNALS: dict[str, Any] = {
    S.COMPLETED: signals.workflow_completed,
    S.FAILED: signals.workflow_failed,
    S.CANCELLED: signals.workflow_cancelled,
    S.TIMED_OUT: signals.workflow_timed_out,
}

# termination_reason of the runs the engine ends (the executor's own ones are in runtime/executor.py).
CANCEL_REQUESTED = "cancel_requested"  # handle.cancel, weft.cancel, the admin
PARENT_CLOSED = "parent_closed"  # its parent closed (or continued as new): parent_close_policy
RACE_LOST = "race_lost"  # its branch of its parent's ctx.race lost
PARENT_CANCEL_REQUESTED = "parent_cancel_requested"  # a cancel by its parent, taken up when it next parks
EXECUTION_TIMEOUT = "execution_timeout"
CLEANUP_TIMEOUT = "cleanup_timeout"  # a cancelled run's cleanup ran past its cleanup_timeout: terminated
SCHEDULE_OVERLAP = "schedule_overlap"  # its schedule's overlap policy cancel_other started the next run


def _child_transition(write: journal.InsertChild | journal.CancelChild) -> None:
    """A parent's commit that starts or cancels a child: the child's own transition."""
    if isinstance(write, journal.InsertChild):
        insert_run(write.run, delayed_until=None)
    else:
        cancel_child(write.run_id, write.at, write.reason, write.policy)


def can_transition(current: str, target: str) -> bool:
    return target in ALLOWED[current]


# --- creating runs -----------------------------------------------------------------------------------


def insert_run(run: Workflow, *, delayed_until: datetime | None) -> Workflow:
    """Insert a new run (inside the caller's transaction). Pending until claimed; or, prepared queued (see
    store/starts), queued until its queue admits it, which a pass after the commit tries at once."""
    if run.status == S.QUEUED:
        journal.insert_row(run)
        search_rows.insert_for(run)
        admissions.admit_after_commit(run.queue)
        events.run_event(signals.workflow_started, run)
        return run
    run.status = S.PENDING
    journal.insert_row(run)
    search_rows.insert_for(run)
    if delayed_until is not None:
        Timer.objects.create(run=run, purpose="delayed_start", fire_at=delayed_until)
    wakeups.runnable(run.pk, run.runnable_at or run.created_at, run.created_at)
    events.run_event(signals.workflow_started, run)
    return run


def insert_claimed_run(run: Workflow, owner: str) -> Claim:
    """Insert a new run already claimed by ``owner`` (its start and its claim in one write): the caller
    executes it next, so no executor is woken. Its lease expires as a claimed run's does, so the run is taken
    over if the caller dies."""
    now = run.created_at
    run.status, run.fence, run.lease_owner = S.RUNNING, 1, owner
    run.started_at, run.runnable_at = now, _lease_expiry(now)
    journal.insert_row(run)
    search_rows.insert_for(run)
    events.run_event(signals.workflow_started, run)
    return Claim(run=run, fence=run.fence, owner=owner, previous_status=S.PENDING, fresh=True,
                 inbox_seen=run.inbox_seq, lease_until=run.runnable_at)


# --- claims, leases and executor writes --------------------------------------------------------------


@dataclass(eq=False)  # identity semantics: claims live in sets while held
class Claim:
    """An executor's hold on one run: valid while the run's fence still equals ``fence``."""

    run: Workflow
    fence: int
    owner: str
    previous_status: str
    previous_owner: str = ""
    # The run's inbox_seq when claimed: a park that finds it moved wakes the run at once.
    inbox_seen: int = 0
    # The run started children, so closing it must apply their parent close policy; or its code takes
    # updates, so closing it must fail those it did not apply.
    has_dependents: bool = False
    # Steps whose slot of a limited activity this execution asked for and has not given back: closing the run
    # with one of them drops it (activity_slots.forget_run).
    slot_seqs: set[int] = field(default_factory=set)
    lost: bool = False
    # Its cancel was requested (when claimed, or since: the lease keeper's renewal reads it).
    cancel_requested: bool = False
    # First claim ever (started_at was unset): the run has no journal to read yet.
    fresh: bool = False
    # Writes folded into the run's next fenced commit (a fired timer, a step result), costing no commit.
    deferred: list[journal.JournalWrite] = field(default_factory=list)
    # When the lease this executor wrote last runs out (the run's runnable_at while it is held).
    lease_until: datetime | None = None


@lock_retries.retrying("claim")
def claim(owner: str, now: datetime, limit: int, *, run_id: Any = None,
          queues: list[str] | None = None) -> list[Claim]:
    """Take up to ``limit`` runnable runs (due timers, delayed starts, expired leases) for ``owner``;
    with ``run_id``, that run only, if it is runnable; with ``queues``, runs of those queues only ("" for
    runs of no queue)."""
    lease = _lease_expiry(now)
    claimed = claim_statement.claim_in_one_statement(owner, now, limit, run_id, lease, queues)
    if claimed is None:
        claimed = claim_statement.claim_with_the_orm(owner, now, limit, run_id, lease, queues)
    return [Claim(run=row, fence=row.fence, owner=owner, previous_status=previous, previous_owner=previous_owner,
                  fresh=fresh, inbox_seen=row.inbox_seq, lease_until=lease,
                  cancel_requested=row.cancel_requested_at is not None)
            for row, previous, previous_owner, fresh in claimed]


def _refused(claim: Claim) -> FencingError:
    claim.lost = True
    return FencingError(
        f"run {claim.run.pk} was taken from this executor (cancelled, suspended, timed out or "
        "re-claimed after its lease expired); the write was refused"
    )


def _fenced_write(claim: Claim, now: datetime, writes: Sequence[journal.JournalWrite] = (), *,
                  closing: str | None = None, **fields: Any) -> None:
    """Update the held run and apply journal writes (the deferred ones first) if the fence holds.

    ``closing`` (a terminal status) also runs the close hooks: children, async records, the parent.
    """
    pending = [*claim.deferred, *writes]
    claim.deferred = []
    fields["updated_at"] = now
    run = claim.run
    touches_others = closing is not None and (
        run.parent_id is not None or run.schedule_id is not None or claim.has_dependents or bool(claim.slot_seqs)
    )
    if not touches_others:
        fast = journal.write_in_one_statement(run.pk, claim.fence, S.RUNNING, fields, pending)
        if fast is False:
            raise _refused(claim)
        if fast is True:  # committed: one statement, outside any transaction
            journal.announce(run, pending, committed=True)
            if closing is not None and run.queue:
                admissions.admit_after_commit(run.queue)  # its slot is free
            return
    with transaction.atomic():
        if touches_others:
            _lock_owners(run.schedule_id, run.parent_id)
        updated = Workflow.objects.filter(pk=run.pk, fence=claim.fence, status=S.RUNNING).update(**fields)
        if updated == 0:
            raise _refused(claim)
        journal.apply(pending, _child_transition)
        journal.announce(run, pending)
        if closing is not None and touches_others:
            run.status = closing
            _after_close(run, now)
        elif closing is not None and run.queue:
            admissions.admit_after_commit(run.queue)


@lock_retries.retrying_held("commit")
def commit(claim: Claim, now: datetime, writes: Sequence[journal.JournalWrite] = ()) -> None:
    """Commit journal writes for a run this executor holds, in one transaction, renewing its lease once a third
    of it has passed (the lease keeper renews it too; a commit that leaves the indexed runnable_at alone is a
    HOT update on PostgreSQL, adding no entry to the run table's indexes)."""
    left = None if claim.lease_until is None else (claim.lease_until - now).total_seconds()
    if left is None or left < weft_settings.LEASE_SECONDS * 2 / 3:
        lease = _lease_expiry(now)
        _fenced_write(claim, now, writes, runnable_at=lease)
        claim.lease_until = lease
    else:
        _fenced_write(claim, now, writes)


@lock_retries.retrying_held("transaction")
def commit_transaction(claim: Claim, now: datetime, work: Callable[[], Sequence[journal.JournalWrite]]) -> None:
    """A ``@weft.transaction`` step: in one transaction, the fenced run update (its row lock holds off every other
    writer of the run until the commit), the deferred writes, then ``work()`` (the step's function and the rows
    that record it, which it returns). Nothing of it commits if the fence moved or ``work`` raises (the deferred
    writes are given back to the claim); a deadlock or serialisation failure runs all of it again, ``work``
    included, in a new transaction."""
    pending = [*claim.deferred]
    lease = _lease_expiry(now)
    run = claim.run
    try:
        with transaction.atomic(using=router.db_for_write(Workflow)):
            updated = Workflow.objects.filter(pk=run.pk, fence=claim.fence, status=S.RUNNING).update(
                updated_at=now, runnable_at=lease)
            if updated == 0:
                raise _refused(claim)
            journal.apply(pending, _child_transition)
            writes = work()
            journal.apply(writes, _child_transition)
            journal.announce(run, [*pending, *writes])
    except BaseException:
        claim.deferred = pending
        raise
    claim.deferred = []
    claim.lease_until = lease


@lock_retries.retrying_held("park")
def park(claim: Claim, now: datetime, *, wake_at: datetime | None, reason: str,
         writes: Sequence[journal.JournalWrite] = (), awaiting_signals: Sequence[str] = ()) -> None:
    """Park the run (waiting) until ``wake_at`` or until something external wakes it.

    An event that reached the run's inbox after it was claimed (a signal, an async completion, a
    finished child) may not have been seen by the replay, so it makes the run runnable at once.
    """
    runnable_at = Case(When(inbox_seq__gt=claim.inbox_seen, then=Value(now)), default=Value(wake_at))
    with transaction.atomic():
        if claim.run.parent_id is not None:
            _lock_owners(claim.run.schedule_id, claim.run.parent_id)
        _fenced_write(claim, now, writes, status=S.WAITING, runnable_at=runnable_at, wait_reason=reason[:255],
                      lease_owner="", awaiting_signals=list(awaiting_signals))
        if wake_at is not None:
            wakeups.runnable(claim.run.pk, wake_at, now)
        if wakeups.celery_executes() and Workflow.objects.filter(
            pk=claim.run.pk, inbox_seq__gt=claim.inbox_seen
        ).exists():
            # Woken while it replayed. A loop's executor claims again at once and finds it; a Celery task
            # has ended, so another is sent.
            wakeups.runnable(claim.run.pk, now, now)


@lock_retries.retrying_held("finish")
def finish(claim: Claim, now: datetime, status: str, *, result: bytes | None = None,
           error: dict | None = None, failure_category: str = "", termination_reason: str = "") -> None:
    """Complete, fail, cancel or time out a run this executor holds."""
    assert status in (S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT), status
    _fenced_write(claim, now, closing=status, status=status, result=result, error=error, runnable_at=None,
                  lease_owner="", wait_reason="", finished_at=now, awaiting_signals=[],
                  failure_category=failure_category, termination_reason=termination_reason)
    run = claim.run
    run.status, run.result, run.error, run.finished_at = status, result, error, now
    run.failure_category, run.termination_reason = failure_category, termination_reason
    events.run_event(FINISH_SIGNALS[status], run)


@lock_retries.retrying_held("continue_as_new")
def continue_as_new(claim: Claim, now: datetime, following: Workflow) -> None:
    """End the held run as continued and insert ``following`` (the next run of its workflow id) in one
    transaction. Signals it has not consumed move to the new run, which takes over its inbox sequence (so
    they stay first) and its place as its schedule's current run; the schedule's buffer is not drained,
    because the chain is still open."""
    run = claim.run
    with transaction.atomic():
        _lock_owners(run.schedule_id, run.parent_id)
        _fenced_write(claim, now, status=S.CONTINUED, runnable_at=None, lease_owner="", wait_reason="",
                      finished_at=now, awaiting_signals=[])
        inbox_seq, cancel_requested_at, cancel_reason, deadline, cancel_text = Workflow.objects.filter(
            pk=run.pk).values_list("inbox_seq", "cancel_requested_at", "termination_reason", "execution_deadline",
                                   "cancel_reason").get()
        following.inbox_seq = inbox_seq
        # A cancel request that reached the run while it executed (and why it was made), and its execution
        # deadline, hold for the chain.
        following.cancel_requested_at = cancel_requested_at
        following.cancel_reason = cancel_text
        following.execution_deadline = deadline
        if cancel_reason:
            following.termination_reason = cancel_reason
            Workflow.objects.filter(pk=run.pk).update(termination_reason="")
        insert_run(following, delayed_until=None)
        Timer.objects.filter(run_id=run.pk, fired_at__isnull=True).delete()
        Signal.objects.filter(run_id=run.pk, consumed_at__isnull=True).update(run=following)
        WorkflowUpdate.objects.filter(run_id=run.pk, status=UpdateStatus.PENDING).update(run=following)
        # A handler still running (it waits) ends with the run: its caller is told (wait with
        # ctx.wait_condition(ctx.all_handlers_finished) before continuing as new).
        inbox.fail_pending_updates(run, now, why="the run continued as new before the update's handler returned")
        # A sender that retries a signal this run consumed (same signal_id) must find it delivered: the
        # successor keeps a consumed copy of each (the ids of one run, so the chain's cost stays flat).
        Signal.objects.bulk_create([
            Signal(run=following, name=name, signal_id=signal_id, sequence=sequence, received_at=received_at,
                   consumed_at=consumed_at)
            for name, signal_id, sequence, received_at, consumed_at in Signal.objects.filter(
                run_id=run.pk, consumed_at__isnull=False, signal_id__isnull=False,
            ).values_list("name", "signal_id", "sequence", "received_at", "consumed_at")
        ])
        AsyncActivity.objects.filter(run=run, status=AsyncStatus.PENDING).update(
            status=AsyncStatus.CANCELLED, resolved_at=now
        )
        _close_children(run, now, f"parent run {run.pk} of {run.workflow_id!r} continued as new")
        activity_slots.forget_run(run.pk)
        if run.schedule_id is not None:
            Schedule.objects.filter(pk=run.schedule_id, current_run_id=run.pk).update(current_run=following)
    run.status, run.finished_at = S.CONTINUED, now


@lock_retries.retrying_held("note_recovery")
def note_recovery(claim: Claim, now: datetime, recoveries: int, mark: int) -> None:
    """Count a takeover of the held run (its last executor died) at journal length ``mark``."""
    lease = _lease_expiry(now)
    _fenced_write(claim, now, recoveries=recoveries, recovery_mark=mark, runnable_at=lease)
    claim.lease_until = lease


@lock_retries.retrying_held("release")
def release(claim: Claim, now: datetime, *, retry_at: datetime | None = None, reason: str = "") -> bool:
    """Give a held run back so any executor can take it at ``retry_at`` (default: now)."""
    try:
        _fenced_write(claim, now, runnable_at=retry_at or now, lease_owner="", wait_reason=reason[:255])
    except FencingError:
        return False
    wakeups.runnable(claim.run.pk, retry_at or now, now)
    return True


def hold(claim: Claim, now: datetime, *, retry_at: datetime, reason: str) -> bool:
    """The run's code raised and its workflow holds such runs (on_error="hold"): give it back, to be tried again at
    ``retry_at`` (or when a process starts: wake_held_runs), counting the hold. False if it was taken."""
    try:
        _fenced_write(claim, now, runnable_at=retry_at, lease_owner="", wait_reason=reason[:255],
                      code_errors=F("code_errors") + 1)
    except FencingError:
        return False
    wakeups.runnable(claim.run.pk, retry_at, now)
    return True


def wake_held_runs(now: datetime) -> int:
    """A process starts (perhaps with a deploy that fixes their code): runs held because their code raised are
    tried again now. Returns how many."""
    return Workflow.objects.filter(status=S.RUNNING, lease_owner="", code_errors__gt=0, runnable_at__gt=now).update(
        runnable_at=now, updated_at=now)


# --- external transitions ----------------------------------------------------------------------------


def locked_run(run_id: Any) -> Workflow:
    try:
        return Workflow.objects.select_for_update().get(pk=run_id)
    except Workflow.DoesNotExist:
        raise WorkflowNotFound(f"no workflow run with run id {run_id}") from None


def _lock_owners(schedule_id: Any, parent_id: Any) -> None:
    # Locks are always taken schedule, then parent, then the run itself: closing a run drains its
    # schedule's buffer and wakes its parent; a schedule tick and a parent's close act on their runs.
    # One order everywhere means none of them can deadlock another.
    if schedule_id is not None:
        list(Schedule.objects.select_for_update().filter(pk=schedule_id).values_list("pk"))
    if parent_id is not None:
        list(Workflow.objects.select_for_update().filter(pk=parent_id).values_list("pk"))


def locked_with_owners(run_id: Any) -> Workflow:
    owners = Workflow.objects.filter(pk=run_id).values_list("schedule_id", "parent_id").first()
    if owners is not None:
        _lock_owners(*owners)
    return locked_run(run_id)


def cancel_error(reason: str) -> dict:
    """The error of a cancelled run (``reason``: why its cancel was requested)."""
    return {"type": "Cancelled", "message": reason or "cancelled"}


# Called, inside the closing transaction, when a run started by a schedule closes: django_weft.services.schedules
# registers the overlap policies' buffer drain here (the state writer never imports a service).
_schedule_run_closed: list[Callable[[Workflow, datetime], None]] = []


def on_schedule_run_closed(hook: Callable[[Workflow, datetime], None]) -> None:
    if hook not in _schedule_run_closed:
        _schedule_run_closed.append(hook)


def _after_close(run: Workflow, now: datetime) -> None:
    """What closing a run means for others: its async tokens die, its children follow their policy,
    and its parent (which may wait for it) wakes."""
    AsyncActivity.objects.filter(run=run, status=AsyncStatus.PENDING).update(
        status=AsyncStatus.CANCELLED, resolved_at=now
    )
    inbox.fail_pending_updates(run, now)
    _close_children(run, now, f"parent run {run.pk} of {run.workflow_id!r} closed ({run.status})")
    if run.parent_id is not None:
        parent = Workflow.objects.filter(pk=run.parent_id).only("pk", "status", "inbox_seq").first()
        if parent is not None and not parent.is_finished:
            inbox.record_event(parent, now, wakes=True)
    if run.schedule_id is not None:
        for hook in _schedule_run_closed:
            hook(run, now)
    if run.queue:
        admissions.admit_after_commit(run.queue)  # its slot is free
    activity_slots.forget_run(run.pk)  # and those of its limited activities


def _close_children(run: Workflow, now: datetime, reason: str) -> None:
    """The open children of a closing run follow their parent_close_policy."""
    children = Workflow.objects.open().filter(parent=run).exclude(parent_close_policy=ParentClosePolicy.ABANDON)
    for child in children.select_for_update().order_by("pk"):
        if child.parent_close_policy == ParentClosePolicy.TERMINATE:
            close_from_outside(child, S.CANCELLED, now, cancel_error(f"terminated: {reason}"),
                               termination_reason=PARENT_CLOSED)
        else:
            _request_cancel(child, now, f"cancel requested: {reason}", PARENT_CLOSED)


def cancel_child(run_id: Any, now: datetime, reason: str, policy: str, termination_reason: str = RACE_LOST) -> None:
    """Inside the parent's fenced commit (the parent row is locked): close a child by ``policy`` (its branch
    lost a race)."""
    child = Workflow.objects.end_of_chain(Workflow.objects.filter(pk=run_id).first())  # it may have continued
    child = Workflow.objects.select_for_update().filter(pk=child.pk).first() if child is not None else None
    if child is None or child.is_finished:
        return
    if policy == ParentClosePolicy.TERMINATE:
        close_from_outside(child, S.CANCELLED, now, cancel_error(f"terminated: {reason}"),
                           termination_reason=termination_reason)
    else:
        _request_cancel(child, now, f"cancel requested: {reason}", termination_reason)


def _request_cancel(run: Workflow, now: datetime, reason: str, termination_reason: str) -> None:
    """Request the cancel of ``run`` (locked): its code sees weft.CancelledError where it waits (or at its next
    durable call) and may clean up until the request + its cleanup_timeout, after which it is terminated. A run
    whose code has not run yet (pending, never started) or is paused by an operator (suspended) has nothing to
    clean up and is cancelled at once, as is a queued one. A second request changes nothing."""
    if run.cancel_requested_at is not None:
        return
    if run.status in (S.SUSPENDED, S.QUEUED) or (run.status == S.PENDING and run.started_at is None):
        close_from_outside(run, S.CANCELLED, now, cancel_error(reason), termination_reason=termination_reason)
        return
    # An activity it waits to begin will not begin now (its cleanup asks again): it leaves the line.
    activity_slots.forget_run(run.pk, waiting_only=True)
    deadline = now + timedelta(seconds=_cleanup_timeout(run))
    if run.execution_deadline is not None:
        deadline = min(deadline, run.execution_deadline)
    Workflow.objects.filter(pk=run.pk).update(cancel_requested_at=now, cancel_reason=reason,
                                              termination_reason=termination_reason, execution_deadline=deadline)
    run.cancel_requested_at, run.cancel_reason, run.termination_reason = now, reason, termination_reason
    run.execution_deadline = deadline
    # Wakes it if it waits; an executor holding it finds the inbox moved when it parks, and its lease keeper
    # tells the running code (at once in this process, after the commit; elsewhere at its next renewal).
    inbox.record_event(run, now, wakes=True)
    if run.status == S.RUNNING and _cancel_requested_hooks:
        run_id = run.pk
        transaction.on_commit(lambda: [hook(run_id) for hook in _cancel_requested_hooks],
                              using=router.db_for_write(Workflow))
    if run.status == S.WAITING:
        Workflow.objects.filter(pk=run.pk).update(runnable_at=now)


# Told (after the commit) of a cancel requested for a run some executor holds: runtime.lease_keeper registers
# the hook that marks the claims this process holds (the state writer never imports the runtime).
_cancel_requested_hooks: list[Callable[[Any], None]] = []


def on_cancel_requested(hook: Callable[[Any], None]) -> None:
    if hook not in _cancel_requested_hooks:
        _cancel_requested_hooks.append(hook)


def _cleanup_timeout(run: Workflow) -> float:
    try:
        seconds = get_workflow(run.workflow_type, version=run.version).cleanup_timeout
    except WorkflowNotRegistered:
        seconds = None
    return float(weft_settings.CLEANUP_TIMEOUT) if seconds is None else seconds


def check_transition(run: Workflow, target: str) -> None:
    if not can_transition(run.status, target):
        raise TransitionNotAllowed(
            f"run {run.pk} of {run.workflow_id!r} is {run.status}; it cannot become {target}"
        )


def close_from_outside(run: Workflow, status: str, now: datetime, error: dict, *, termination_reason: str,
                       category: str = "") -> None:
    """End ``run`` (locked) from outside its executor: cancelled, or timed out (``category``: its own)."""
    category = category or (FailureCategory.CANCELLATION if status == S.CANCELLED else FailureCategory.TIMEOUT)
    Workflow.objects.filter(pk=run.pk).update(
        status=status, fence=F("fence") + 1, runnable_at=None, lease_owner="", wait_reason="",
        finished_at=now, updated_at=now, error=error, failure_category=category,
        termination_reason=termination_reason,
    )
    Timer.objects.filter(run=run, fired_at__isnull=True).delete()
    run.status, run.finished_at, run.error, run.fence = status, now, error, run.fence + 1
    run.failure_category, run.termination_reason = category, termination_reason
    _after_close(run, now)
    events.run_event(FINISH_SIGNALS[status], run)


@lock_retries.retrying("cancel")
def cancel(run_id: Any, now: datetime, reason: str = "", *, termination_reason: str = CANCEL_REQUESTED) -> bool:
    """Request the cancel of a run (see _request_cancel). False if nothing changed: it had finished, or its cancel
    was requested before."""
    with transaction.atomic():
        run = locked_with_owners(run_id)
        if run.is_finished or run.cancel_requested_at is not None:
            return False
        _request_cancel(run, now, reason, termination_reason)
    return True


@lock_retries.retrying("time_out")
def time_out(run_id: Any, now: datetime) -> bool:
    with transaction.atomic():
        run = locked_with_owners(run_id)
        if run.is_finished or run.execution_deadline is None or run.execution_deadline > now:
            return False
        if run.cancel_requested_at is not None:  # a cancelled run's cleanup took too long
            close_from_outside(run, S.TIMED_OUT, now, {
                "type": "Terminated",
                "message": "terminated: the cleanup after the cancel requested at "
                           f"{run.cancel_requested_at.isoformat()} ran past its cleanup_timeout "
                           f"({run.execution_deadline.isoformat()})",
                "reason": run.cancel_reason,
            }, termination_reason=CLEANUP_TIMEOUT, category=FailureCategory.CANCELLATION)
            return True
        close_from_outside(run, S.TIMED_OUT, now, {
            "type": "TimedOut",
            "message": f"execution timeout reached at {run.execution_deadline.isoformat()}",
        }, termination_reason=EXECUTION_TIMEOUT)
    return True
