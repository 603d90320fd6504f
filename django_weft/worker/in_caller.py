"""``weft.run()``: start a run and execute it in the calling thread, as calling a DBOS workflow does.

The run is inserted already claimed by the caller (its start and its claim are one write, and no executor
is woken for it), then executed here exactly as an executor would: each step is a fenced commit of its own,
so every guarantee of a claimed run holds. If the caller dies, the run's lease expires and any executor
takes it over. A run that parks (a timer, a signal, an async activity) is left to the executors from there.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.db import transaction

from django_weft.common.registry import get_workflow
from django_weft.exceptions import InvalidArgument
from django_weft.models import RunStatus
from django_weft.runtime import executor
from django_weft.runtime.lease_keeper import LeaseKeeper
from django_weft.services import client
from django_weft.services.maintenance import default_owner
from django_weft.store import transitions
from django_weft.store.starts import prepare_run

_keeper: LeaseKeeper | None = None
_keeper_pid: int | None = None
_keeper_lock = threading.Lock()


def _lease_keeper() -> LeaseKeeper:
    """One keeper per process renews the leases of every run its callers execute (a forked child starts its
    own: threads do not survive a fork)."""
    global _keeper, _keeper_pid
    with _keeper_lock:
        if _keeper is None or _keeper_pid != os.getpid():
            # Made in an empty context: it outlives the caller that made it, whose clock (a test's) and trace
            # it must not keep.
            _keeper, _keeper_pid = contextvars.Context().run(LeaseKeeper), os.getpid()
            _keeper.__enter__()
        return _keeper


def run(
    workflow: str | Callable[..., Any],
    input: Any = None,
    *,
    workflow_id: str | None = None,
    idempotency_key: str | None = None,
    execution_timeout: float | timedelta | None = None,
    tags: Iterable[str] = (),
    search_attributes: dict[str, Any] | None = None,
    on_terminal_conflict: str = "error",
) -> client.WorkflowHandle:
    """Start a run of ``workflow`` and execute it in this thread until it finishes or parks; returns its handle.

    Takes the options of :func:`weft.start` but the delayed start ones (a run due later is for the executors:
    use ``weft.start``). Each step commits on its own, so call it outside ``transaction.atomic()``. Errors of
    the workflow end the run, as under an executor, and are not raised here: ``handle.result()`` returns or
    raises them (at once for a run that finished). An idempotency key that already started a run returns that
    run's handle without executing anything. A run on a queue (its type's default) or of a paused type is
    queued as by ``weft.start`` and left to the executors once admitted.
    """
    connection = transaction.get_connection()
    if connection.in_atomic_block or not connection.get_autocommit():
        raise InvalidArgument("weft.run() commits each step of the run on its own, so it cannot run inside "
                              "transaction.atomic() (nor with autocommit off); call it outside, or use weft.start(), "
                              "which joins the transaction and leaves the run to an executor")
    definition = get_workflow(workflow)
    client.check_terminal_conflict(on_terminal_conflict, workflow_id)
    prepared = prepare_run(definition, input, workflow_id=workflow_id, idempotency_key=idempotency_key,
                           execution_timeout=execution_timeout, tags=tags, search_attributes=search_attributes)
    claims: list[transitions.Claim] = []
    if prepared.status == RunStatus.QUEUED:
        # On a queue (its type's default) or of a paused type: it waits for admission like any start, and an
        # executor runs it; only an admitted run may execute.
        client.insert_new(prepared, workflow_id, on_terminal_conflict,
                          lambda: transitions.insert_run(prepared, delayed_until=None))
        return client.WorkflowHandle(prepared.workflow_id, prepared.run_id)

    def insert() -> None:
        claims[:] = [transitions.insert_claimed_run(prepared, default_owner())]  # the last try's, if retried

    inserted = client.insert_new(prepared, workflow_id, on_terminal_conflict, insert)
    handle = client.WorkflowHandle(prepared.workflow_id, prepared.run_id)
    if not inserted:
        return handle
    leases = _lease_keeper()
    leases.hold(claims)
    try:
        executor.execute(claims[0], stay_parked=False)  # an executor takes it from its park, not this caller
    finally:
        leases.drop(claims[0])
    return handle
