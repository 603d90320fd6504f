"""The Django signals for activities and for signals sent to runs: each sent once, after the commit that
caused it, with the arguments django_weft.signals documents, and never for a rolled-back or refused write."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import transaction

import django_weft as weft
from django_weft import signals
from django_weft.models import Signal, Workflow, WorkflowStep

pytestmark = pytest.mark.django_db(transaction=True)  # the signals wait for real commits

RECORD = "tests.testapp.workflows.record"
FLAKY = "tests.testapp.workflows.flaky"


@pytest.fixture
def received() -> Iterator[dict[str, list[dict]]]:
    """Every new signal's calls, by signal name: the keyword arguments of each, plus whether a transaction
    was open when it was sent (it must not be: they are sent after commit)."""
    calls: dict[str, list[dict]] = {}
    names = ["activity_started", "activity_completed", "activity_failed", "signal_received", "signal_consumed"]
    for name in names:
        def receiver(sender, signal, _name=name, **kwargs):
            calls.setdefault(_name, []).append({**kwargs, "sender": sender,
                                                "in_atomic": transaction.get_connection().in_atomic_block})
        getattr(signals, name).connect(receiver, weak=False, dispatch_uid=f"test-{name}")
    yield calls
    for name in names:
        getattr(signals, name).disconnect(dispatch_uid=f"test-{name}")


def test_an_activity_sends_started_then_completed_once_each(weft_env, received):
    handle = weft.start("test.steps", {"key": "s1", "count": 1})
    weft_env.drive()
    [started] = received["activity_started"]
    [completed] = received["activity_completed"]
    run = Workflow.objects.get(pk=handle.run_id)
    assert started["sender"] is Workflow and started["run"].pk == run.pk
    assert (started["activity"], started["seq"], started["attempt"]) == (RECORD, 1, 1)
    assert (completed["activity"], completed["seq"], completed["attempt"]) == (RECORD, 1, 1)
    step = completed["step"]
    assert isinstance(step, WorkflowStep) and step.pk == WorkflowStep.objects.get(run=run, seq=1).pk
    assert not completed["in_atomic"] and "activity_failed" not in received


def test_a_failed_attempt_says_whether_it_is_retried(weft_env, received):
    weft.start("test.retry", {"key": "s2", "failures": 1})
    weft_env.drive()
    [failed] = received["activity_failed"]
    assert (failed["activity"], failed["attempt"], failed["will_retry"]) == (FLAKY, 1, True)
    assert failed["error"]["type"] == "tests.testapp.workflows.Flaky" and "activity_completed" not in received
    weft_env.advance(timedelta(seconds=2))
    [completed] = received["activity_completed"]
    assert (completed["activity"], completed["attempt"]) == (FLAKY, 2)
    assert [c["attempt"] for c in received["activity_started"]] == [1, 2]
    assert len(received["activity_failed"]) == 1


def test_the_last_failed_attempt_is_not_retried(weft_env, received):
    weft.start("test.uncaught", "s3")
    weft_env.drive()
    [failed] = received["activity_failed"]
    assert failed["will_retry"] is False and failed["step"].status == "failed"
    assert failed["error"]["type"].endswith("ValueError")


def test_an_attempt_whose_commit_is_refused_completes_nothing(weft_env, received):
    # The activity terminates its own run, so the executor's commit of its result is refused (FencingError).
    handle = weft.start("test.terminated_mid_step", "s4", workflow_id="s4")
    weft_env.drive()
    assert handle.status == "timed_out"
    assert [c["activity"] for c in received["activity_started"]] == [
        RECORD, "tests.testapp.workflows.terminate_own_run"]
    assert [c["activity"] for c in received["activity_completed"]] == [RECORD]


def test_a_signal_is_announced_when_stored_and_when_consumed(weft_env, received):
    handle = weft.start("test.approval", "s5")
    weft_env.drive()
    with transaction.atomic():
        weft.signal(handle.workflow_id, "approval", "yes", signal_id="once")
        assert "signal_received" not in received, "sent before the commit"
    weft.signal(handle.workflow_id, "approval", "again", signal_id="once")  # a duplicate: stores nothing
    [stored] = received["signal_received"]
    assert stored["name"] == "approval" and stored["run"].pk == handle.run_id and not stored["in_atomic"]
    assert stored["signal_pk"] == stored["record"].pk == Signal.objects.get().pk and stored["signal_id"] == "once"
    assert "signal_consumed" not in received
    weft_env.drive()
    [consumed] = received["signal_consumed"]
    assert (consumed["name"], consumed["signal_pk"], consumed["run"].pk) == ("approval", stored["signal_pk"],
                                                                           handle.run_id)
    assert consumed["seq"] == WorkflowStep.objects.get(run_id=handle.run_id, kind="signal").seq


def test_a_signal_in_a_rolled_back_transaction_is_not_announced(weft_env, received):
    handle = weft.start("test.approval", "s6")
    weft_env.drive()
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.signal(handle.workflow_id, "approval", "yes")
        raise RuntimeError("the view failed")
    weft_env.drive()
    assert "signal_received" not in received and "signal_consumed" not in received
    assert Signal.objects.count() == 0


def test_a_run_executed_inside_a_rolled_back_transaction_announces_no_activity(weft_env, received):
    weft.start("test.steps", {"key": "s7", "count": 1})
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.run_maintenance()
        raise RuntimeError("rolled back")
    assert "activity_completed" not in received and "activity_started" not in received
    weft_env.drive()
    assert len(received["activity_completed"]) == 1
