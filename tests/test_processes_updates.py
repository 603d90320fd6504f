"""Updates against real weft_maintenance processes on PostgreSQL: concurrent senders, one update_id from many
threads, and an executor SIGKILLed while it applies an update."""

from __future__ import annotations

import signal

import pytest

import django_weft as weft
from django_weft.models import RunStatus, StepKind, UpdateStatus, WorkflowStep, WorkflowUpdate
from tests.procs import SHORT_LEASE, in_threads, pids_of, wait_until
from tests.testapp.update_process_workflows import KILL_IN_ACTIVITY, KILL_IN_HANDLER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrent]

DEADLINE = 60


def parked(handle) -> bool:
    return handle.refresh().status == RunStatus.WAITING


def update_rows(handle) -> list[tuple[int, str]]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id, kind=StepKind.UPDATE).order_by("seq")
                .values_list("seq", "name"))


def test_eight_threads_with_distinct_update_ids_each_get_their_reply_applied_once_in_arrival_order(
        row_locks, maintenance):
    handle = weft.start("updates.ledger", 8)
    proc = maintenance("loop", "--interval", "0.2")
    wait_until(lambda: parked(handle), "the run to park", DEADLINE, [proc])

    replies = in_threads(8, lambda i: handle.update("append", f"t{i}", update_id=f"u{i}", timeout=DEADLINE))
    assert all(isinstance(r, int) for r in replies), replies
    assert sorted(replies) == list(range(1, 9))
    entries = handle.result(timeout=DEADLINE)
    for index, reply in enumerate(replies):
        assert entries[reply - 1] == f"t{index}"  # each reply is its own update's place
    records = list(WorkflowUpdate.objects.filter(run_id=handle.run_id).order_by("sequence"))
    assert [r.update_id for r in records] == [f"u{entries[i][1:]}" for i in range(8)]  # arrival order
    assert [r.applied_seq for r in records] == sorted(r.applied_seq for r in records)
    assert all(r.status == UpdateStatus.COMPLETED for r in records)
    assert len(update_rows(handle)) == 8


def test_eight_threads_with_one_update_id_make_one_update_and_share_its_reply(row_locks, maintenance):
    handle = weft.start("updates.ledger", 2)
    proc = maintenance("loop", "--interval", "0.2")
    wait_until(lambda: parked(handle), "the run to park", DEADLINE, [proc])

    replies = in_threads(8, lambda i: handle.update("append", "same", update_id="once", timeout=DEADLINE))
    assert replies == [1] * 8, replies
    assert WorkflowUpdate.objects.filter(run_id=handle.run_id).count() == 1
    assert len(update_rows(handle)) == 1
    assert handle.update("append", "next", timeout=DEADLINE) == 2
    assert handle.result(timeout=DEADLINE) == ["same", "next"]


@pytest.mark.parametrize("kill", [KILL_IN_HANDLER, KILL_IN_ACTIVITY])
def test_an_executor_sigkilled_while_applying_an_update_loses_nothing_and_applies_it_once(
        row_locks, maintenance, kill):
    """The first process dies inside the handler (nothing of the application is committed), or in the
    activity right after it (the application and its reply are): the second finishes the run, and the
    update is applied once either way."""
    key = f"fragile-{kill}"
    handle = weft.start("updates.fragile", key)
    weft.run_maintenance()  # parks in wait_condition
    assert parked(handle)
    sent = handle.start_update("add", "x", update_id="the-one")

    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE, **{kill: "1"})
    assert first.wait(DEADLINE) == -signal.SIGKILL, first.output()
    record = WorkflowUpdate.objects.get()
    if kill == KILL_IN_HANDLER:
        assert record.status == UpdateStatus.PENDING and update_rows(handle) == []
    else:
        assert record.status == UpdateStatus.COMPLETED and len(update_rows(handle)) == 1
        assert sent.result(timeout=0) == 1  # the reply committed before the process died

    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    assert sent.result(timeout=DEADLINE) == 1
    wait_until(lambda: handle.refresh().is_finished, "the second process to finish the run", DEADLINE, [second])
    assert handle.result(timeout=0) == {"items": ["x"], "after": "after"}
    assert len(update_rows(handle)) == 1
    record.refresh_from_db()
    assert record.status == UpdateStatus.COMPLETED and record.decoded_result == 1
    expected = [first.pid, second.pid] if kill == KILL_IN_ACTIVITY else [second.pid]
    assert pids_of(key) == expected


def test_a_running_run_applies_an_update_at_its_next_operation_without_parking(row_locks, maintenance):
    handle = weft.start("updates.busy", 40)
    proc = maintenance("loop", "--interval", "0.2")
    wait_until(lambda: WorkflowStep.objects.filter(run_id=handle.run_id).count() >= 3, "the run to be busy",
               DEADLINE, [proc])
    assert handle.update("note", "hi", timeout=DEADLINE) == 1
    assert handle.result(timeout=DEADLINE) == ["hi"]
    [(update_seq, _)] = update_rows(handle)
    last = WorkflowStep.objects.filter(run_id=handle.run_id).order_by("-seq").values_list("seq", flat=True)[0]
    assert update_seq < last - 5, (update_seq, last)  # applied between activities, long before the end


@pytest.mark.postgres  # LISTEN/NOTIFY and pg_listening_channels()
def test_a_caller_waits_for_its_reply_with_notify_and_stops_listening_after(postgres_only, maintenance):
    """The caller listens on its own connection while it waits, and that connection listens to nothing once
    the reply is back."""
    from django.db import connection

    handle = weft.start("updates.ledger", 2)
    proc = maintenance("loop", "--interval", "30")  # a 30 s poll: only a NOTIFY brings the reply back in time
    wait_until(lambda: parked(handle), "the run to park", DEADLINE, [proc])

    assert handle.update("append", "first", timeout=DEADLINE) == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_listening_channels()")
        assert cursor.fetchall() == []
    assert handle.update("append", "second", timeout=DEADLINE) == 2
    assert handle.result(timeout=DEADLINE) == ["first", "second"]


def test_with_autocommit_off_an_update_is_committed_first_and_its_reply_polled(row_locks, maintenance):
    """handle.update() would store the update in the transaction autocommit off keeps open, and wait for a
    run that cannot see it: refused, nothing stored. start_update(), a commit, then result() polls."""
    from django.db import transaction

    handle = weft.start("updates.ledger", 1)
    proc = maintenance("loop", "--interval", "0.2")
    wait_until(lambda: parked(handle), "the run to park", DEADLINE, [proc])

    transaction.set_autocommit(False)
    try:
        try:
            with pytest.raises(weft.InvalidArgument, match="autocommit off"):
                handle.update("append", "refused", timeout=DEADLINE)
            assert not WorkflowUpdate.objects.filter(run_id=handle.run_id).exists()
            sent = handle.start_update("append", "polled")
            transaction.commit()  # its wake-up waits for autocommit back on: the loop finds it at its poll
            assert sent.result(timeout=DEADLINE) == 1
            transaction.commit()
        finally:
            transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert handle.result(timeout=DEADLINE) == ["polled"]
