"""Updates and handled signals: the rules (when each is applied, what handlers may do, repeats,
transactions, timeouts, runs that continue or end), each through the public API."""

from __future__ import annotations

import pytest

import django_weft as weft
from django_weft.models import UpdateStatus, Workflow, WorkflowUpdate

pytestmark = pytest.mark.django_db


@weft.activity(name="updrules.quick_act")
def quick_act() -> str:
    return "ok"


@weft.workflow(name="updrules.late_signal_handler")
def late_signal_handler(ctx: weft.Context) -> list:
    got: list = []
    ctx.set_update_handler("noop", lambda: None)      # any handler: the inbox is looked at from the first call
    ctx.run(quick_act)
    ctx.set_signal_handler("go", got.append)          # registered after the first operation
    ctx.wait_condition(lambda: bool(got))
    return got


def test_a_handled_signal_sent_before_the_run_started_is_applied(weft_env):
    handle = weft.start("updrules.late_signal_handler")
    handle.signal("go", "now")                        # arrives before the run is first claimed
    assert handle.result() == ["now"]


@weft.workflow(name="updrules.late_update_handler")
def late_update_handler(ctx: weft.Context) -> list:
    got: list = []
    ctx.set_update_handler("noop", lambda: None)
    ctx.sleep(60)
    ctx.set_update_handler("take", lambda value: got.append(value) or len(got))
    ctx.wait_condition(lambda: bool(got))
    return got


def test_an_update_accepted_before_the_claim_whose_handler_comes_later_is_applied(weft_env):
    from datetime import timedelta

    from django_weft.common import clock

    handle = weft.start("updrules.late_update_handler")
    weft_env.drive()                                   # parked in the sleep
    clock.set_frozen(weft_env.now() + timedelta(seconds=61))   # the timer is due; no executor claimed it yet
    sent = handle.start_update("take", "x")            # validated: the replay passes the sleep and registers "take"
    weft_env.drive()
    assert sent.status == UpdateStatus.COMPLETED
    assert handle.result() == ["x"]


@weft.activity(name="updrules.meanwhile")
def meanwhile(workflow_id: str) -> str:
    # A caller sends an update while this activity runs (before the workflow's next durable call).
    weft.get_handle(workflow_id).start_update("note", "hello", update_id="during-a")
    return "a"


@weft.activity(name="updrules.last")
def last() -> str:
    return "b"


@weft.workflow(name="updrules.update_before_last_call")
def update_before_last_call(ctx: weft.Context) -> list:
    notes: list = []
    ctx.set_update_handler("note", lambda text: notes.append(text) or len(notes))
    ctx.run(meanwhile, ctx.workflow_id)
    ctx.run(last)                                     # its next durable call: the update is applied before it
    return notes


def test_an_update_that_arrived_before_the_next_durable_call_is_applied_there(weft_env):
    handle = weft.start("updrules.update_before_last_call")
    weft_env.drive()
    update = WorkflowUpdate.objects.get(update_id="during-a")
    assert (update.status, update.error) == (UpdateStatus.COMPLETED, None)
    assert handle.result() == ["hello"]


@pytest.mark.django_db(transaction=True)
def test_start_or_update_inside_a_transaction_is_refused_like_handle_update():
    from django.db import transaction

    with transaction.atomic():  # a view under ATOMIC_REQUESTS
        with pytest.raises(weft.InvalidArgument, match="transaction"):
            weft.start_or_update("updates.cart", "tx", update="add_item", payload="A1", workflow_id="cart-tx",
                                 timeout=1)


def test_a_run_failed_by_the_recovery_limit_fails_its_pending_updates(weft_env, settings):
    from datetime import timedelta

    from django_weft.models import Workflow, WorkflowStep

    handle = weft.start("updates.cart", "poison")
    weft_env.drive()                                   # waiting for its condition
    sent = handle.start_update("add_item", "A1")       # accepted, pending
    # Its executors keep dying: the next takeover is the last one WEFT_MAX_RECOVERY_ATTEMPTS allows.
    Workflow.objects.filter(pk=handle.run_id).update(
        status="running", lease_owner="dead-worker", runnable_at=weft_env.now() - timedelta(seconds=1),
        recoveries=settings.WEFT_MAX_RECOVERY_ATTEMPTS - 1,
        recovery_mark=WorkflowStep.objects.filter(run_id=handle.run_id).count())
    weft_env.drive()
    assert handle.refresh().status == "failed"
    assert sent.status == UpdateStatus.FAILED          # the run closed: it will never apply it


@weft.workflow(name="updrules.one_shot")
def one_shot(ctx: weft.Context) -> list:
    got: list = []
    ctx.set_update_handler("go", lambda value: got.append(value) or f"took {value}")
    ctx.wait_condition(lambda: bool(got))
    return got


def test_a_repeated_start_or_update_gets_the_same_reply_once_the_run_finished(weft_env):
    first = weft.start_or_update("updrules.one_shot", update="go", payload=1, update_id="req-1", workflow_id="os-1")
    assert (first.outcome, first.result) == ("started", "took 1")
    assert first.handle.result() == [1]                 # the update finished the run
    # The client's retry of the same request (its response was lost) must converge on the same update.
    again = weft.start_or_update("updrules.one_shot", update="go", payload=1, update_id="req-1", workflow_id="os-1")
    assert again.result == "took 1"


def test_a_repeated_start_or_update_with_start_new_does_not_apply_the_update_twice(weft_env):
    weft.start_or_update("updrules.one_shot", update="go", payload=1, update_id="req-2", workflow_id="os-2")
    weft.get_handle("os-2").result()
    weft.start_or_update("updrules.one_shot", update="go", payload=1, update_id="req-2", workflow_id="os-2",
                         on_terminal_conflict="start_new")
    assert WorkflowUpdate.objects.filter(update_id="req-2").count() == 1


@weft.workflow(name="updrules.switch")
def switch(ctx: weft.Context, phase: int | None = None) -> list:
    seen: list = []
    if phase is None:
        ctx.set_update_handler("old", lambda value: seen.append(value))
        ctx.wait_for_signal("roll")
        ctx.continue_as_new(2)
    ctx.set_update_handler("new", lambda value: seen.append(value) or len(seen))
    ctx.wait_condition(lambda: bool(seen))
    return seen


def test_an_update_validated_against_a_run_that_continued_meanwhile_does_not_block_the_next_run(weft_env,
                                                                                                monkeypatch):
    from django_weft.services import updates

    handle = weft.start("updrules.switch", workflow_id="switch-1")
    weft_env.drive()
    validate = updates.validate

    def validate_then_the_run_continues(run, name, payload, **kwargs):
        validate(run, name, payload, **kwargs)          # accepted by phase 1, which has "old"
        handle.signal("roll")
        weft_env.drive()                                # meanwhile the run continued as new (phase 2)

    monkeypatch.setattr(updates, "validate", validate_then_the_run_continues)
    old = handle.start_update("old", "o")  # validated again on phase 2, which handles others: held there
    monkeypatch.setattr(updates, "validate", validate)
    new = weft.get_handle("switch-1").start_update("new", "n")
    weft_env.drive()
    with pytest.raises(weft.UpdateNotHandled, match="no update handler 'old'"):
        old.result()
    assert new.status == UpdateStatus.COMPLETED


def test_a_moved_update_the_next_run_has_no_handler_for_fails_and_does_not_hold_back_the_rest(weft_env):
    from django.utils import timezone

    from django_weft.common.codec import encode

    handle = weft.start("updates.roller", workflow_id="roller-2")  # its first run takes no updates
    weft_env.drive()
    run = Workflow.objects.get(pk=handle.run_id)
    # Two updates that reached the first run as it continued (stored by hand: its code has no handlers).
    for offset, (name, update_id) in enumerate([("never", "n-1"), ("later", "l-1")], start=1):
        WorkflowUpdate.objects.create(run=run, name=name, update_id=update_id, payload=encode("v"),
                                      sequence=run.inbox_seq + offset, received_at=timezone.now())
    Workflow.objects.filter(pk=run.pk).update(inbox_seq=run.inbox_seq + 2)
    handle.signal("roll")
    weft_env.drive()
    never, later = WorkflowUpdate.objects.order_by("sequence")
    assert never.status == UpdateStatus.FAILED and "no update handler 'never' where it waits" in never.error["message"]
    assert later.status == UpdateStatus.COMPLETED  # held back only until "never" failed
    assert handle.result() == ["v"]


@weft.workflow(name="updrules.restart_in_handler")
def restart_in_handler(ctx: weft.Context, carried: int | None = None) -> int:
    state = {"n": carried or 0}
    ctx.set_update_handler("restart", lambda: ctx.continue_as_new(state["n"] + 1))  # refused in a handler
    ctx.wait_condition(lambda: False)
    return state["n"]


def test_continue_as_new_in_an_update_handler_is_refused(weft_env, monkeypatch):
    from django_weft.store import transitions

    handle = weft.start("updrules.restart_in_handler", workflow_id="restart-1")
    weft_env.drive()
    sent = handle.start_update("restart")
    continued = transitions.continue_as_new
    calls = []

    def counting(*args, **kwargs):  # without this guard the next drive never returns
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError(f"continued as new {len(calls)} times for one update: the pending update "
                               "moves to each next run, which applies it again")
        continued(*args, **kwargs)

    monkeypatch.setattr(transitions, "continue_as_new", counting)
    weft_env.drive()
    with pytest.raises(weft.UpdateFailed, match="cannot continue the run as new"):
        sent.result()


@weft.workflow(name="updrules.patched_in_handler")
def patched_in_handler(ctx: weft.Context) -> list:
    items: list = []

    def add(sku: str) -> int:
        items.append(sku.upper() if ctx.patched("upper-skus") else sku)  # a handler's behaviour changed behind a patch
        return len(items)

    ctx.set_query_handler("items", lambda: list(items))
    ctx.set_update_handler("add", add)
    ctx.wait_condition(lambda: len(items) >= 2)
    return items


def test_ctx_patched_in_an_update_handler_is_recorded_in_the_handlers_positions(weft_env):
    handle = weft.start("updrules.patched_in_handler")
    weft_env.drive()
    assert handle.update("add", "a1") == 1
    assert handle.query("items") == ["A1"], "a query replays the handler with its marker"
    assert handle.update("add", "b2") == 2
    assert handle.result() == ["A1", "B2"]


def test_a_bad_timeout_is_refused_before_the_update_is_stored(weft_env):
    handle = weft.start("updates.cart", "neg")
    weft_env.drive()
    with pytest.raises(weft.InvalidArgument):
        handle.update("add_item", "A1", timeout=-1)
    assert not WorkflowUpdate.objects.exists()          # "validates, stores and waits": nothing stored
    with pytest.raises(weft.InvalidArgument):
        weft.start_or_update("updates.cart", "neg2", update="add_item", payload="A1", workflow_id="cart-neg2",
                             timeout="soon")
    assert not WorkflowUpdate.objects.exists() and not Workflow.objects.filter(workflow_id="cart-neg2").exists()


@weft.activity(name="updrules.approval")
def approval() -> str:
    weft.complete_async()                                 # completed by a person, days later


@weft.workflow(name="updrules.poke_while_approving")
def poke_while_approving(ctx: weft.Context) -> list:
    pokes: list = []
    ctx.start_activity(approval)                          # a branch waiting for its async completion
    ctx.set_update_handler("poke", lambda: pokes.append(1) or len(pokes))
    ctx.wait_condition(lambda: bool(pokes))
    return pokes


def test_an_update_to_a_run_past_a_waiting_async_branch_is_accepted(weft_env):
    handle = weft.start("updrules.poke_while_approving")
    weft_env.drive()
    assert "condition" in handle.refresh().wait_reason    # the run is parked past the branch, "poke" registered
    assert handle.update("poke") == 1


@weft.workflow(name="updrules.ready_flag")
def ready_flag(ctx: weft.Context) -> dict:
    state = {"ready": False}

    def on_ready(payload):                                # "consumes signals name with fn(payload)"
        state["ready"] = True

    ctx.set_signal_handler("ready", on_ready)
    ctx.wait_condition(lambda: state["ready"])
    return state


def test_a_handled_signal_without_payload_calls_the_handler_with_none(weft_env):
    handle = weft.start("updrules.ready_flag")
    weft_env.drive()
    handle.signal("ready")                                # no payload: the run must not fail with a TypeError
    assert handle.result() == {"ready": True}


@pytest.mark.django_db(transaction=True)
def test_a_handled_signal_sent_before_the_first_claim_is_applied_by_maintenance_passes():
    import time

    handle = weft.start("updrules.late_signal_handler")
    handle.signal("go", "now")
    deadline = time.monotonic() + 5
    while not handle.refresh().is_finished and time.monotonic() < deadline:
        weft.run_maintenance()                            # what a weft_maintenance loop does
        time.sleep(0.3)
    run = handle.refresh()
    assert run.is_finished, f"still {run.status} ({run.wait_reason}), runnable_at={run.runnable_at}"
