"""Spent idempotency keys: once retention or a purge deleted a key's run, reusing the key raises
IdempotencyKeyPurged and starts nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.models import RunStatus, Signal, SpentIdempotencyKey, Workflow
from django_weft.services.maintenance import delete_finished_runs
from tests.procs import in_threads
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db

RETENTION = {"completed": timedelta(days=1), "continued": timedelta(days=1)}


def completed(key: str, **options) -> weft.WorkflowHandle:
    handle = weft.start("test.steps", {"key": key, "count": 1}, idempotency_key=key, **options)
    assert handle.result() == [f"{key.upper()}:0"]
    return handle


def assert_refused(key: str, handle: weft.WorkflowHandle) -> None:
    """Every way to start with ``key`` raises IdempotencyKeyPurged, naming it and the purge, and writes nothing."""
    runs, signals = Workflow.objects.count(), Signal.objects.count()
    spent = SpentIdempotencyKey.objects.get(key=key)
    starts = [
        lambda: weft.start("test.steps", {"key": key, "count": 1}, idempotency_key=key),
        lambda: weft.start_or_signal("test.collect", 1, signal="item", payload="x", idempotency_key=key),
    ]
    for start in starts:
        with pytest.raises(weft.IdempotencyKeyPurged) as info:
            start()
        assert isinstance(info.value, weft.WeftError)
        assert key in str(info.value) and spent.spent_at.isoformat() in str(info.value)
        assert (info.value.key, info.value.run_id, info.value.workflow_id) == (key, handle.run_id, handle.workflow_id)
        assert info.value.spent_at == spent.spent_at
    assert (Workflow.objects.count(), Signal.objects.count()) == (runs, signals)


def test_a_key_whose_run_was_purged_in_the_admin_stays_spent(staff_client, weft_env):
    handle = completed("pay-1")
    purged_at = weft_env.now()
    page = staff_client.post(reverse("admin:django_weft_workflow_purge", args=[handle.run_id]), {"post": "yes"})
    assert page.status_code == 302 and not Workflow.objects.exists()
    spent = SpentIdempotencyKey.objects.get()
    assert (spent.key, spent.workflow_id, spent.run_id, spent.spent_at) == (
        "pay-1", handle.workflow_id, handle.run_id, purged_at)
    assert_refused("pay-1", handle)
    assert executions("pay-1:0") == 1


@override_settings(WEFT_RETENTION=RETENTION)
def test_a_key_whose_run_retention_deleted_stays_spent(weft_env):
    handle = completed("pay-2")
    kept = completed("pay-3")
    weft_env.advance(timedelta(hours=12))
    assert weft.start("test.steps", {"key": "pay-2", "count": 1}, idempotency_key="pay-2") == handle
    Workflow.objects.filter(pk=kept.run_id).update(finished_at=weft_env.now())  # finished later: kept longer
    report = weft_env.advance(timedelta(hours=13))
    assert report.purged == 1 and not Workflow.objects.filter(pk=handle.run_id).exists()
    assert SpentIdempotencyKey.objects.get().spent_at == weft_env.now()
    assert_refused("pay-2", handle)
    assert weft.start("test.steps", {"key": "pay-3", "count": 1}, idempotency_key="pay-3") == kept
    assert weft.start("test.steps", {"key": "pay-4", "count": 1}, idempotency_key="pay-4").result() == ["PAY-4:0"]


def test_runs_without_a_key_spend_nothing_and_open_runs_are_not_purged(weft_env):
    plain = weft.start("test.steps", {"key": "plain", "count": 1})
    waiting = weft.start("test.collect", 1, idempotency_key="still-open")
    weft_env.drive()
    assert plain.status == RunStatus.COMPLETED
    assert delete_finished_runs([plain.run_id, waiting.run_id]) == [plain.run_id]
    assert not SpentIdempotencyKey.objects.exists()
    assert weft.start("test.collect", 1, idempotency_key="still-open") == waiting


def test_purge_and_its_spent_key_commit_together(weft_env):
    handle = completed("pay-5")
    with pytest.raises(RuntimeError), transaction.atomic():
        delete_finished_runs([handle.run_id])
        raise RuntimeError("rolled back")
    assert Workflow.objects.filter(pk=handle.run_id).exists() and not SpentIdempotencyKey.objects.exists()
    assert weft.start("test.steps", {"key": "pay-5", "count": 1}, idempotency_key="pay-5") == handle


@override_settings(WEFT_RETENTION=RETENTION)
def test_a_key_moves_down_its_chain_when_a_continued_run_is_purged(weft_env):
    """The key names the chain it started: retention of a run that continued as new hands it to the next run, so
    the key still returns the chain (and start_or_signal signals it); it is spent with the chain's last run."""
    first = weft.start("evolve.counter", {"total": 0, "every": 1}, idempotency_key="counter")
    weft_env.drive()
    first.signal("tick", 1)
    weft_env.drive()
    second = weft.get_handle(first.workflow_id)
    assert first.status == RunStatus.CONTINUED and second != first
    weft_env.advance(timedelta(days=2))
    assert not Workflow.objects.filter(pk=first.run_id).exists() and not SpentIdempotencyKey.objects.exists()
    assert weft.start("evolve.counter", {"total": 0, "every": 1}, idempotency_key="counter") == second
    result = weft.start_or_signal("evolve.counter", {"total": 0, "every": 1}, signal="stop", idempotency_key="counter")
    assert (result.handle, result.outcome) == (second, "signalled")
    assert second.result() == {"total": 1, "generation": 1}
    weft_env.advance(timedelta(days=2))
    assert not Workflow.objects.exists()
    assert SpentIdempotencyKey.objects.get().run_id == second.run_id
    assert_refused("counter", second)


# --- PostgreSQL: threads ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrent
def test_concurrent_starts_with_fresh_and_spent_keys(row_locks):
    """Starts with a fresh key converge on one run while starts with a spent key all raise; starts racing the
    purge of their key's run either get that run or IdempotencyKeyPurged, never a second run."""
    done = weft.start("test.steps", {"key": "spent", "count": 1}, idempotency_key="spent")
    racing = weft.start("test.steps", {"key": "racing", "count": 1}, idempotency_key="racing")
    weft.run_maintenance()
    delete_finished_runs([done.run_id])

    def action(index: int):
        if index == 0:
            time.sleep(0.01)
            return delete_finished_runs([racing.run_id])
        key = ("fresh", "spent", "racing")[index % 3]
        return weft.start("test.steps", {"key": key, "count": 1}, idempotency_key=key)

    results = in_threads(12, action)
    assert results[0] == [racing.run_id]
    fresh = [r for i, r in enumerate(results) if i and i % 3 == 0]
    spent = [r for i, r in enumerate(results) if i and i % 3 == 1]
    race = [r for i, r in enumerate(results) if i and i % 3 == 2]
    assert all(isinstance(r, weft.WorkflowHandle) for r in fresh) and len({r.run_id for r in fresh}) == 1, fresh
    assert all(isinstance(r, weft.IdempotencyKeyPurged) for r in spent), spent
    assert all(r == racing or isinstance(r, weft.IdempotencyKeyPurged) for r in race), race
    assert list(Workflow.objects.values_list("idempotency_key", flat=True)) == ["fresh"]
    assert set(SpentIdempotencyKey.objects.values_list("key", flat=True)) == {"spent", "racing"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrent
def test_a_key_moving_to_a_run_purged_concurrently_is_spent_not_lost(row_locks):
    """The purge of a continued run hands its key to the chain's next run while another purge deletes that run:
    the key must end up spent, not held by no row and recorded nowhere (a start with it would begin anew)."""
    import threading

    from django.db import connection

    first = weft.start("evolve.counter", {"total": 0, "every": 1}, idempotency_key="heir")
    weft.run_maintenance()
    first.signal("tick", 1)
    weft.run_maintenance()
    second = weft.get_handle(first.workflow_id)
    second.signal("stop")
    weft.run_maintenance()
    assert (first.status, second.status) == (RunStatus.CONTINUED, RunStatus.COMPLETED)
    holding, failures = threading.Event(), []

    def purge_the_next_run() -> None:
        try:
            with transaction.atomic():
                assert delete_finished_runs([second.run_id]) == [second.run_id]
                holding.set()
                time.sleep(0.5)  # the purge of the first run now waits for this one's lock
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)
            holding.set()
        finally:
            connection.close()

    thread = threading.Thread(target=purge_the_next_run)
    thread.start()
    assert holding.wait(10)
    assert delete_finished_runs([first.run_id]) == [first.run_id]
    thread.join(10)
    assert not failures and not Workflow.objects.exists()
    assert SpentIdempotencyKey.objects.filter(key="heir").exists()
    with pytest.raises(weft.IdempotencyKeyPurged):
        weft.start("evolve.counter", {"total": 0, "every": 1}, idempotency_key="heir")
