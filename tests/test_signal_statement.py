"""``weft.signal()`` to a workflow's open run: one statement on PostgreSQL, the ORM's transaction elsewhere.

Whatever way a signal takes, what it stores and guarantees is the same: numbered in the run's inbox under its
lock, waking the run only if it waits for that name, refused for a run that closed while the signal waited
for its lock, and taken back by the caller's transaction when that rolls back. The tests that race run on a
database with row locks, each thread on its own connection.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import RunStatus, Signal, Workflow
from django_weft.signals import signal_received
from tests.procs import in_threads, wait_until
from tests.test_processes_signals import DEADLINE, LockHolder, backends_blocked_by, join_all

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 6
PER_THREAD = 8


def waiting_collector(workflow_id: str, count: int) -> weft.WorkflowHandle:
    handle = weft.start("test.collect", count, workflow_id=workflow_id)
    weft.run_maintenance()
    assert handle.refresh().status == RunStatus.WAITING
    return handle


def test_a_signal_wakes_the_run_waiting_for_it_and_not_one_waiting_for_another_name():
    handle = waiting_collector("statement-wakes", 2)
    assert weft.signal("statement-wakes", "other", "ignored") is True
    run = handle.refresh()
    assert (run.status, run.runnable_at, run.inbox_seq) == (RunStatus.WAITING, None, 1)

    assert weft.signal("statement-wakes", "item", {"n": 1}) is True
    run = handle.refresh()
    assert run.runnable_at is not None and run.awaiting_signals == [] and run.inbox_seq == 2
    stored = list(Signal.objects.filter(run=run).order_by("sequence").values_list("name", "sequence", "payload"))
    assert [(name, sequence, decode(payload)) for name, sequence, payload in stored] == [
        ("other", 1, "ignored"), ("item", 2, {"n": 1})]

    weft.run_maintenance()
    assert weft.signal("statement-wakes", "item", 2) is True
    weft.run_maintenance()
    assert handle.result(timeout=0) == [{"n": 1}, 2]


def test_on_postgresql_a_signal_is_one_statement_and_its_notify(postgres_only, settings):
    settings.WEFT_NOTIFY = True
    waiting_collector("statement-count", 1)
    with CaptureQueriesContext(connection) as queries:
        assert weft.signal("statement-count", "item", 1) is True
    statements = [query["sql"].split()[0].upper() for query in queries.captured_queries]
    assert statements == ["WITH", "SELECT"], [query["sql"][:80] for query in queries.captured_queries]
    assert "pg_notify" in queries.captured_queries[1]["sql"]


def test_a_signal_received_receiver_still_gets_the_stored_record():
    waiting_collector("statement-receiver", 1)
    received: list[tuple[str, int, int]] = []

    def receiver(sender, run, name, signal_pk, record, **kwargs):
        received.append((name, signal_pk, record.sequence))

    signal_received.connect(receiver, weak=False, dispatch_uid="test_signal_statement")
    try:
        assert weft.signal("statement-receiver", "item", 1) is True
    finally:
        signal_received.disconnect(dispatch_uid="test_signal_statement")
    stored = Signal.objects.get(run__workflow_id="statement-receiver")
    assert received == [("item", stored.pk, 1)]


def test_a_signal_inside_a_transaction_that_rolls_back_leaves_nothing():
    handle = waiting_collector("statement-rollback", 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert weft.signal("statement-rollback", "item", 1) is True
        raise RuntimeError("the caller's transaction fails")
    run = handle.refresh()
    assert (run.status, run.runnable_at, run.inbox_seq) == (RunStatus.WAITING, None, 0)
    assert not Signal.objects.filter(run=run).exists()


def test_with_autocommit_off_a_signal_waits_for_the_callers_commit():
    handle = waiting_collector("statement-autocommit", 1)
    transaction.set_autocommit(False)
    try:
        try:
            assert weft.signal("statement-autocommit", "item", 7) is True
            transaction.commit()
        finally:
            transaction.rollback()
    finally:
        transaction.set_autocommit(True)  # the commit's hooks (the wake-up) run here
    run = handle.refresh()
    assert run.runnable_at is not None and run.inbox_seq == 1
    weft.run_maintenance()
    assert handle.result(timeout=0) == [7]


def test_bad_targets_are_named_and_nothing_is_written():
    with pytest.raises(weft.WorkflowNotFound, match="statement-nobody"):
        weft.signal("statement-nobody", "item", 1)
    handle = waiting_collector("statement-finished", 1)
    handle.terminate("done with it")
    with pytest.raises(weft.WorkflowClosed, match="statement-finished"):
        weft.signal("statement-finished", "item", 1)
    assert not Signal.objects.exists()
    assert handle.refresh().inbox_seq == 0


@pytest.mark.concurrent
def test_signals_from_many_threads_are_each_stored_once_and_numbered_without_gaps(row_locks):
    total = THREADS * PER_THREAD
    handle = waiting_collector("statement-threads", total)

    def sender(index: int) -> int:
        for number in range(PER_THREAD):
            assert weft.signal("statement-threads", "item", [index, number]) is True
        return index

    outcomes = in_threads(THREADS, sender, timeout=DEADLINE)
    assert outcomes == list(range(THREADS)), outcomes

    assert handle.refresh().inbox_seq == total
    assert sorted(Signal.objects.filter(run_id=handle.run_id).values_list("sequence", flat=True)) == list(
        range(1, total + 1))
    for _ in range(total + 1):
        weft.run_maintenance()
    items = handle.result(timeout=0)
    assert sorted(map(tuple, items)) == [(i, n) for i in range(THREADS) for n in range(PER_THREAD)]
    for index in range(THREADS):  # each sender's signals are consumed in the order it sent them
        assert [n for i, n in items if i == index] == list(range(PER_THREAD))


@pytest.mark.postgres  # LockHolder and pg_blocking_pids
def test_a_signal_waiting_for_the_lock_of_a_run_that_then_finishes_is_refused(postgres_only):
    handle = waiting_collector("statement-closes", 1)
    table = Workflow._meta.db_table
    outcome: list[object] = []

    def send() -> None:
        try:
            outcome.append(weft.signal("statement-closes", "item", 1))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            connection.close()

    # The run finishes while the signal waits for its lock: the lock holder's update commits on release.
    closing = f'UPDATE "{table}" SET "status" = %s, "finished_at" = now(), "runnable_at" = NULL WHERE "run_id" = %s'
    with LockHolder(closing, [RunStatus.CANCELLED, handle.run_id]) as holder:
        thread = threading.Thread(target=send, name="signaller", daemon=True)
        thread.start()
        # The one statement waits (a WITH ...), not an ORM's SELECT ... FOR UPDATE.
        wait_until(lambda: any(query.lstrip().upper().startswith("WITH")
                               for _, query in backends_blocked_by(holder.backend_pid)),
                   "the signal's statement to wait for the run's lock", 30)
    join_all([thread], 30)
    assert len(outcome) == 1 and isinstance(outcome[0], weft.WorkflowClosed), outcome
    assert not Signal.objects.exists()
    assert handle.refresh().inbox_seq == 0
