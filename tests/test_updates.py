"""Updates (handle.update, start_update, start_or_update), handled signals and wait_condition."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import Signal, StepKind, UpdateStatus, Workflow, WorkflowStep, WorkflowUpdate

pytestmark = pytest.mark.django_db


def journal(handle) -> list[tuple[str, str, str]]:
    return [(s.kind, s.name, s.status) for s in WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq")]


def test_an_update_replies_once_the_run_applied_it_and_the_state_survives_replay(weft_env):
    handle = weft.start("updates.cart", "ann")
    weft_env.drive()
    assert handle.update("add_item", "A1") == 1
    assert handle.update("add_item", "B2") == 2
    assert handle.query("items") == ["A1", "B2"]  # rebuilt by replaying the journal, updates included
    assert handle.update("add_item", "C3") == 3
    assert handle.result() == {"items": ["A1", "B2", "C3"], "receipt": "charged 15"}
    kinds = [k for k, _, _ in journal(handle)]
    assert kinds.count(StepKind.UPDATE) == 3 and kinds[0] == StepKind.CONDITION
    assert list(WorkflowUpdate.objects.filter(run_id=handle.run_id).values_list("status", flat=True)) == [
        UpdateStatus.COMPLETED] * 3


def test_a_validator_rejects_before_anything_is_written(weft_env):
    handle = weft.start("updates.cart", "bob")
    weft_env.drive()
    run = Workflow.objects.get(pk=handle.run_id)
    with pytest.raises(weft.UpdateRejected, match="rejected by its validator: ValueError: unknown sku 'Z9'"):
        handle.update("add_item", "Z9")
    assert not WorkflowUpdate.objects.exists()
    after = Workflow.objects.get(pk=handle.run_id)
    assert (after.inbox_seq, after.fence, after.status) == (run.inbox_seq, run.fence, run.status)


def test_an_update_the_code_has_no_handler_for_is_held_then_not_handled(weft_env):
    handle = weft.start("updates.cart", "cy")
    weft_env.drive()
    # Held, not refused at once (the code may register its handler before it next waits); the run reached its
    # wait without it, so it answers UpdateNotHandled, naming the handlers it has.
    with pytest.raises(weft.UpdateNotHandled, match="no update handler 'remove' where it waits") as caught:
        handle.update("remove", "A1")
    assert caught.value.registered == ["add_item", "clear", "durable"]
    assert isinstance(caught.value, weft.UpdateRejected)
    assert WorkflowUpdate.objects.get().status == "failed"
    assert handle.update("add_item", "A1") == 1, "the run goes on"


def test_a_handler_that_raises_is_update_failed_and_the_run_goes_on(weft_env):
    handle = weft.start("updates.cart", "dee")
    weft_env.drive()
    assert handle.update("add_item", "A1") == 1
    with pytest.raises(weft.UpdateFailed, match="A1 is already in the cart") as caught:
        handle.update("add_item", "A1")
    assert caught.value.error["type"] == "ValueError"
    assert handle.status == "waiting"
    assert handle.update("add_item", "B2") == 2


def test_a_handler_may_make_durable_calls(weft_env):
    handle = weft.start("updates.cart", "eve")
    weft_env.drive()
    assert handle.update("durable") == weft_env.now()  # ctx.now(), recorded in the handler's own positions
    assert handle.status == "waiting"
    assert handle.update("add_item", "A1") == 1


def test_an_update_without_payload_calls_the_handler_with_nothing(weft_env):
    handle = weft.start("updates.cart", "fay")
    weft_env.drive()
    handle.update("add_item", "A1")
    assert handle.update("clear") is None
    assert handle.query("items") == []


def test_the_same_update_id_is_one_update_with_one_reply(weft_env):
    handle = weft.start("updates.cart", "gus")
    weft_env.drive()
    assert handle.update("add_item", "A1", update_id="u-1") == 1
    assert handle.update("add_item", "A1", update_id="u-1") == 1  # a retry: not applied again
    assert handle.start_update("add_item", "A1", update_id="u-1").result() == 1
    assert WorkflowUpdate.objects.count() == 1
    assert handle.query("items") == ["A1"]


def test_start_update_returns_a_handle_and_result_waits_for_the_reply(weft_env):
    handle = weft.start("updates.cart", "hal")
    weft_env.drive()
    sent = handle.start_update("add_item", "B2", update_id="mine")
    assert sent.update_id == "mine" and sent.status == "pending"
    assert sent.result() == 1 and sent.status == "completed"


def test_updates_to_a_finished_run_raise_workflow_closed_and_write_nothing(weft_env):
    handle = weft.start("updates.quick")
    assert handle.result() == "done"
    with pytest.raises(weft.WorkflowClosed, match="cannot receive update 'late'"):
        handle.update("late")
    assert not WorkflowUpdate.objects.exists()


def test_an_update_still_pending_when_the_run_ends_fails_clearly(weft_env):
    handle = weft.start("updates.sleeper")
    weft_env.drive()
    sent = handle.start_update("log", "x")
    handle.cancel("closing")
    with pytest.raises(weft.UpdateFailed, match="ended"):
        sent.result()
    assert WorkflowUpdate.objects.get().status == UpdateStatus.FAILED


def test_updates_apply_at_once_while_the_run_sleeps_and_the_sleep_keeps_its_deadline(weft_env):
    handle = weft.start("updates.sleeper")
    weft_env.drive()
    assert handle.update("log", "a") == 1
    weft_env.advance(timedelta(minutes=30))
    assert handle.update("log", "b") == 2
    assert handle.status == "waiting"
    weft_env.advance(timedelta(minutes=31))
    assert handle.result() == ["a", "b", "woke"]


def test_wait_condition_times_out_with_false(weft_env):
    handle = weft.start("updates.cart", "ivy")
    weft_env.drive()
    handle.update("add_item", "A1")
    weft_env.advance(timedelta(days=1, seconds=1))
    assert handle.result() == {"items": ["A1"], "abandoned": True}


def test_updates_and_handled_signals_apply_in_arrival_order(weft_env):
    handle = weft.start("updates.counter")
    weft_env.drive()
    first = handle.start_update("bump", 1)
    handle.signal("note", "n1")
    second = handle.start_update("bump", 2)
    handle.signal("note", "n2")
    assert (first.result(), second.result()) == (1, 3)
    handle.signal("stop")
    assert handle.result() == [1, "note:n1", 2, "note:n2"]
    assert Signal.objects.filter(run_id=handle.run_id, consumed_at__isnull=True).count() == 0


def test_handled_signals_wake_a_wait_condition(weft_env):
    handle = weft.start("updates.flags")
    weft_env.drive()
    handle.signal("note", "hello")
    weft_env.drive()
    assert handle.status == "waiting"
    handle.signal("ready")
    assert handle.result() == {"ready": True, "notes": ["hello"]}


def test_wait_for_signal_on_a_handled_name_is_a_clear_error(weft_env):
    @weft.workflow(name="updates.confused")
    def confused(ctx):
        ctx.set_signal_handler("go", lambda payload=None: None)
        ctx.wait_for_signal("go")

    handle = weft.start("updates.confused")
    with pytest.raises(weft.WorkflowFailed, match="consumes with a handler"):
        handle.result()


def test_the_logger_is_silent_while_a_handler_replays(weft_env, caplog):
    handle = weft.start("updates.cart", "jo")
    weft_env.drive()
    with caplog.at_level(logging.INFO, logger="django_weft.workflows"):
        handle.update("add_item", "A1")
        handle.update("add_item", "B2")
    added = [r.getMessage() for r in caplog.records if r.getMessage().startswith("added")]
    assert added == ["added A1", "added B2"]


def test_start_or_update_starts_the_run_with_its_first_update(weft_env):
    first = weft.start_or_update("updates.cart", "kim", update="add_item", payload="A1", workflow_id="cart-kim")
    assert first.outcome == "started" and first.result == 1
    again = weft.start_or_update("updates.cart", "kim", update="add_item", payload="B2", workflow_id="cart-kim")
    assert again.outcome == "updated" and again.result == 2 and again.handle == first.handle
    assert Workflow.objects.filter(workflow_id="cart-kim").count() == 1


def test_start_or_update_rejected_writes_nothing(weft_env):
    with pytest.raises(weft.UpdateRejected, match="unknown sku"):
        weft.start_or_update("updates.cart", "lee", update="add_item", payload="Q1", workflow_id="cart-lee")
    assert not Workflow.objects.exists() and not WorkflowUpdate.objects.exists()


def test_start_or_update_on_a_finished_run(weft_env):
    handle = weft.start("updates.quick", workflow_id="q-1")
    handle.result()
    with pytest.raises(weft.WorkflowClosed, match="start_new"):
        weft.start_or_update("updates.quick", update="late", workflow_id="q-1")
    with pytest.raises(weft.UpdateFailed, match="ended"):
        weft.start_or_update("updates.quick", update="late", workflow_id="q-1", on_terminal_conflict="start_new")
    assert Workflow.objects.filter(workflow_id="q-1").count() == 2


@pytest.mark.parametrize("bad, message", [
    ({"name": ""}, "an update name must be a non-empty string"),
    ({"update_id": ""}, "update_id must be a non-empty string"),
    ({"update_id": "x" * 129}, "update_id must be at most 128"),
    ({"payload": object()}, "payload of update"),
])
def test_bad_update_arguments_are_clear_errors(weft_env, bad, message):
    handle = weft.start("updates.cart", "max")
    weft_env.drive()
    args = {"name": "add_item", "payload": "A1", **bad}
    with pytest.raises((weft.InvalidArgument, weft.PayloadError), match=message):
        handle.update(args.pop("name"), args.pop("payload"), **args)
    assert not WorkflowUpdate.objects.exists()


def test_a_repeated_update_id_gets_its_reply_even_after_the_run_finished(weft_env):
    handle = weft.start("updates.cart", "ned")
    weft_env.drive()
    assert handle.update("add_item", "A1", update_id="first") == 1
    handle.update("add_item", "B2")
    handle.update("add_item", "C3")
    assert handle.result()["items"] == ["A1", "B2", "C3"]
    assert handle.update("add_item", "A1", update_id="first") == 1  # a client's late retry
    with pytest.raises(weft.WorkflowClosed):
        handle.update("add_item", "A1", update_id="new")


def test_a_failed_update_step_has_the_application_failure_category(weft_env):
    handle = weft.start("updates.cart", "oz")
    weft_env.drive()
    handle.update("add_item", "A1")
    with pytest.raises(weft.UpdateFailed):
        handle.update("add_item", "A1")
    failed = WorkflowStep.objects.get(run_id=handle.run_id, kind=StepKind.UPDATE, status="failed")
    assert failed.failure_category == "application"
