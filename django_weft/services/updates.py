"""Updates: requests with a reply, sent to a running workflow (``handle.update``, ``handle.start_update``).

Admission happens in the caller, before anything is written: the run's state is rebuilt by a dry replay (as
for a query), the code must register a handler of that name, and its validator (if any) must accept the
payload. Then the update is stored under the run's lock, numbered in the run's inbox with its signals, and
the run is woken if it waits. The run applies it between two operations (runtime/replay/inbox.py) and
stores the reply, which :meth:`UpdateHandle.result` waits for: woken by LISTEN/NOTIFY on PostgreSQL,
polling elsewhere.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connections, router, transaction

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.durations import to_seconds
from django_weft.exceptions import (
    InvalidArgument,
    UpdateFailed,
    UpdateNotHandled,
    UpdateRejected,
    WorkflowClosed,
    WorkflowNotFound,
)
from django_weft.models import RunStatus, UpdateStatus, Workflow, WorkflowUpdate
from django_weft.runtime.context import Context
from django_weft.services import queries, replay_cache, result_waiters
from django_weft.services.notices import Listener
from django_weft.store import inbox, transitions
from django_weft.store.starts import check_id, check_opaque_id
from django_weft.store.wakeups import UPDATE_CHANNEL

logger = logging.getLogger("django_weft.updates")

MAX_UPDATE_ID_BYTES = 128
# How long a poll waits at most between two looks at the reply (the first looks are sooner).
MAX_POLL_SECONDS = 0.2


class UpdateHandle:
    """An update the run accepted: ``update_id``, and ``result()`` to wait for the reply."""

    def __init__(self, workflow_id: str, update: WorkflowUpdate) -> None:
        self.workflow_id = workflow_id
        self.update_id = update.update_id
        self.name = update.name
        self._pk = update.pk

    def __repr__(self) -> str:
        return f"<UpdateHandle {self.name!r} {self.update_id!r} of {self.workflow_id!r}>"

    @property
    def status(self) -> str:
        """``pending``, ``completed`` or ``failed`` (read from the database on every access)."""
        return self._record().status

    def result(self, timeout: float | timedelta | None = None) -> Any:
        """Wait for the run to apply the update and return the handler's reply.

        Raises UpdateFailed if the handler raised (the run goes on) or the run ended before applying it,
        and TimeoutError if ``timeout`` seconds pass first (the update stays accepted and is applied later;
        ``start_update`` with the same ``update_id`` returns this update again)."""
        seconds = check_timeout(timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        driver = result_waiters.driver_here()  # inside the test environment: it moves the run on, whatever the timeout
        if driver is None:
            refuse_waiting_in_transaction("UpdateHandle.result()", stores=False)
        alias = router.db_for_write(WorkflowUpdate)  # where the executor's NOTIFY is sent
        with Listener(alias, UPDATE_CHANNEL, {str(self._pk)}, listen=driver is None) as listener:
            delay = 0.005
            while True:
                record = self._record()
                if record.status not in UpdateStatus.open_values():
                    return _reply(record)
                if record.run.is_finished and record.run.status != RunStatus.CONTINUED:
                    raise UpdateFailed(f"update {self.name!r} ({self.update_id!r}) was not applied: run "
                                       f"{record.run_id} ended ({record.run.status}) before it got to it")
                if driver is not None:
                    driver()  # the test environment: move the run on, then answer or explain
                    record = self._record()
                    if record.status not in UpdateStatus.open_values():
                        return _reply(record)
                    raise TimeoutError(self._not_applied(record, "its run cannot apply it without time passing "
                                                                 "or an outside event"))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(self._not_applied(record, f"within {seconds:g}s"))
                wait = min(delay, MAX_POLL_SECONDS) if listener.polls else 1.0
                listener.wait(wait if remaining is None else min(wait, remaining))
                delay *= 2

    def _record(self) -> WorkflowUpdate:
        try:
            return WorkflowUpdate.objects.select_related("run").get(pk=self._pk)
        except WorkflowUpdate.DoesNotExist:
            raise WorkflowNotFound(f"update {self.update_id!r} of {self.workflow_id!r} no longer exists (retention "
                                   "may have deleted its run)") from None

    def _not_applied(self, record: WorkflowUpdate, why: str) -> str:
        run = record.run
        state = f"{run.status}" + (f", {run.wait_reason}" if run.wait_reason else "")
        return (f"update {self.name!r} ({self.update_id!r}) of run {run.run_id} was not applied {why} (the run is "
                f"{state}); it stays accepted and is applied when the run gets to it")


def _reply(record: WorkflowUpdate) -> Any:
    if record.status == UpdateStatus.COMPLETED:
        return decode(record.result)
    error = record.error or {}
    if error.get("type") == "UpdateNotHandled":
        raise UpdateNotHandled(f"update {record.name!r} ({record.update_id!r}) was not applied: "
                               f"{error.get('message', '')}", name=record.name, registered=error.get("registered", []))
    raise UpdateFailed(f"update {record.name!r} ({record.update_id!r}) failed: {error.get('type', 'Error')}: "
                       f"{error.get('message', '')}", error=error)


def check_update(name: Any, payload: Any, update_id: Any) -> tuple[bytes, str]:
    """The encoded payload and the update id (a new one when none is given), or InvalidArgument/PayloadError."""
    check_id(name, "an update name")
    update_id = uuid.uuid4().hex if update_id is None else check_opaque_id(update_id, "update_id",
                                                                            max_bytes=MAX_UPDATE_ID_BYTES)
    return encode(payload, what=f"payload of update {name!r}"), update_id


def validate(run: Workflow, name: str, payload: Any, *, fresh: bool = False) -> None:
    """Rebuild ``run``'s state (nothing runs, nothing is written) and check the update against it: its code
    must register a handler ``name``, and the handler's validator must accept ``payload``."""
    if fresh:
        state = replay_cache.Replayed(*queries.replay(run, [], []), rows=0)
    else:
        state = replay_cache.replayed(run, lambda: queries.replay(run))
    with state.lock:
        _validate(run, state.ctx, state.stopped, name, payload)


def _validate(run: Workflow, ctx: Context, stopped: BaseException | None, name: str, payload: Any) -> None:
    if stopped is not None:
        raise UpdateRejected(f"update {name!r} of run {run.run_id}: the run's code could not be replayed "
                             f"({type(stopped).__name__}: {stopped})", name=name) from stopped
    handlers = sorted(ctx._update_handlers)
    if not handlers:
        raise UpdateRejected(f"run {run.run_id} of {run.workflow_id!r} has no update handler {name!r}: its code "
                             "registers no update handler where it is", name=name, registered=handlers)
    if name not in handlers:
        return  # held: the code may register it before its next wait (else the run answers UpdateNotHandled)
    validator = ctx._update_validators.get(name)
    if validator is None:
        return
    try:
        ctx._call_handler(validator, decode(encode(payload)), f"the validator of update {name!r}")
    except Exception as exc:
        raise UpdateRejected(f"update {name!r} of run {run.run_id} was rejected by its validator: "
                             f"{type(exc).__name__}: {exc}", name=name, registered=handlers) from exc


def check_timeout(timeout: float | timedelta | None) -> float | None:
    return None if timeout is None else to_seconds(timeout, "timeout", allow_zero=True)


def refuse_waiting_in_transaction(what: str, *, stores: bool = True) -> None:
    """Waiting for a reply inside a transaction cannot work: the run does not see an update this transaction
    stored (and, on MySQL, the transaction would not see the reply). With autocommit off (``stores``: the call
    stores the update first) it would be stored in a transaction that only the caller can commit."""
    connection = connections[router.db_for_write(Workflow)]
    if connection.in_atomic_block:
        raise InvalidArgument(
            f"{what} waits for the run to apply the update, which cannot happen inside this transaction: call it "
            "outside transaction.atomic() (with ATOMIC_REQUESTS, mark the view @transaction.non_atomic_requests), "
            "or call start_update() and wait for its result() after the commit")
    if stores and not connection.get_autocommit():
        raise InvalidArgument(
            f"{what} waits for the run to apply the update, which it would store in the transaction autocommit "
            "off keeps open: call start_update(), commit, then wait for its result()")


def existing_update(run: Workflow, name: str, update_id: str) -> WorkflowUpdate | None:
    """The update ``run`` already has with ``update_id`` (a repeat), which must be of the same name."""
    existing = WorkflowUpdate.objects.filter(run=run, update_id=update_id).first()
    if existing is not None and existing.name != name:
        raise InvalidArgument(f"update_id {update_id!r} of run {run.run_id} is update {existing.name!r}, not "
                              f"{name!r}: an update_id names one update")
    return existing


def send(run_id: uuid.UUID, name: str, payload: Any, update_id: str | None, *, waiting: bool) -> UpdateHandle:
    """Validate and store an update for the chain of run ``run_id`` (its open run)."""
    data, update_id = check_update(name, payload, update_id)
    if waiting and result_waiters.driver_here() is None:
        refuse_waiting_in_transaction("handle.update()")
    return send_checked(run_id, name, payload, data, update_id)


def send_checked(run_id: uuid.UUID, name: str, payload: Any, data: bytes, update_id: str) -> UpdateHandle:
    """:func:`send` once ``check_update`` gave ``payload`` encoded (``data``) and the ``update_id``."""
    run = Workflow.objects.end_of_chain(_get(run_id))
    for _ in range(3):
        existing = existing_update(run, name, update_id)
        if existing is not None:
            return UpdateHandle(run.workflow_id, existing)  # a repeat: the same update, even once the run finished
        if run.is_finished:
            raise _closed(run, name)
        validate(run, name, payload)
        try:
            with transaction.atomic():
                locked = _lock_chain(run.pk)
                if locked.pk != run.pk:  # it continued as new meanwhile: validate against the run it reached
                    run = locked
                    continue
                if locked.is_finished:
                    raise _closed(locked, name)
                update, _created = inbox.deliver_update(locked, name, data, update_id, clock.now())
                return UpdateHandle(locked.workflow_id, update)
        except IntegrityError:
            continue  # the same update_id, stored by a concurrent caller meanwhile: the next round finds it
    raise InvalidArgument(f"update {update_id!r} could not be stored (its run kept changing); try again")


def _get(run_id: uuid.UUID) -> Workflow:
    run = Workflow.objects.filter(pk=run_id).first()
    if run is None:
        raise WorkflowNotFound(f"run {run_id} does not exist")
    return run


def _lock_chain(run_pk: Any) -> Workflow:
    """Lock the chain's open run (following one that continued as new while the caller waited for its lock)."""
    run = transitions.locked_run(run_pk)
    for _ in range(3):
        if run.status != RunStatus.CONTINUED:
            break
        run = transitions.locked_run(Workflow.objects.end_of_chain(run).pk)
    return run


def _closed(run: Workflow, name: str) -> WorkflowClosed:
    return WorkflowClosed(f"workflow {run.workflow_id!r} is {run.status} (run {run.run_id}); it cannot receive "
                          f"update {name!r}")
