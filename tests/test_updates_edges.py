"""Updates at the edges: suspended runs, continue-as-new, transactions, oversized payloads."""

from __future__ import annotations

import pytest
from django.utils import timezone

import django_weft as weft
from django_weft.common.codec import encode
from django_weft.models import RunStatus, UpdateStatus, Workflow, WorkflowUpdate

pytestmark = pytest.mark.django_db


def test_an_update_to_a_suspended_run_is_applied_once_it_resumes(weft_env):
    handle = weft.start("updates.cart", "sue")
    weft_env.drive()
    handle.suspend("hold on")
    sent = handle.start_update("add_item", "A1")
    weft_env.drive()
    assert sent.status == UpdateStatus.PENDING and handle.status == RunStatus.SUSPENDED
    handle.resume()
    assert sent.result() == 1
    assert handle.query("items") == ["A1"]


def test_a_pending_update_moves_with_continue_as_new_and_the_next_run_applies_it(weft_env):
    first = weft.start("updates.roller", workflow_id="roller")
    weft_env.drive()
    run = Workflow.objects.get(pk=first.run_id)
    # Arrived while the first run was executing its last step (it has no handler for it yet).
    WorkflowUpdate.objects.create(run=run, name="later", update_id="u-1", payload=encode("v"),
                                  sequence=run.inbox_seq + 1, received_at=timezone.now())
    Workflow.objects.filter(pk=run.pk).update(inbox_seq=run.inbox_seq + 1)
    first.signal("roll")
    weft_env.drive()
    moved = WorkflowUpdate.objects.get()
    assert moved.run_id != first.run_id and moved.status == UpdateStatus.COMPLETED
    assert first.result() == ["v"]
    assert weft.get_handle("roller").start_update("later", "v", update_id="u-1").result() == 1  # the same update


def test_waiting_for_a_reply_inside_an_uncommitted_transaction_is_refused_and_writes_nothing():
    # A plain django_db test runs inside a transaction, as a view under ATOMIC_REQUESTS would.
    handle = weft.start("updates.cart", "tx")
    weft.run_maintenance()
    with pytest.raises(weft.InvalidArgument, match="non_atomic_requests"):
        handle.update("add_item", "A1")
    assert not WorkflowUpdate.objects.exists()
    sent = handle.start_update("add_item", "A1")  # storing it inside the transaction is fine
    assert sent.status == UpdateStatus.PENDING


def test_an_oversized_update_payload_is_refused_before_anything_is_written(weft_env, settings):
    settings.WEFT_MAX_PAYLOAD_BYTES = 1000
    handle = weft.start("updates.cart", "big")
    weft_env.drive()
    with pytest.raises(weft.PayloadTooLarge):
        handle.update("add_item", "A" * 5000)
    assert not WorkflowUpdate.objects.exists()


def test_an_update_to_an_unknown_run_is_workflow_not_found(weft_env):
    handle = weft.start("updates.cart", "gone")
    weft_env.drive()
    Workflow.objects.filter(pk=handle.run_id).delete()
    with pytest.raises(weft.WorkflowNotFound):
        handle.update("add_item", "A1")


def test_updates_are_refused_by_a_run_whose_code_does_not_take_them(weft_env):
    handle = weft.start("updates.flags")
    weft_env.drive()
    with pytest.raises(weft.UpdateRejected, match="registers no update handler where it is"):
        handle.update("anything")


def test_an_exported_history_with_updates_replays_and_a_renamed_handler_is_caught(weft_env, tmp_path):
    import json

    from django.core.management import call_command

    from django_weft.testing import replay
    from tests.testapp import update_workflows

    handle = weft.start("updates.deployed")
    weft_env.drive()
    handle.update("add", "A1")
    path = tmp_path / "history.json"
    call_command("weft_export_history", str(handle.run_id), "--output", str(path), stdout=open(tmp_path / "o", "w"))
    assert [s["kind"] for s in json.loads(path.read_text())["steps"]] == ["condition", "update"]
    WorkflowUpdate.objects.all().delete()  # the journal alone replays it
    replay(path)
    update_workflows.deployed["version"] = 2
    try:
        with pytest.raises(weft.NonDeterminismError, match="applied update 'add' there") as caught:
            replay(path)
        assert caught.value.seq == 2
    finally:
        update_workflows.deployed["version"] = 1


@pytest.mark.parametrize("how", ["race", "gather"])
def test_a_run_parked_in_a_race_or_a_gather_applies_an_update_at_once(weft_env, how):
    handle = weft.start("updates.racer", how)
    weft_env.drive()
    assert handle.update("log", "a") == 1
    handle.signal("go")
    if how == "gather":
        from datetime import timedelta

        weft_env.advance(timedelta(hours=1, seconds=1))
    assert handle.result() == ["a"]
