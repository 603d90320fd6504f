"""OpenTelemetry: a run remembers the trace that started it and links its executions to it (and to the
traces of the signals it consumes), across processes too; activity attempts are children of the execution;
a schedule tick is a span, and the runs it starts link to it."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from opentelemetry import trace

import django_weft as weft
from django_weft.models import Signal, Workflow, WorkflowStep
from tests import tracing_setup
from tests.procs import REPO_ROOT, process_env
from tests.tracing_setup import ids, linked, spans, tracer

RECORD = "weft.activity tests.testapp.workflows.record"


@pytest.fixture(autouse=True)
def exporter():
    tracing_setup.EXPORTER.clear()
    tracing_setup.PROCESSOR.recording = True
    yield tracing_setup.EXPORTER
    tracing_setup.PROCESSOR.recording = False
    tracing_setup.EXPORTER.clear()


@pytest.mark.django_db
def test_the_execution_links_to_the_request_that_started_it_and_attempts_are_its_children(weft_env):
    with tracer.start_as_current_span("request") as request:
        handle = weft.start("test.steps", {"key": "t1", "count": 2})
    stored = Workflow.objects.get(pk=handle.run_id).trace_context
    assert f"{request.get_span_context().trace_id:032x}" in stored["traceparent"]
    weft_env.drive()
    [execution] = spans("weft.run test.steps")
    assert linked(execution) == {ids(request)}
    assert execution.context.trace_id != request.get_span_context().trace_id  # its own trace, linked
    assert execution.attributes["weft.run_id"] == str(handle.run_id)
    assert execution.attributes["weft.outcome"] == "completed"
    attempts = spans(RECORD)
    assert len(attempts) == 2
    assert all(a.parent is not None and a.parent.span_id == ids(execution)[1] for a in attempts)
    assert [a.attributes["weft.seq"] for a in attempts] == [1, 2]


@pytest.mark.django_db
def test_an_execution_inside_a_current_span_is_still_its_own_trace(weft_env):
    # A Celery task's span, or a test's: the execution links to the starter, it is not that span's child.
    with tracer.start_as_current_span("task") as task:
        weft.start("test.steps", {"key": "t7", "count": 1})
        weft_env.drive()
    [execution] = spans("weft.run test.steps")
    assert execution.parent is None and execution.context.trace_id != task.get_span_context().trace_id
    assert linked(execution) == {ids(task)}
    assert spans(RECORD)[0].parent.span_id == ids(execution)[1]


@pytest.mark.django_db
def test_without_a_current_span_nothing_is_stored_or_linked(weft_env):
    handle = weft.start("test.steps", {"key": "t2", "count": 1})
    assert Workflow.objects.get(pk=handle.run_id).trace_context is None
    weft_env.drive()
    [execution] = spans("weft.run test.steps")
    assert execution.links == ()


@pytest.mark.django_db
def test_an_execution_that_consumes_a_signal_links_to_the_signal_senders_trace(weft_env):
    with tracer.start_as_current_span("start request") as starter:
        handle = weft.start("test.approval", "t3")
    weft_env.drive()  # parks waiting for "approval"
    with tracer.start_as_current_span("signal request") as sender:
        weft.signal(handle.workflow_id, "approval", "yes")
    assert Signal.objects.get().trace_context["traceparent"].split("-")[2] == f"{ids(sender)[1]:016x}"
    weft_env.drive()
    assert handle.result() == "yes"
    first, second = spans("weft.run test.approval")
    assert linked(first) == {ids(starter)}
    assert linked(second) == {ids(starter), ids(sender)}


@pytest.mark.django_db
def test_a_failed_attempt_is_an_error_span(weft_env):
    weft.start("test.uncaught", "t4")
    weft_env.drive()
    [attempt] = spans("weft.activity tests.testapp.workflows.refuses")
    assert attempt.status.status_code == trace.StatusCode.ERROR
    assert spans("weft.run test.uncaught")[0].attributes["weft.outcome"] == "failed"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("__str__ refuses")


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def unprintable() -> None:
    raise _Unprintable()


@weft.workflow(name="tracing.unprintable")
def raises_unprintable(ctx: weft.Context) -> None:
    ctx.run(unprintable)


@pytest.mark.django_db
def test_an_error_whose_str_raises_is_recorded_as_itself_not_as_the_spans_failure(weft_env):
    handle = weft.start("tracing.unprintable")
    weft_env.drive()
    assert WorkflowStep.objects.get(run_id=handle.run_id).error["type"].endswith("_Unprintable")
    [attempt] = spans("weft.activity tests.test_tracing.unprintable")
    assert attempt.status.status_code == trace.StatusCode.ERROR


@pytest.mark.django_db
def test_a_schedule_tick_is_a_span_and_the_runs_it_starts_link_to_it(weft_env):
    weft.create_schedule("traced", "test.collect", 0, every=timedelta(minutes=1))
    weft_env.advance(timedelta(minutes=1, seconds=1))
    [tick] = spans("weft.schedule_tick")
    [execution] = spans("weft.run test.collect")
    assert linked(execution) == {ids(tick)}
    assert spans("weft.schedule_tick") == [tick], "passes with nothing due make no span"


@pytest.mark.django_db(transaction=True)
def test_the_link_holds_when_another_process_executes_the_run():
    with tracer.start_as_current_span("request") as request:
        handle = weft.start("test.steps", {"key": "t5", "count": 2})
    path = f"{REPO_ROOT}:{REPO_ROOT / 'testproject'}"
    done = subprocess.run([sys.executable, "-m", "tests.trace_child"], cwd=REPO_ROOT,
                          env=process_env(PYTHONPATH=path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [execution] = json.loads(done.stdout.strip().splitlines()[-1])
    assert execution["name"] == "weft.run test.steps"
    assert execution["links"] == [list(ids(request))]
    assert execution["children"] == [RECORD, RECORD]
    assert handle.status == "completed"


@pytest.mark.django_db
def test_a_child_run_links_to_its_parents_execution(weft_env):
    handle = weft.start("test.parent", {"key": "t6"})
    weft_env.drive()
    assert handle.result() == "child t6 done"
    parent_first = spans("weft.run test.parent")[0]
    [child] = spans("weft.run test.child")
    assert linked(child) == {ids(parent_first)}
