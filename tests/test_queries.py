"""Queries answered from the journal (nothing executed, nothing written) and the replay-safe ctx.logger."""

from __future__ import annotations

import logging

import pytest

import django_weft as weft
from django_weft.models import Signal, Workflow, WorkflowStep

pytestmark = pytest.mark.django_db


def snapshot(handle) -> tuple:
    run = Workflow.objects.get(pk=handle.run_id)
    return (run.status, run.fence, run.updated_at, WorkflowStep.objects.filter(run=run).count(),
            Signal.objects.filter(run=run, consumed_at__isnull=True).count())


def test_a_query_rebuilds_the_state_of_a_waiting_run_and_writes_nothing(weft_env):
    handle = weft.start("queries.cart", "ann")
    handle.signal("add", "A1")
    handle.signal("add", "B2")
    weft_env.drive()
    before = snapshot(handle)
    assert handle.query("items") == ["A1", "B2"]
    assert handle.query("total") == 8
    assert handle.query("has", "B2") is True and handle.query("has", "C3") is False
    assert snapshot(handle) == before


def test_a_query_answers_from_what_is_recorded_only(weft_env):
    handle = weft.start("queries.cart", "bob")
    handle.signal("add", "A1")
    weft_env.drive()
    handle.signal("add", "B2")  # delivered, not consumed yet: not part of the run's state
    assert handle.query("items") == ["A1"]


def test_a_finished_run_answers_queries(weft_env):
    handle = weft.start("queries.cart", "cy")
    handle.signal("add", "A1")
    handle.signal("checkout")
    weft_env.drive()
    assert handle.result() == {"items": ["A1"], "total": 3}
    assert handle.query("items") == ["A1"] and handle.query("total") == 3


def test_an_unknown_query_names_the_handlers_the_code_registers(weft_env):
    handle = weft.start("queries.cart", "dee")
    weft_env.drive()
    with pytest.raises(weft.QueryNotFound, match="no query handler 'size'") as caught:
        handle.query("size")
    assert caught.value.registered == ["broken", "has", "items", "total", "unencodable"]


def test_a_handler_that_raises_or_answers_what_cannot_be_stored_is_query_failed(weft_env):
    handle = weft.start("queries.cart", "eve")
    weft_env.drive()
    with pytest.raises(weft.QueryFailed, match="ZeroDivisionError"):
        handle.query("broken")
    with pytest.raises(weft.QueryFailed, match="the answer to query 'unencodable'"):
        handle.query("unencodable")
    assert handle.query("items") == []  # the run is untouched


def test_ctx_logger_logs_each_line_once_per_run_with_the_runs_identity(weft_env, caplog):
    caplog.set_level(logging.INFO, logger="django_weft.workflows")
    handle = weft.start("queries.cart", "fay")
    weft_env.drive()
    handle.signal("add", "A1")
    weft_env.drive()  # a replay re-walks "opened": it is not logged again
    handle.signal("checkout")
    weft_env.drive()
    handle.query("items")  # a query's replay logs nothing either
    lines = [r.getMessage() for r in caplog.records if r.name == "django_weft.workflows.queries.cart"]
    assert lines == ["cart of fay opened", "added A1", "checked out 1 item(s)"]
    record = next(r for r in caplog.records if r.getMessage() == "added A1")
    assert (record.workflow_id, record.run_id) == (handle.workflow_id, str(handle.run_id))
    assert record.seq == 2  # the activity it follows


def test_a_run_an_executor_holds_right_now_answers_from_what_it_committed(weft_env):
    handle = weft.start("queries.cart", "gus")
    handle.signal("add", "A1")
    weft_env.drive()
    # Held by an executor in the middle of its next step (its lease still running): the query reads the
    # committed journal and touches nothing of the executor's.
    Workflow.objects.filter(pk=handle.run_id).update(status="running", lease_owner="another-host:1",
                                                     runnable_at=weft_env.now())
    before = snapshot(handle)
    assert handle.query("items") == ["A1"]
    assert snapshot(handle) == before
