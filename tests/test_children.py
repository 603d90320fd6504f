"""Child workflows: deterministic ids, waiting for results, failures, parent close policies."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import Workflow
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


def children_of(handle):
    return list(Workflow.objects.filter(parent_id=handle.run_id))


def test_run_child_waits_for_the_childs_result(weft_env):
    handle = weft.start("test.parent", {"key": "p1", "sleep": 60})
    weft_env.drive()
    [child] = children_of(handle)
    assert child.workflow_id == f"{handle.run_id}:1" and child.status == "waiting"
    assert handle.refresh().status == "waiting"
    weft_env.advance(timedelta(seconds=60))
    assert handle.result() == "child p1 done"
    assert executions("p1:child") == 2  # the child's own body replays once after its sleep
    assert executions("p1:parent-after") == 1
    assert len(children_of(handle)) == 1, "replaying the parent re-attaches to its child"


def test_a_child_failure_raises_in_the_parent(weft_env):
    handle = weft.start("test.parent", {"key": "p2", "fail": True})
    weft_env.drive()
    assert handle.result() == "child failed: failed"
    [child] = children_of(handle)
    assert child.status == "failed" and "child p2 failed" in child.error["message"]


def test_cancelling_the_parent_terminates_its_children(weft_env):
    handle = weft.start("test.fire_and_forget", {"key": "t", "sleep": 600, "policy": "terminate"})
    weft_env.drive()
    [child] = children_of(handle)
    assert child.status == "waiting"
    handle.cancel("stop everything")
    weft_env.drive()
    child.refresh_from_db()
    assert child.status == "cancelled" and "terminated: parent run" in child.error["message"]


def test_request_cancel_cancels_an_idle_child(weft_env):
    handle = weft.start("test.fire_and_forget", {"key": "r", "sleep": 600, "policy": "request_cancel"})
    weft_env.drive()
    handle.cancel()
    weft_env.drive()  # the parent ends cancelled, then its child's code sees the cancel it requested
    [child] = children_of(handle)
    assert child.status == "cancelled" and "cancel requested" in child.error["message"]


def test_abandoned_children_outlive_their_parent(weft_env):
    handle = weft.start("test.fire_and_forget", {"key": "a", "sleep": 600, "policy": "abandon"})
    weft_env.drive()
    handle.cancel()
    [child] = children_of(handle)
    assert child.status == "waiting"
    weft_env.advance(timedelta(seconds=600))
    child.refresh_from_db()
    assert child.status == "completed"


def test_a_parent_that_finishes_applies_the_policy_too(weft_env):
    handle = weft.start("test.fire_and_forget",
                        {"key": "f", "sleep": 600, "policy": "terminate", "parent_sleep": 10})
    weft_env.drive()
    weft_env.advance(timedelta(seconds=10))
    assert handle.status == "completed"
    [child] = children_of(handle)
    assert child.status == "cancelled"


def test_cancelling_a_child_wakes_the_waiting_parent(weft_env):
    handle = weft.start("test.parent", {"key": "w", "sleep": 600})
    weft_env.drive()
    [child] = children_of(handle)
    weft.cancel(child.workflow_id, reason="operator")
    weft_env.drive()  # the child ends cancelled, which wakes its parent
    assert handle.result() == "child failed: cancelled"


def test_bad_parent_close_policy_fails_the_parent_with_a_clear_error(weft_env):
    handle = weft.start("test.fire_and_forget", {"key": "b", "policy": "explode"})
    weft_env.drive()
    with pytest.raises(weft.WorkflowFailed, match="parent_close_policy must be one of"):
        handle.result()
    assert children_of(handle) == []


@pytest.mark.django_db(transaction=True)
def test_request_cancel_lets_a_busy_child_finish_its_steps_then_cancels_it(weft_env):
    handle = weft.start("test.parent_of_busy_child", "busy", workflow_id="busy-parent")
    weft_env.drive()
    assert handle.status == "cancelled"
    [child] = children_of(handle)
    assert child.status == "cancelled" and "cancel requested: parent run" in child.error["message"]
    assert executions("busy:after-cancel") == 1, "the step in progress when the cancel came commits"
    weft_env.advance(timedelta(seconds=60))
    assert executions("busy:never") == 0
