"""The client API: start options, bad input, transactions, handles, cancel, signals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings

import django_weft as weft
from django_weft import signals
from django_weft.models import Timer, Workflow, WorkflowStep
from tests.testapp.workflows import executions, steps

pytestmark = pytest.mark.django_db


def spec(key: str, count: int = 2, **extra) -> dict:
    return {"key": key, "count": count, **extra}


# --- bad input: a WeftError naming the problem, and nothing written -----------------------------------

BAD_STARTS = [
    (("no.such.workflow", None), {}, weft.WorkflowNotRegistered, "no workflow is registered as 'no.such.workflow'"),
    ((len, None), {}, weft.WorkflowNotRegistered, "is not a workflow"),
    (("test.steps", {"k": object()}), {}, weft.PayloadNotSerializable, "input of workflow 'test.steps'"),
    (("test.steps", "x" * 2000), {}, weft.PayloadTooLarge, "over WEFT_MAX_PAYLOAD_BYTES=1000"),
    (("test.steps", None), {"workflow_id": "a", "idempotency_key": "b"}, weft.InvalidArgument, "not both"),
    (("test.steps", None), {"workflow_id": ""}, weft.InvalidArgument, "workflow_id must be a non-empty"),
    (("test.steps", None), {"workflow_id": "x" * 256}, weft.InvalidArgument, "at most 255"),
    (("test.steps", None), {"on_terminal_conflict": "replace"}, weft.InvalidArgument, "on_terminal_conflict"),
    (("test.steps", None), {"on_terminal_conflict": "start_new"}, weft.InvalidArgument, "explicit workflow_id"),
    (("test.steps", None), {"start_after": -1}, weft.InvalidArgument, "start_after must be >= 0"),
    (("test.steps", None), {"start_after": "soon"}, weft.InvalidArgument, "timedelta or seconds"),
    (("test.steps", None), {"start_at": "2030-01-01"}, weft.InvalidArgument, "aware datetime"),
    (("test.steps", None), {"execution_timeout": 0}, weft.InvalidArgument, "execution_timeout must be positive"),
    (("test.steps", None), {"tags": "urgent"}, weft.InvalidArgument, "tags must be"),
    (("test.steps", None), {"search_attributes": {"a": 1}}, weft.InvalidArgument, "'a' is not declared"),
    (("test.steps", None), {"search_attributes": {"customer_id": object()}}, weft.InvalidArgument, "is int"),
]


@override_settings(WEFT_MAX_PAYLOAD_BYTES=1000)
@pytest.mark.parametrize(("args", "kwargs", "error", "message"), BAD_STARTS)
def test_bad_start_raises_a_clear_error_and_writes_nothing(args, kwargs, error, message):
    with pytest.raises(error, match=message) as info:
        weft.start(*args, **kwargs)
    assert isinstance(info.value, weft.WeftError)
    assert Workflow.objects.count() == 0
    assert Timer.objects.count() == 0


@override_settings(WEFT_MAX_PAYLOAD_BYTES=1000)
def test_payload_exactly_at_the_limit_is_accepted():
    from django_weft.common.codec import encode

    payload = "x" * 997  # a str of 256..65535 bytes has a 3-byte msgpack header
    assert len(encode(payload)) == 1000
    weft.start("test.steps", payload)
    assert Workflow.objects.count() == 1


# --- transactions ------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_start_inside_a_rolled_back_transaction_leaves_nothing(weft_env):
    started = []
    signals.workflow_started.connect(lambda **kw: started.append(kw["run"]), weak=False, dispatch_uid="t1")
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            weft.start("test.steps", spec("rb"), execution_timeout=60, start_after=10)
            assert Workflow.objects.count() == 1
            raise RuntimeError("the view failed")
        assert Workflow.objects.count() == 0 and Timer.objects.count() == 0
        weft_env.advance(timedelta(seconds=20))
        assert executions("rb:0") == 0
        assert started == [], "workflow_started must only be sent after commit"
    finally:
        signals.workflow_started.disconnect(dispatch_uid="t1")


def test_lost_workflow_id_race_keeps_the_callers_transaction_usable():
    with transaction.atomic():
        weft.start("test.steps", spec("a"), workflow_id="order-1")
        with pytest.raises(weft.WorkflowAlreadyExists, match="open run"):
            weft.start("test.steps", spec("a"), workflow_id="order-1")
        assert Workflow.objects.count() == 1


# --- identity -----------------------------------------------------------------------------------------

def test_idempotency_key_returns_the_same_run_even_after_it_finished(weft_env):
    first = weft.start(steps, spec("i"), idempotency_key="checkout-42")
    again = weft.start(steps, spec("i"), idempotency_key="checkout-42")
    assert first == again and first.workflow_id == str(first.run_id)
    weft_env.drive()
    assert first.status == "completed"
    assert weft.start(steps, spec("i"), idempotency_key="checkout-42").run_id == first.run_id
    assert Workflow.objects.count() == 1
    with pytest.raises(weft.InvalidArgument, match=r"already started a 'test\.steps' run"):
        weft.start("test.retry", {"key": "x", "failures": 0}, idempotency_key="checkout-42")


def test_finished_workflow_id_needs_start_new_and_records_lineage(weft_env):
    old = weft.start("test.steps", spec("w1"), workflow_id="invoice-7")
    weft_env.drive()
    with pytest.raises(weft.WorkflowAlreadyExists, match="start_new"):
        weft.start("test.steps", spec("w2"), workflow_id="invoice-7")
    new = weft.start("test.steps", spec("w2"), workflow_id="invoice-7", on_terminal_conflict="start_new")
    assert new.workflow_id == old.workflow_id and new.run_id != old.run_id
    assert new.run.restarted_from_id == old.run_id
    assert weft.get_handle("invoice-7") == new
    assert weft.get_handle("invoice-7", old.run_id) == old


def test_start_new_never_displaces_an_open_run():
    weft.start("test.steps", spec("o"), workflow_id="open-1")
    with pytest.raises(weft.WorkflowAlreadyExists, match="open run"):
        weft.start("test.steps", spec("o"), workflow_id="open-1", on_terminal_conflict="start_new")


def test_get_handle_errors():
    with pytest.raises(weft.WorkflowNotFound, match="'nope'"):
        weft.get_handle("nope")
    with pytest.raises(weft.InvalidArgument, match="UUID"):
        weft.get_handle("nope", "not-a-uuid")


def test_tags_and_search_attributes_are_stored():
    handle = weft.start("test.steps", spec("t"), tags=["vip", "eu"], search_attributes={"customer_id": 12})
    run = handle.refresh()
    assert run.tags == ["vip", "eu"] and run.search_attributes == {"customer_id": 12}


# --- timing -------------------------------------------------------------------------------------------

def test_delayed_start_waits_for_start_after(weft_env):
    handle = weft.start("test.steps", spec("d"), start_after=timedelta(minutes=5))
    assert Timer.objects.get(run_id=handle.run_id).purpose == "delayed_start"
    weft_env.drive()
    assert handle.status == "pending" and executions("d:0") == 0
    weft_env.advance(timedelta(minutes=5))
    assert handle.result() == ["D:0", "D:1"]
    assert Timer.objects.get(run_id=handle.run_id).fired_at == weft_env.now()


def test_start_at_in_the_past_starts_now(weft_env):
    handle = weft.start("test.steps", spec("p"), start_at=weft_env.now() - timedelta(days=1))
    weft_env.drive()
    assert handle.status == "completed"


def test_execution_timeout_ends_a_waiting_run_as_timed_out(weft_env):
    ended = []
    signals.workflow_timed_out.connect(lambda **kw: ended.append(kw["run"].run_id), weak=False, dispatch_uid="t2")
    try:
        handle = weft.start("test.long_sleep", execution_timeout=timedelta(hours=1))
        weft_env.drive()
        assert handle.status == "waiting"
        weft_env.advance(timedelta(hours=1))
        run = handle.refresh()
        assert run.status == "timed_out" and run.runnable_at is None
        assert not Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).exists()
        with pytest.raises(weft.WorkflowTimedOut, match="execution timeout"):
            handle.result()
        weft_env.advance(timedelta(days=3))
        assert handle.status == "timed_out"
    finally:
        signals.workflow_timed_out.disconnect(dispatch_uid="t2")


# --- results, cancel and Django signals ---------------------------------------------------------------

def test_result_timeout_raises_timeout_error():
    handle = weft.start("test.long_sleep")
    with pytest.raises(TimeoutError, match="still pending"):
        handle.result(timeout=0.05)


@pytest.mark.django_db(transaction=True)
def test_cancel_a_waiting_run(weft_env):
    handle = weft.start("test.steps", spec("c", count=4, sleep=60))
    weft_env.drive()
    assert weft.cancel(handle.workflow_id, reason="customer asked") is True
    weft_env.drive()  # the run's code sees the cancel where it sleeps
    run = handle.refresh()
    assert run.status == "cancelled" and run.error["message"] == "customer asked"
    with pytest.raises(weft.WorkflowCancelled, match="customer asked"):
        handle.result()
    weft_env.advance(timedelta(minutes=5))
    assert executions("c:2") == 0
    assert WorkflowStep.objects.filter(run_id=handle.run_id).count() == 3
    assert handle.cancel() is False, "cancelling a finished run reports that nothing changed"


@pytest.mark.django_db(transaction=True)
def test_lifecycle_signals_are_sent_after_commit(weft_env):
    seen = []

    def receiver(signal, run, **kwargs):
        seen.append((signal, run.workflow_id, run.status))

    for sig in (signals.workflow_started, signals.workflow_completed, signals.workflow_failed,
                signals.workflow_cancelled):
        sig.connect(receiver, weak=False)
    try:
        ok = weft.start("test.steps", spec("ok"), workflow_id="ok")
        bad = weft.start("test.uncaught", "bad", workflow_id="bad")
        cancelled = weft.start("test.long_sleep", workflow_id="cx")
        weft_env.drive()
        cancelled.cancel()
        weft_env.drive()
        assert ok.status == "completed" and bad.status == "failed"
    finally:
        for sig in (signals.workflow_started, signals.workflow_completed, signals.workflow_failed,
                    signals.workflow_cancelled):
            sig.disconnect(receiver)
    assert (signals.workflow_started, "ok", "pending") in seen
    assert (signals.workflow_completed, "ok", "completed") in seen
    assert (signals.workflow_failed, "bad", "failed") in seen
    assert (signals.workflow_cancelled, "cx", "cancelled") in seen
    assert len(seen) == 6
