"""Start-with: ``start_or_signal`` (signal-with-start) and ``start_or_update`` (update-with-start), which send
to the open run of a workflow id or start one whose first message it is, in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal, NamedTuple

from django.db import IntegrityError, transaction

from django_weft.common import clock
from django_weft.common.registry import get_workflow
from django_weft.exceptions import InvalidArgument, StartOrSignalConflict, WorkflowClosed
from django_weft.models import RunStatus, Workflow
from django_weft.services import result_waiters, updates
from django_weft.services.client import (
    START_SIGNAL_PREFIX,
    WorkflowHandle,
    check_signal,
    check_terminal_conflict,
    delayed_until,
)
from django_weft.store import inbox, lock_retries, spent_keys, transitions
from django_weft.store.inbox import lock_open_run
from django_weft.store.starts import check_id, prepare_run


class _HandleAndOutcome(NamedTuple):
    handle: WorkflowHandle
    outcome: Literal["started", "signalled"]


class StartOrSignalResult(_HandleAndOutcome):
    """What ``start_or_signal`` did: ``handle``, ``outcome`` (``"started"`` or ``"signalled"``) and
    ``delivered``, False when the signal repeated one this run already has (same ``signal_id``, or the
    same ``idempotency_key``): it was accepted but nothing new was stored.

    Still the ``(handle, outcome)`` pair it always was, so ``handle, outcome = weft.start_or_signal(...)``
    keeps working; ``delivered`` is an attribute beside the pair (not part of tuple equality).
    """

    delivered: bool

    def __new__(cls, handle: WorkflowHandle, outcome: Literal["started", "signalled"],
                delivered: bool = True) -> StartOrSignalResult:
        self = super().__new__(cls, handle, outcome)
        self.delivered = delivered
        return self

    def __repr__(self) -> str:
        return f"StartOrSignalResult(handle={self.handle!r}, outcome={self.outcome!r}, delivered={self.delivered!r})"


START_OPTIONS = frozenset({"start_at", "start_after", "execution_timeout", "tags", "search_attributes", "queue",
                           "concurrency_key", "priority"})
RACE_RETRIES = 5


def start_or_signal(
    workflow: str | Callable[..., Any],
    input: Any = None,
    *,
    signal: str,
    payload: Any = None,
    signal_id: str | None = None,
    workflow_id: str | None = None,
    idempotency_key: str | None = None,
    on_terminal_conflict: str = "error",
    **start_options: Any,
) -> StartOrSignalResult:
    """Signal the open run of the workflow, or start one whose first signal this is (signal-with-start).

    The new run and its first signal commit together, and the first signal is consumed before any
    later one. Pass exactly one of ``signal_id`` (with ``workflow_id``, concurrent callers converge on
    one run and one signal) or ``idempotency_key`` (it names the run; the signal id is derived from it).
    A finished target raises StartOrSignalConflict, unless ``on_terminal_conflict="start_new"`` with an
    explicit ``workflow_id`` and ``signal_id`` starts a new run that records ``restarted_from``; a key whose run
    was purged raises IdempotencyKeyPurged.
    """
    definition = get_workflow(workflow)
    _check_start_options(start_options, "start_or_signal")
    if (signal_id is None) == (idempotency_key is None):
        raise InvalidArgument("start_or_signal needs exactly one of signal_id and idempotency_key")
    check_terminal_conflict(on_terminal_conflict, workflow_id)
    if on_terminal_conflict == "start_new" and signal_id is None:
        raise InvalidArgument('on_terminal_conflict="start_new" needs a signal_id')
    if idempotency_key is not None:
        check_id(idempotency_key, "idempotency_key")
        signal_id = START_SIGNAL_PREFIX + idempotency_key
    data = check_signal(signal, payload, signal_id)
    run = prepare_run(definition, input, workflow_id=workflow_id, idempotency_key=idempotency_key,
                      **start_options)

    # Rounds of lookup then insert; on MySQL/MariaDB racing inserts of one key can also end in an InnoDB
    # deadlock, after which (outside a caller's transaction) all the rounds start again.
    def rounds() -> StartOrSignalResult:
        for _ in range(RACE_RETRIES):
            with transaction.atomic():
                if idempotency_key is not None:
                    target = Workflow.objects.select_for_update().filter(idempotency_key=idempotency_key).first()
                    if target is not None and target.status == RunStatus.CONTINUED:  # the chain it started
                        tail = Workflow.objects.end_of_chain(target)
                        target = Workflow.objects.select_for_update().filter(pk=tail.pk).first()
                elif workflow_id is not None:
                    target = lock_open_run(workflow_id)
                    if target is None:
                        target = Workflow.objects.latest_for(workflow_id).first()
                        if target is not None and not target.is_finished:
                            continue  # opened since the locked lookup: lock it in the next round
                else:
                    target = None
                if target is not None and not target.is_finished:
                    delivered = inbox.deliver_signal(target, signal, data, signal_id, clock.now())
                    return StartOrSignalResult(WorkflowHandle(target.workflow_id, target.run_id), "signalled",
                                               delivered)
                if target is None and idempotency_key is not None:
                    spent_keys.refuse_if_spent(idempotency_key)
                if target is not None:
                    if idempotency_key is not None or on_terminal_conflict == "error":
                        raise StartOrSignalConflict(
                            f"workflow {target.workflow_id!r} already finished ({target.status}, run "
                            f"{target.run_id}); pass on_terminal_conflict=\"start_new\" with a workflow_id and "
                            "signal_id to start a new run"
                        )
                    run.restarted_from = target
                try:
                    # The run and its first signal commit together; a concurrent winner makes the insert
                    # fail (after waiting for its commit), and the next round signals the winner's run.
                    with transaction.atomic():
                        transitions.insert_run(run, delayed_until=delayed_until(run))
                        inbox.deliver_signal(run, signal, data, signal_id, clock.now())
                    return StartOrSignalResult(WorkflowHandle(run.workflow_id, run.run_id), "started")
                except IntegrityError:
                    run.restarted_from = None
        raise StartOrSignalConflict(
            f"start_or_signal lost {RACE_RETRIES} races for {workflow_id or idempotency_key!r}; try again"
        )

    return lock_retries.retried("start_or_signal", rounds)


class StartOrUpdateResult(NamedTuple):
    """What ``start_or_update`` did: ``handle``, ``outcome`` (``"started"`` or ``"updated"``) and ``result``,
    the update handler's reply."""

    handle: WorkflowHandle
    outcome: Literal["started", "updated"]
    result: Any


def start_or_update(
    workflow: str | Callable[..., Any],
    input: Any = None,
    *,
    update: str,
    payload: Any = None,
    update_id: str | None = None,
    workflow_id: str,
    timeout: float | timedelta | None = None,
    on_terminal_conflict: str = "error",
    **start_options: Any,
) -> StartOrUpdateResult:
    """Send update ``update`` to the open run of ``workflow_id``, or start one whose first update it is (the
    run and its update commit together), and wait for the reply (update-with-start).

    The update is validated first, against the open run's replayed state or the new run's code (nothing is
    written if it is rejected). A finished target raises WorkflowClosed, unless
    ``on_terminal_conflict="start_new"`` starts a new run that records ``restarted_from``. With the same
    ``update_id``, concurrent and repeated callers converge on one run and one update, and get its reply.
    """
    definition = get_workflow(workflow)
    _check_start_options(start_options, "start_or_update")
    check_id(workflow_id, "workflow_id")
    check_terminal_conflict(on_terminal_conflict, workflow_id)
    data, update_id = updates.check_update(update, payload, update_id)
    updates.check_timeout(timeout)
    if result_waiters.driver_here() is None:
        updates.refuse_waiting_in_transaction("start_or_update()")
    for _ in range(RACE_RETRIES):
        target = Workflow.objects.latest_for(workflow_id).first()
        repeat = None if target is None else updates.existing_update(target, update, update_id)
        if target is not None and repeat is not None:  # the same update_id again: its reply, even once finished
            return StartOrUpdateResult(WorkflowHandle(target.workflow_id, target.run_id), "updated",
                                       updates.UpdateHandle(target.workflow_id, repeat).result(timeout))
        if target is not None and not target.is_finished:
            try:
                sent = updates.send_checked(target.pk, update, payload, data, update_id)
            except WorkflowClosed:
                continue  # it finished meanwhile: look again
            return StartOrUpdateResult(WorkflowHandle(target.workflow_id, target.run_id), "updated",
                                       sent.result(timeout))
        if target is not None and on_terminal_conflict == "error":
            raise WorkflowClosed(
                f"workflow {workflow_id!r} already finished ({target.status}, run {target.run_id}); pass "
                'on_terminal_conflict="start_new" to start a new run')
        run = prepare_run(definition, input, workflow_id=workflow_id, **start_options)
        run.restarted_from = target
        updates.validate(run, update, payload, fresh=True)
        try:
            with transaction.atomic():
                transitions.insert_run(run, delayed_until=delayed_until(run))
                record, _ = inbox.deliver_update(run, update, data, update_id, clock.now())
        except IntegrityError:
            continue  # a concurrent caller started the run: the next round updates it
        handle = WorkflowHandle(run.workflow_id, run.run_id)
        return StartOrUpdateResult(handle, "started", updates.UpdateHandle(run.workflow_id, record).result(timeout))
    raise StartOrSignalConflict(f"start_or_update lost {RACE_RETRIES} races for {workflow_id!r}; try again")


def _check_start_options(start_options: dict[str, Any], what: str) -> None:
    unknown = set(start_options) - START_OPTIONS
    if unknown:
        raise InvalidArgument(f"{what} got unknown option(s) {sorted(unknown)}; start options are "
                              f"{sorted(START_OPTIONS)}")
