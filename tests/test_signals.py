"""Signals, wait_for_signal and start_or_signal."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import Signal, Timer, Workflow, WorkflowStep
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


def test_a_signal_wakes_the_waiting_run_and_is_consumed_once(weft_env):
    handle = weft.start("test.approval", "ap", workflow_id="order-1")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "waiting" and run.awaiting_signals == ["approval"]
    assert Timer.objects.get(run_id=handle.run_id).purpose == "wait_timeout"
    assert weft.signal("order-1", "approval", {"approved": True, "by": "ann"}) is True
    run = handle.refresh()
    assert run.runnable_at == weft_env.now(), "the signal makes the run runnable in its own transaction"
    weft_env.drive()
    assert handle.result() == {"approved": True, "by": "ann"}
    assert executions("ap:before") == 1 and executions("ap:after") == 1
    sig = Signal.objects.get(run_id=handle.run_id)
    assert sig.consumed_at == weft_env.now() and sig.consumed_by_seq == 2


def test_a_signal_sent_before_the_wait_is_buffered(weft_env):
    handle = weft.start("test.approval", "early", workflow_id="order-2")
    weft.signal("order-2", "approval", "yes")
    weft_env.drive()
    assert handle.result() == "yes"


def test_wait_timeout_raises_in_the_workflow(weft_env):
    handle = weft.start("test.approval", "late", workflow_id="order-3")
    weft_env.drive()
    weft_env.advance(timedelta(hours=23))
    assert handle.status == "waiting"
    weft_env.advance(timedelta(hours=1))
    assert handle.result() == "timed out"
    step = WorkflowStep.objects.get(run_id=handle.run_id, seq=2)
    assert (step.kind, step.status, step.error["type"]) == ("signal", "failed", "WaitTimeout")


def test_a_signal_after_the_timeout_is_buffered_not_consumed(weft_env):
    handle = weft.start("test.approval", "after", workflow_id="order-4")
    weft_env.drive()
    weft_env.advance(timedelta(days=1))
    assert handle.result() == "timed out"
    with pytest.raises(weft.WorkflowClosed, match="is completed"):
        weft.signal("order-4", "approval", "too late")


def test_signals_are_consumed_in_arrival_order_with_and_without_ids(weft_env):
    handle = weft.start("test.collect", 4, workflow_id="c")
    for i, signal_id in enumerate(["z-last-alphabetically", None, "a-first-alphabetically", None]):
        weft.signal("c", "item", i, signal_id=signal_id)
    weft_env.drive()
    assert handle.result() == [0, 1, 2, 3]
    assert list(Signal.objects.order_by("sequence").values_list("sequence", flat=True)) == [1, 2, 3, 4]


def test_signal_id_deduplicates_for_the_life_of_the_run(weft_env):
    handle = weft.start("test.collect", 2, workflow_id="d")
    assert weft.signal("d", "item", "first", signal_id="evt-1") is True
    assert weft.signal("d", "item", "dupe", signal_id="evt-1") is False
    weft_env.drive()  # consumes evt-1
    assert weft.signal("d", "item", "dupe after consumption", signal_id="evt-1") is False
    assert weft.signal("d", "item", "case differs", signal_id="EVT-1") is True
    weft_env.drive()
    assert handle.result() == ["first", "case differs"]
    # The same id under another signal name is another signal.
    assert Signal.objects.filter(run_id=handle.run_id).count() == 2


def test_wait_for_several_names_returns_the_name(weft_env):
    handle = weft.start("test.either", workflow_id="e")
    weft_env.drive()
    weft.signal("e", "b", 2)
    weft.signal("e", "a", 1)
    weft_env.drive()
    assert handle.result() == [("b", 2), ("a", 1)]


def test_handle_signal_targets_its_run(weft_env):
    handle = weft.start("test.collect", 1, workflow_id="h")
    assert handle.signal("item", "via handle") is True
    weft_env.drive()
    assert handle.result() == ["via handle"]
    with pytest.raises(weft.WorkflowClosed):
        handle.signal("item", "again")


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"name": ""}, weft.InvalidArgument, "signal name"),
    ({"signal_id": ""}, weft.InvalidArgument, "signal_id must be a non-empty string"),
    ({"signal_id": "é" * 65}, weft.InvalidArgument, "at most 128 UTF-8 bytes, got 130"),
    ({"payload": object()}, weft.PayloadNotSerializable, "payload of signal 'go'"),
])
def test_bad_signals_are_rejected_before_anything_is_written(weft_env, kwargs, error, message):
    weft.start("test.collect", 1, workflow_id="bad")
    args = {"name": "go", "payload": None, **kwargs}
    with pytest.raises(error, match=message):
        weft.signal("bad", args.pop("name"), args.pop("payload"), **args)
    assert Signal.objects.count() == 0


def test_signal_id_of_exactly_128_bytes_is_accepted(weft_env):
    weft.start("test.collect", 1, workflow_id="ok128")
    assert weft.signal("ok128", "item", 1, signal_id="é" * 64) is True


def test_signal_to_unknown_or_finished_workflow(weft_env):
    with pytest.raises(weft.WorkflowNotFound, match="'nobody'"):
        weft.signal("nobody", "x")
    handle = weft.start("test.collect", 0, workflow_id="done")
    weft_env.drive()
    assert handle.status == "completed"
    with pytest.raises(weft.WorkflowClosed, match="'done' is completed"):
        weft.signal("done", "item")
    assert Signal.objects.count() == 0


def test_a_signal_to_a_suspended_run_is_kept_for_later(weft_env):
    handle = weft.start("test.collect", 1, workflow_id="s")
    weft_env.drive()
    handle.suspend()
    weft.signal("s", "item", "kept")
    weft_env.drive()
    assert handle.status == "suspended"
    handle.resume()
    weft_env.drive()
    assert handle.result() == ["kept"]


def test_a_signal_the_run_does_not_wait_for_does_not_wake_it(weft_env):
    handle = weft.start("test.approval", "other", workflow_id="o")
    weft_env.drive()
    weft.signal("o", "unrelated")
    assert handle.refresh().runnable_at > weft_env.now()
    assert weft_env.drive().claimed == 0


# --- start_or_signal -----------------------------------------------------------------------------------

def test_start_or_signal_starts_then_signals(weft_env):
    first = weft.start_or_signal("test.collect", 2, signal="item", payload="one", workflow_id="sos",
                                 signal_id="1")
    assert first.outcome == "started"
    second = weft.start_or_signal("test.collect", 2, signal="item", payload="two", workflow_id="sos",
                                  signal_id="2")
    assert second.outcome == "signalled" and second.handle == first.handle
    weft_env.drive()
    assert first.handle.result() == ["one", "two"]


def test_the_start_signal_is_consumed_before_later_ones(weft_env):
    result = weft.start_or_signal("test.collect", 3, signal="item", payload="start", workflow_id="order",
                                  signal_id="s0")
    weft.signal("order", "item", "later-1", signal_id="s1")
    weft.signal("order", "item", "later-2")
    weft_env.drive()
    assert result.handle.result() == ["start", "later-1", "later-2"]


def test_start_or_signal_with_an_idempotency_key(weft_env):
    a = weft.start_or_signal("test.collect", 1, signal="item", payload="x", idempotency_key="k1")
    b = weft.start_or_signal("test.collect", 1, signal="item", payload="y", idempotency_key="k1")
    assert (a.outcome, b.outcome) == ("started", "signalled") and a.handle == b.handle
    assert Signal.objects.get().signal_id == "start-idem:k1"
    weft_env.drive()
    assert a.handle.result() == ["x"]
    with pytest.raises(weft.StartOrSignalConflict, match="already finished"):
        weft.start_or_signal("test.collect", 1, signal="item", idempotency_key="k1")


def test_finished_target_conflicts_unless_start_new(weft_env):
    old = weft.start_or_signal("test.collect", 1, signal="item", payload=1, workflow_id="w", signal_id="a")
    weft_env.drive()
    with pytest.raises(weft.StartOrSignalConflict, match="already finished"):
        weft.start_or_signal("test.collect", 1, signal="item", workflow_id="w", signal_id="b")
    new = weft.start_or_signal("test.collect", 1, signal="item", payload=2, workflow_id="w", signal_id="b",
                               on_terminal_conflict="start_new")
    assert new.outcome == "started" and new.handle.run_id != old.handle.run_id
    assert new.handle.run.restarted_from_id == old.handle.run_id
    weft_env.drive()
    assert new.handle.result() == [2]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one of signal_id and idempotency_key"),
    ({"signal_id": "s", "idempotency_key": "k"}, "exactly one of signal_id and idempotency_key"),
    ({"idempotency_key": "k", "workflow_id": "w"}, "not both"),
    ({"signal_id": "s", "on_terminal_conflict": "start_new"}, "explicit workflow_id"),
    ({"idempotency_key": "k", "on_terminal_conflict": "start_new"}, "explicit workflow_id"),
    ({"signal_id": "s", "debounce": 3}, r"unknown option\(s\) \['debounce'\]"),
    ({"idempotency_key": "k" * 118}, "at most 128 UTF-8 bytes"),
])
def test_start_or_signal_rejects_bad_options_and_writes_nothing(kwargs, message):
    with pytest.raises(weft.InvalidArgument, match=message):
        weft.start_or_signal("test.collect", 1, signal="item", **kwargs)
    assert Workflow.objects.count() == 0 and Signal.objects.count() == 0


def test_start_or_signal_for_an_unknown_type_writes_nothing():
    with pytest.raises(weft.WorkflowNotRegistered):
        weft.start_or_signal("no.such", 1, signal="item", signal_id="s")
    assert Workflow.objects.count() == 0


def test_weft_signal_command(weft_env):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    handle = weft.start("test.collect", 1, workflow_id="cmd")
    out = StringIO()
    call_command("weft_signal", "cmd", "item", "--payload", '{"n": 1}', "--signal-id", "x", stdout=out)
    assert "delivered" in out.getvalue()
    call_command("weft_signal", "cmd", "item", "--signal-id", "x", stdout=out)
    assert "already delivered" in out.getvalue()
    with pytest.raises(CommandError, match="not JSON"):
        call_command("weft_signal", "cmd", "item", "--payload", "{nope")
    with pytest.raises(CommandError, match="'missing'"):
        call_command("weft_signal", "missing", "item")
    weft_env.drive()
    assert handle.result() == [{"n": 1}]


@weft.workflow(name="test.signals.named_wait")
def named_wait(ctx, names):
    """Waits for a signal of each name in turn; a name given as a list waits for any of those."""
    return [ctx.wait_for_signal(name) for name in names]


@pytest.mark.parametrize(("names", "problem"), [
    (["fine", ""], "needs a signal name"),
    (["fine", "x" * 256], "needs a signal name"),
    (["fine", "bad\x00name"], "a signal name contains a NUL character"),
    (["fine", ["ok", "bad\x00"]], "a signal name contains a NUL character"),
])
def test_a_wait_for_a_name_no_database_stores_fails_the_run_every_time_it_is_asked(weft_env, names, problem):
    # Twice each: names that passed are remembered, and one that did not must be refused again.
    for attempt in range(2):
        handle = weft.start("test.signals.named_wait", names)
        weft_env.drive()
        weft.signal(handle.workflow_id, "fine", attempt)
        weft_env.drive()
        with pytest.raises(weft.WorkflowFailed, match=problem):
            handle.result()
        assert not WorkflowStep.objects.filter(run_id=handle.run_id, seq=2).exists(), "nothing recorded for it"


@weft.workflow(name="test.signals.handler_after_wait")
def handler_after_wait(ctx):
    first = ctx.wait_for_signal("go")
    ctx.set_signal_handler("go", lambda payload=None: None)
    return [first, ctx.wait_for_signal("go")]


def test_a_name_waited_for_then_given_a_handler_is_refused_at_the_next_wait(weft_env):
    handle = weft.start("test.signals.handler_after_wait")
    weft_env.drive()
    handle.signal("go", 1)
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match="consumes with a handler"):
        handle.result()
