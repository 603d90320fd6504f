"""Cleanup code in a workflow (``finally:``, ``except BaseException:``) runs for real only when the workflow really
ends (design 9.1). A run parks, stops or is handed back by unwinding its code, so those blocks run then too:
while that happens every durable call re-raises at once, nothing executes, nothing is recorded, ``ctx.logger``
is silent and ``ctx.is_parking`` is true.

Before the fix, the first test saw ``release_stock`` run three times (at the sleep's park, at the signal wait's
park, and at the end) while the journal held it once."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, StepKind, WorkflowStep
from tests.testapp.cleanup_workflows import PARKING_SEEN
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget_what_cleanup_blocks_saw():
    PARKING_SEEN.clear()


@pytest.fixture(autouse=True, params=["unwinds at each park", "stays parked"])
def stays_parked(request, settings) -> bool:
    """Each test twice: with the code unwound at every park, and kept suspended where it parked
    (runtime.sticky_runs), which unwinds nothing at a park."""
    if request.param == "unwinds at each park":
        settings.WEFT_STICKY_ROWS = 0
    return request.param == "stays parked"


def seen_at(key: str, unwinding: list[bool], stays_parked: bool) -> bool:
    """Whether the cleanup blocks of run ``key`` saw ``ctx.is_parking`` as ``unwinding`` says they do when the code
    unwinds at each park; code kept where it parked (from the run's second execution on) unwound at none of the
    parks after its first."""
    kept = unwinding[:1] + [seen for seen in unwinding[1:] if not seen]
    return PARKING_SEEN.get(key, []) == (kept if stays_parked else unwinding)


def steps_named(handle: weft.WorkflowHandle, name: str) -> list[WorkflowStep]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id, name=name).order_by("seq"))


def test_finally_runs_its_activity_once_when_the_workflow_ends_not_at_each_park(weft_env, caplog, stays_parked):
    caplog.set_level(logging.INFO, logger="django_weft.workflows.cleanup.finally")
    handle = weft.start("cleanup.finally", "order-1", workflow_id="order-1")
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    assert executions("order-1:release") == 0  # parked on the sleep: no cleanup
    weft_env.advance(timedelta(seconds=3))
    assert handle.refresh().status == RunStatus.WAITING
    assert executions("order-1:release") == 0  # parked on the signal wait: no cleanup
    assert steps_named(handle, "tests.testapp.cleanup_workflows.release_stock") == []

    handle.signal("paid", {"amount": 10})
    weft_env.drive()
    assert handle.result() == {"amount": 10}
    assert executions("order-1:hold") == 1
    assert executions("order-1:release") == 1
    [release] = steps_named(handle, "tests.testapp.cleanup_workflows.release_stock")
    assert (release.seq, release.kind, release.attempt) == (4, StepKind.ACTIVITY, 1)
    assert seen_at("order-1", [True, True, False], stays_parked)
    logged = [r.getMessage() for r in caplog.records if r.name == "django_weft.workflows.cleanup.finally"]
    assert logged == ["releasing stock for order-1"]


def test_except_base_exception_does_not_run_for_a_park_nor_a_termination(weft_env, stays_parked):
    handle = weft.start("cleanup.except_base", "order-2", workflow_id="order-2")
    weft_env.drive()
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    assert executions("order-2:release") == 0
    handle.terminate("operator")  # no workflow code runs: nothing released
    weft_env.drive()
    assert executions("order-2:release") == 0
    assert seen_at("order-2", [True], stays_parked)


def test_except_base_exception_does_not_run_when_the_workflow_returns(weft_env, stays_parked):
    handle = weft.start("cleanup.except_base", "order-3", workflow_id="order-3")
    weft_env.drive()
    handle.signal("paid", {"amount": 1})
    weft_env.drive()
    assert handle.result() == {"amount": 1}
    assert executions("order-3:release") == 0  # it returned: the except block did not run for real
    assert seen_at("order-3", [True], stays_parked)


def test_code_that_swallows_a_park_does_not_end_the_run(weft_env):
    handle = weft.start("cleanup.swallows", "sw")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING, (run.status, run.result)
    weft_env.advance(timedelta(seconds=5))
    assert handle.result() == "SW:AFTER"


def test_an_error_raised_by_cleanup_while_parking_does_not_fail_the_run(weft_env):
    handle = weft.start("cleanup.raises_instead", "ri")
    weft_env.drive()
    run = handle.refresh()
    assert run.status == RunStatus.WAITING, (run.status, run.error)
    weft_env.advance(timedelta(seconds=5))
    assert handle.result() == "RI:AFTER"


@override_settings(WEFT_MAX_HISTORY=4)
def test_the_history_limit_runs_no_cleanup(weft_env):
    handle = weft.start("cleanup.history_limit", "hl")
    weft_env.drive()
    run = handle.refresh()
    assert (run.status, run.termination_reason) == (RunStatus.TIMED_OUT, "history_limit")
    assert executions("hl:release") == 0
    assert WorkflowStep.objects.filter(run_id=handle.run_id).count() == 4


def test_continue_as_new_runs_the_cleanup_only_in_the_run_that_ends(weft_env):
    handle = weft.start("cleanup.continue_as_new", {"key": "can", "round": 0}, workflow_id="can")
    weft_env.drive()
    assert handle.result() == 1  # follows the chain
    assert executions("can:release") == 1
    first = weft.get_handle("can", run_id=handle.run_id).refresh()
    assert first.status == RunStatus.CONTINUED
    assert WorkflowStep.objects.filter(run_id=first.run_id).count() == 0
    assert PARKING_SEEN["can"] == [True, False]


def test_a_run_taken_away_mid_execution_runs_no_cleanup(weft_env):
    handle = weft.start("cleanup.lost_run", "lost")
    weft_env.drive()
    run = handle.refresh()
    assert (run.status, run.termination_reason) == (RunStatus.TIMED_OUT, "terminated")
    assert executions("lost:after") == 0
    assert executions("lost:release") == 0


def test_a_park_on_branches_runs_no_cleanup_and_records_nothing(weft_env):
    handle = weft.start("cleanup.branches", "br", workflow_id="br")
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    assert executions("br:side_effect") == 0 and executions("br:release") == 0
    kinds = list(WorkflowStep.objects.filter(run_id=handle.run_id).values_list("kind", flat=True))
    assert StepKind.SIDE_EFFECT not in kinds and StepKind.ACTIVITY not in kinds
    handle.signal("go", 7)
    weft_env.advance(timedelta(seconds=10))
    assert handle.result() == [7, None]
    assert executions("br:side_effect") == 1 and executions("br:release") == 1
    assert PARKING_SEEN["br"][-1] is False and all(PARKING_SEEN["br"][:-1])
