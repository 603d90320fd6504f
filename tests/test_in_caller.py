"""``weft.run()``: a run started already claimed by the caller and executed in the calling thread; and the plain
``weft.start()`` that is now one autocommit INSERT.

weft.run() commits each step on its own and refuses a caller's transaction, so its tests commit their data
(``transaction=True``). The crash test (a real process running weft.run, killed mid-step, its run taken over
once its lease expires) runs on PostgreSQL only.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_weft as weft
from django_weft import signals
from django_weft.models import RunStatus, SearchAttributeValue, Timer, Workflow, WorkflowStep
from tests.in_caller_workflows import LEASE_LEFT, LEASE_RUNS, SEEN
from tests.procs import REPO_ROOT, SHORT_LEASE, Proc, in_threads, journal, pids_of, wait_until
from tests.testapp.models import Execution
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

RUN_SIGNALS = ("workflow_started", "workflow_completed", "workflow_failed", "workflow_cancelled",
               "workflow_timed_out")


@pytest.fixture
def sent() -> Iterator[dict[str, list]]:
    """The run signals sent during the test: name -> the run_ids they were sent for, in order."""
    seen: dict[str, list] = {name: [] for name in RUN_SIGNALS}
    for name in RUN_SIGNALS:
        def receiver(sender, run, _name=name, **kwargs):
            seen[_name].append(run.run_id)

        getattr(signals, name).connect(receiver, weak=False, dispatch_uid=f"test_in_caller.{name}")
    try:
        yield seen
    finally:
        for name in RUN_SIGNALS:
            getattr(signals, name).disconnect(dispatch_uid=f"test_in_caller.{name}")


def spec(key: str, count: int = 3, **extra) -> dict:
    return {"key": key, "count": count, **extra}


def counts(key: str, count: int = 3) -> list[int]:
    return [executions(f"{key}:{i}") for i in range(count)]


# --- 1. a run that finishes in the call -------------------------------------------------------------------


def test_run_executes_every_step_in_the_call(sent):
    before = timezone.now()
    handle = weft.run("test.steps", spec("done"))

    # Finished when weft.run returns: nothing else executed it (no maintenance pass, no executor).
    assert handle.status == RunStatus.COMPLETED
    assert handle.result(timeout=0) == ["DONE:0", "DONE:1", "DONE:2"]
    assert counts("done") == [1, 1, 1]
    assert set(pids_of("done:0") + pids_of("done:1") + pids_of("done:2")) == {os.getpid()}
    assert journal(handle.run_id) == [
        (1, "activity", "tests.testapp.workflows.record", "completed"),
        (2, "activity", "tests.testapp.workflows.record", "completed"),
        (3, "activity", "tests.testapp.workflows.record", "completed"),
    ]
    run = handle.refresh()
    assert run.workflow_type == "test.steps" and run.workflow_id == str(run.run_id)
    assert run.started_at is not None and before <= run.started_at <= run.finished_at
    assert run.lease_owner == "" and run.runnable_at is None and run.wait_reason == ""
    assert run.fence == 1, "the run was claimed again after its start (a claim bumps the fence)"
    assert Workflow.objects.count() == 1
    assert sent["workflow_started"] == [handle.run_id]
    assert sent["workflow_completed"] == [handle.run_id]
    assert sent["workflow_failed"] == []
    # A maintenance pass afterwards finds nothing to do.
    report = weft.run_maintenance()
    assert report.claimed == 0
    assert counts("done") == [1, 1, 1]


def test_run_wakes_no_executor():
    """The caller executes the run it inserted: no wake-up (PostgreSQL's NOTIFY) is sent for it."""
    with CaptureQueriesContext(connection) as queries:
        handle = weft.run("test.steps", spec("quiet"))
    assert handle.status == RunStatus.COMPLETED
    # The start's look at the paused types (kept for a second per process, so read here or not by test order).
    statements = [query["sql"] for query in queries.captured_queries if "django_weft_pausedtype" not in query["sql"]]
    assert statements[0].lstrip().upper().startswith("INSERT INTO"), statements
    assert not [sql for sql in statements if "pg_notify" in sql], statements


def test_run_is_claimed_by_the_calling_thread_while_it_executes():
    SEEN.clear()
    handle = weft.run("in_caller.observed", "seen")
    assert handle.result(timeout=0) == ["seen:0", "seen:1"]
    assert [entry["key"] for entry in SEEN] == ["seen:0", "seen:1"]
    for entry in SEEN:
        assert entry["thread"] == threading.get_ident()  # executed here, not on an executor thread
        # Mid-step the row says: running, claimed once (fence 1), leased to an owner until later.
        assert entry["status"] == RunStatus.RUNNING
        assert entry["fence"] == 1
        assert entry["lease_owner"] != ""
        assert entry["started_at"] is not None and entry["runnable_at"] > entry["started_at"]
    assert SEEN[0]["lease_owner"] == SEEN[1]["lease_owner"]
    run = handle.refresh()
    assert run.lease_owner == "" and run.fence == 1


def test_a_step_commit_renews_the_lease_once_a_third_of_it_has_passed(settings):
    """A commit right after the claim leaves the lease as it is (on PostgreSQL that keeps the update off the
    run table's indexes); one made after a third of the lease has passed renews it, so a run keeps its lease
    through its commits alone (the process's lease keeper renews every WEFT_HEARTBEAT_SECONDS, 10 s)."""
    settings.WEFT_LEASE_SECONDS = 3.0
    SEEN.clear()
    handle = weft.run("in_caller.lease", 1.5)
    assert handle.status == RunStatus.COMPLETED
    first, second, third = SEEN
    assert second["runnable_at"] == first["runnable_at"], "the first commit renewed a lease that had just been taken"
    # Unrenewed, the lease would have at most 3 - 1.5 s left after the nap. Renewed by the nap's commit (or by
    # the process's lease keeper at any moment since the claim, which leaves over 2 s at that commit), it has
    # close to two thirds of 3 s or more left.
    left = (third["runnable_at"] - third["seen_at"]).total_seconds()
    assert left >= 1.75, f"the lease was not renewed after a third of it had passed ({left:.2f} s left)"


def test_a_run_whose_row_another_transaction_holds_delays_no_other_runs_lease_renewal(postgres_only, settings):
    """Three runs execute in their callers' threads while a fourth thread holds two of their rows locked (as a
    signal sent inside a long transaction does) for longer than a lease: the process's lease keeper skips the
    locked rows and keeps renewing the third run's lease; the other two it waits for once their own leases are
    about to run out, and renews them as the lock is released."""
    settings.WEFT_LEASE_SECONDS, settings.WEFT_HEARTBEAT_SECONDS = 3.0, 0.25
    # The keeper takes the new interval after its current wait (up to the 10 s default): wait for one renewal.
    assert weft.run("in_caller.renewed", 15.0).result(timeout=0) is True
    LEASE_LEFT.clear()
    keys = ["free", "locked-1", "locked-2"]

    def act(index: int):
        if index < 3:
            return weft.run("in_caller.watched", {"key": keys[index], "seconds": 5.0})
        wait_until(lambda: set(LEASE_LEFT) == set(keys), "the three runs to be in their activity", 10)
        with transaction.atomic():
            rows = list(Workflow.objects.select_for_update().filter(
                pk__in=[LEASE_RUNS["locked-1"], LEASE_RUNS["locked-2"]], status=RunStatus.RUNNING))
            time.sleep(3.5)
        return len(rows)

    results = in_threads(4, act)
    assert results[3] == 2, results
    for handle in results[:3]:
        assert handle.refresh().status == RunStatus.COMPLETED, handle.refresh().error
    assert LEASE_LEFT["free"] > 1.0, LEASE_LEFT  # renewed every 0.25 s (but while the keeper waited for a lock)
    assert min(LEASE_LEFT["locked-1"], LEASE_LEFT["locked-2"]) < LEASE_LEFT["free"], LEASE_LEFT


def test_run_takes_tags_search_attributes_and_an_execution_timeout():
    handle = weft.run("test.steps", spec("attrs", 1), tags=["urgent", "eu"],
                      search_attributes={"customer_id": 7, "plan": "pro"}, execution_timeout=600)
    assert handle.result(timeout=0) == ["ATTRS:0"]
    run = handle.refresh()
    assert run.tags == ["urgent", "eu"]
    assert run.search_attributes == {"customer_id": 7, "plan": "pro"}
    assert run.execution_deadline is not None
    assert run.execution_deadline - run.created_at == timedelta(seconds=600)
    rows = dict(SearchAttributeValue.objects.filter(run_id=handle.run_id).values_list("name", "int_value"))
    assert set(rows) == {"customer_id", "plan"} and rows["customer_id"] == 7


def test_odd_values_are_stored_as_given():
    """The run's row and its steps are written with parameters bound on the server (PostgreSQL): quotes,
    percent signs, placeholders and non-ASCII text in every kind of column come back unchanged."""
    odd = "o'k \"%s\" %(x)s $1 ? \\ ключ 🙂"
    attributes = {"customer_id": 2**63 - 1, "plan": odd, "amount": Decimal("-12.5"),
                  "due": datetime(2031, 2, 3, 4, 5, 6, 789, tzinfo=UTC), "vip": False,
                  "labels": [odd, "b"], "note": odd}
    handle = weft.run("test.steps", spec(odd, 2), workflow_id=odd, tags=[odd, "%s"],
                      search_attributes=attributes)
    assert handle.workflow_id == odd
    assert handle.result(timeout=0) == [f"{odd}:0".upper(), f"{odd}:1".upper()]
    run = Workflow.objects.get(workflow_id=odd)
    assert run.run_id == handle.run_id and run.tags == [odd, "%s"]
    assert weft.get_handle(odd) == handle
    assert counts(odd, 2) == [1, 1]
    values = SearchAttributeValue.objects.filter(run_id=run.run_id)
    assert values.get(name="customer_id").int_value == 2**63 - 1
    assert values.get(name="plan").keyword_value == odd
    assert values.get(name="amount").decimal_value == Decimal("-12.5")
    assert values.get(name="due").datetime_value == attributes["due"]
    assert values.get(name="vip").bool_value is False
    assert sorted(values.filter(name="labels").values_list("keyword_value", flat=True)) == sorted([odd, "b"])
    assert values.get(name="note").text_value == odd


# --- 2. a run that fails --------------------------------------------------------------------------------


def test_a_failing_activity_fails_the_run_without_raising_from_run(sent):
    handle = weft.run("test.uncaught", "bad")  # its activity raises a non-retryable ValueError
    assert handle.status == RunStatus.FAILED
    with pytest.raises(weft.WorkflowFailed, match="bad value for bad"):
        handle.result(timeout=0)
    assert executions("bad") == 1
    run = handle.refresh()
    assert run.lease_owner == "" and run.runnable_at is None and run.finished_at is not None
    assert sent["workflow_started"] == [handle.run_id]
    assert sent["workflow_failed"] == [handle.run_id]
    assert sent["workflow_completed"] == []


def test_an_exception_in_the_workflow_code_fails_the_run_without_raising_from_run(sent):
    handle = weft.run("in_caller.raises", "wf")
    assert handle.status == RunStatus.FAILED
    with pytest.raises(weft.WorkflowFailed, match="the workflow code of wf failed"):
        handle.result(timeout=0)
    assert handle.refresh().error["type"].endswith("Broken")
    assert executions("wf:before") == 1
    assert sent["workflow_failed"] == [handle.run_id]
    # Failed once: no pass executes it again.
    weft.run_maintenance()
    assert executions("wf:before") == 1 and sent["workflow_failed"] == [handle.run_id]


def test_a_run_terminated_mid_step_is_dropped_by_its_caller(sent):
    """A terminate bumps the fence: the caller's next commit is refused, it stops, and weft.run returns."""
    handle = weft.run("test.terminated_mid_step", "cx", workflow_id="cx")
    run = handle.refresh()
    assert run.status == RunStatus.TIMED_OUT
    with pytest.raises(weft.WorkflowTimedOut):
        handle.result(timeout=0)
    assert executions("cx:first") == 1 and executions("cx") == 1 and executions("cx:never") == 0
    assert sent["workflow_completed"] == []


def test_a_run_cancelled_mid_step_ends_cancelled_in_its_caller(sent):
    """A cancel is a request: the step in progress commits, the next durable call raises it, weft.run returns."""
    handle = weft.run("test.cancelled_mid_step", "cy", workflow_id="cy")
    assert handle.refresh().status == RunStatus.CANCELLED
    with pytest.raises(weft.WorkflowCancelled, match="operator cancelled mid-step"):
        handle.result(timeout=0)
    assert executions("cy:first") == 1 and executions("cy") == 1 and executions("cy:never") == 0
    assert sent["workflow_cancelled"] == [handle.run_id] and sent["workflow_completed"] == []
    assert weft.run_maintenance().claimed == 0


# --- 3. a run that parks is left to the executors --------------------------------------------------------


def test_a_run_waiting_for_a_signal_is_left_to_the_executors(sent):
    handle = weft.run("test.approval", "appr")
    run = handle.refresh()
    assert run.status == RunStatus.WAITING, (run.status, run.error)
    assert "approval" in run.wait_reason
    assert run.lease_owner == ""
    assert executions("appr:before") == 1 and executions("appr:after") == 0
    with pytest.raises(TimeoutError):
        handle.result(timeout=0)
    assert sent["workflow_completed"] == []

    assert weft.run_maintenance().claimed == 0  # nothing to do until the signal arrives
    weft.signal(handle.workflow_id, "approval", "yes")
    report = weft.run_maintenance()
    assert report.claimed == 1
    assert handle.result(timeout=0) == "yes"
    # The step recorded before the wait was replayed, not executed again.
    assert executions("appr:before") == 1 and executions("appr:after") == 1
    assert [kind for _, kind, _, _ in journal(handle.run_id)] == ["activity", "signal", "activity"]
    assert sent["workflow_started"] == [handle.run_id]
    assert sent["workflow_completed"] == [handle.run_id]


def test_a_run_sleeping_durably_is_finished_by_the_executors(weft_env):
    handle = weft.run("test.steps", spec("nap", 4, sleep=30))
    run = handle.refresh()
    assert run.status == RunStatus.WAITING and "sleeping" in run.wait_reason
    assert counts("nap", 4) == [1, 1, 0, 0]
    weft_env.advance(timedelta(seconds=31))
    assert handle.result() == ["NAP:0", "NAP:1", "NAP:2", "NAP:3"]
    assert counts("nap", 4) == [1, 1, 1, 1]


def test_a_retry_backoff_parks_the_run_and_an_executor_retries_it(weft_env):
    handle = weft.run("test.retry", {"key": "flake", "failures": 1})  # fails once, backs off 1 s
    run = handle.refresh()
    assert run.status == RunStatus.WAITING, (run.status, run.error)
    assert executions("flake") == 1
    weft_env.advance(timedelta(seconds=2))
    assert handle.result() == "ok"
    assert executions("flake") == 2


# --- 4. not inside a caller's transaction -----------------------------------------------------------------


def test_run_inside_atomic_is_refused_and_writes_nothing(sent):
    with transaction.atomic():
        with pytest.raises(weft.InvalidArgument, match=r"transaction\.atomic\(\)"):
            weft.run("test.steps", spec("atomic"))
        assert Workflow.objects.count() == 0
    # The block committed: still nothing, nothing executed, nothing sent.
    assert Workflow.objects.count() == 0 and WorkflowStep.objects.count() == 0
    assert counts("atomic") == [0, 0, 0]
    assert sent["workflow_started"] == []


def test_run_inside_a_nested_atomic_block_is_refused_too():
    with transaction.atomic(), transaction.atomic(savepoint=False):
        with pytest.raises(weft.InvalidArgument):
            weft.run("test.steps", spec("nested"), idempotency_key="nested-key")
    assert Workflow.objects.count() == 0 and counts("nested") == [0, 0, 0]
    # The key was not spent: it starts (and executes) a run outside.
    handle = weft.run("test.steps", spec("nested"), idempotency_key="nested-key")
    assert handle.result(timeout=0) == ["NESTED:0", "NESTED:1", "NESTED:2"]


# --- 5. bad input: what weft.start raises, and nothing written ------------------------------------------

NOT_REGISTERED, INVALID = weft.WorkflowNotRegistered, weft.InvalidArgument
BAD_RUNS = [
    pytest.param(("no.such.workflow", None), {}, NOT_REGISTERED, id="unknown_type"),
    pytest.param((len, None), {}, NOT_REGISTERED, id="not_a_workflow"),
    pytest.param(("test.steps", {"k": object()}), {}, weft.PayloadNotSerializable, id="unserialisable_input"),
    pytest.param(("test.steps", "x" * 2000), {}, weft.PayloadTooLarge, id="input_too_large"),
    pytest.param(("test.steps", None), {"workflow_id": "a", "idempotency_key": "b"}, INVALID, id="id_and_key"),
    pytest.param(("test.steps", None), {"workflow_id": ""}, INVALID, id="empty_workflow_id"),
    pytest.param(("test.steps", None), {"workflow_id": "x" * 256}, INVALID, id="long_workflow_id"),
    pytest.param(("test.steps", None), {"workflow_id": "nul\x00id"}, INVALID, id="nul_in_workflow_id"),
    pytest.param(("test.steps", None), {"idempotency_key": "\ud800"}, INVALID, id="surrogate_in_key"),
    pytest.param(("test.steps", None), {"on_terminal_conflict": "replace"}, INVALID, id="bad_conflict_policy"),
    pytest.param(("test.steps", None), {"on_terminal_conflict": "start_new"}, INVALID, id="start_new_without_id"),
    pytest.param(("test.steps", None), {"execution_timeout": 0}, INVALID, id="zero_timeout"),
    pytest.param(("test.steps", None), {"execution_timeout": math.nan}, INVALID, id="nan_timeout"),
    pytest.param(("test.steps", None), {"tags": "urgent"}, INVALID, id="tags_a_string"),
    pytest.param(("test.steps", None), {"tags": [f"t{i}" for i in range(65)]}, INVALID, id="65_tags"),
    pytest.param(("test.steps", None), {"tags": ["bad\x00tag"]}, INVALID, id="nul_in_tag"),
    pytest.param(("test.steps", None), {"search_attributes": {"a": 1}}, INVALID, id="undeclared_attribute"),
    pytest.param(("test.steps", None), {"search_attributes": {"customer_id": object()}}, INVALID,
                 id="attribute_of_wrong_type"),
    pytest.param(("test.steps", None), {"search_attributes": {"amount": Decimal("1e40")}}, INVALID,
                 id="decimal_too_large"),
    pytest.param(("test.steps", None), {"search_attributes": {"plan": "x" * 300}}, INVALID, id="keyword_too_long"),
]


@override_settings(WEFT_MAX_PAYLOAD_BYTES=1000)
@pytest.mark.parametrize(("args", "kwargs", "error"), BAD_RUNS)
def test_bad_input_raises_what_start_raises_and_writes_nothing(args, kwargs, error, sent):
    with pytest.raises(error) as from_start:
        weft.start(*args, **kwargs)
    with pytest.raises(error) as from_run:
        weft.run(*args, **kwargs)
    assert type(from_run.value) is type(from_start.value)
    assert str(from_run.value) == str(from_start.value)
    assert Workflow.objects.count() == 0 and Timer.objects.count() == 0
    assert SearchAttributeValue.objects.count() == 0 and Execution.objects.count() == 0
    assert sent["workflow_started"] == []


def test_run_has_no_delayed_start_options():
    with pytest.raises(TypeError):
        weft.run("test.steps", spec("late"), start_after=10)  # type: ignore[call-arg]
    assert Workflow.objects.count() == 0


# --- 6. identity: idempotency keys and workflow ids -------------------------------------------------------


def test_an_idempotency_key_executes_once_and_returns_the_same_run(sent):
    first = weft.run("test.steps", spec("idem"), idempotency_key="order-42")
    assert first.result(timeout=0) == ["IDEM:0", "IDEM:1", "IDEM:2"]
    assert first.workflow_id == str(first.run_id)
    again = weft.run("test.steps", spec("idem"), idempotency_key="order-42")
    assert again == first and again.run_id == first.run_id
    assert weft.start("test.steps", spec("idem"), idempotency_key="order-42") == first
    assert counts("idem") == [1, 1, 1]
    assert Workflow.objects.count() == 1 and WorkflowStep.objects.count() == 3
    assert sent["workflow_started"] == [first.run_id] and sent["workflow_completed"] == [first.run_id]
    with pytest.raises(weft.InvalidArgument, match=r"already started a 'test\.steps' run"):
        weft.run("test.retry", {"key": "x", "failures": 0}, idempotency_key="order-42")
    assert Workflow.objects.count() == 1 and executions("x") == 0


def test_an_idempotency_key_a_start_used_returns_that_run_without_executing_it():
    started = weft.start("test.steps", spec("queued"), idempotency_key="queued-1")
    handle = weft.run("test.steps", spec("queued"), idempotency_key="queued-1")
    assert handle == started
    run = handle.refresh()
    assert run.status == RunStatus.PENDING and run.lease_owner == "" and run.fence == 0
    assert counts("queued") == [0, 0, 0]
    weft.run_maintenance()  # the executors execute it, once
    assert handle.result(timeout=0) == ["QUEUED:0", "QUEUED:1", "QUEUED:2"]
    assert counts("queued") == [1, 1, 1]


def test_an_idempotency_key_of_a_parked_run_does_not_execute_it_again():
    first = weft.run("test.approval", "park", idempotency_key="park-1")
    assert first.status == RunStatus.WAITING
    again = weft.run("test.approval", "park", idempotency_key="park-1")
    assert again == first and again.status == RunStatus.WAITING
    assert executions("park:before") == 1


def test_workflow_id_conflicts_raise_like_start():
    opened = weft.start("test.steps", spec("open"), workflow_id="invoice-1")
    with pytest.raises(weft.WorkflowAlreadyExists, match="open run") as from_run:
        weft.run("test.steps", spec("open"), workflow_id="invoice-1")
    with pytest.raises(weft.WorkflowAlreadyExists) as from_start:
        weft.start("test.steps", spec("open"), workflow_id="invoice-1")
    assert str(from_run.value) == str(from_start.value)
    assert Workflow.objects.count() == 1 and counts("open") == [0, 0, 0]
    assert opened.status == RunStatus.PENDING

    done = weft.run("test.steps", spec("w1"), workflow_id="invoice-2")
    assert done.workflow_id == "invoice-2" and done.status == RunStatus.COMPLETED
    with pytest.raises(weft.WorkflowAlreadyExists, match="start_new"):
        weft.run("test.steps", spec("w2"), workflow_id="invoice-2")
    assert counts("w2") == [0, 0, 0]
    again = weft.run("test.steps", spec("w2"), workflow_id="invoice-2", on_terminal_conflict="start_new")
    assert again.workflow_id == "invoice-2" and again.run_id != done.run_id
    assert again.result(timeout=0) == ["W2:0", "W2:1", "W2:2"]
    assert again.run.restarted_from_id == done.run_id
    assert weft.get_handle("invoice-2") == again
    assert counts("w1") == [1, 1, 1] and counts("w2") == [1, 1, 1]


@pytest.mark.concurrent
def test_concurrent_runs_with_one_idempotency_key_execute_once(row_locks):
    results = in_threads(4, lambda i: weft.run("test.steps", spec("race"), idempotency_key="race-1"))
    assert all(isinstance(result, weft.WorkflowHandle) for result in results), results
    assert len({result.run_id for result in results}) == 1
    assert Workflow.objects.count() == 1
    assert results[0].result(timeout=10) == ["RACE:0", "RACE:1", "RACE:2"]
    assert counts("race") == [1, 1, 1]


@pytest.mark.concurrent
def test_concurrent_runs_with_one_workflow_id_open_one(row_locks):
    """The run parks, so it stays open while the others try: the unique index lets one in."""
    results = in_threads(4, lambda i: weft.run("test.approval", f"wid{i}", workflow_id="same-id"))
    handles = [result for result in results if isinstance(result, weft.WorkflowHandle)]
    assert len(handles) == 1, results
    assert all(isinstance(result, weft.WorkflowAlreadyExists) for result in results if result not in handles)
    assert Workflow.objects.count() == 1
    assert handles[0].status == RunStatus.WAITING
    assert sum(executions(f"wid{i}:before") for i in range(4)) == 1


WORKFLOW_INSERT = re.compile(r"^\s*INSERT INTO [\"`]django_weft_workflow[\"`]", re.IGNORECASE)


@pytest.mark.concurrent
@pytest.mark.parametrize("second", ["run", "start"])
def test_a_workflow_id_whose_run_finished_meanwhile_is_refused(row_locks, second):
    """Caller B checks workflow id 'order-7' (unused) and is held just before its INSERT; meanwhile caller A's
    weft.run starts and finishes a run with that id. B must then be refused as a sequential call is."""
    b_inserting, a_done = threading.Event(), threading.Event()
    outcome: list = []

    def hold_the_run_insert(execute, sql, params, many, context):
        if WORKFLOW_INSERT.match(sql):
            b_inserting.set()
            a_done.wait(10)
        return execute(sql, params, many, context)

    def caller_b() -> None:
        try:
            with connection.execute_wrapper(hold_the_run_insert):
                outcome.append(getattr(weft, second)("test.steps", spec("b", 1), workflow_id="order-7"))
        except Exception as exc:
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=caller_b, daemon=True)
    thread.start()
    try:
        assert b_inserting.wait(10), outcome
        first = weft.run("test.steps", spec("a", 1), workflow_id="order-7")
        assert first.status == RunStatus.COMPLETED
    finally:
        a_done.set()
        thread.join(30)
    assert not thread.is_alive()
    assert executions("a:0") == 1
    assert isinstance(outcome[0], weft.WorkflowAlreadyExists), (
        outcome, list(Workflow.objects.filter(workflow_id="order-7").values_list("status", "restarted_from")))
    assert Workflow.objects.filter(workflow_id="order-7").count() == 1 and executions("b:0") == 0


# --- 7. a caller killed mid-step: its run is taken over once its lease expires (PostgreSQL) ----------------

RUNNER = """
import json, sys
import django
django.setup()
import django_weft as weft
handle = weft.run("test.crash", json.loads(sys.argv[1]))
print(json.dumps({"run_id": str(handle.run_id), "status": handle.status}))
"""


def runner_process(directory: Path, crash_spec: dict) -> Proc:
    """``python -c RUNNER``: weft.run in a process of its own on the test database, with a short lease."""
    path = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "testproject"), os.environ.get("PYTHONPATH", "")])
    return Proc("runner", directory, [sys.executable, "-c", RUNNER, json.dumps(crash_spec)],
                {"PYTHONPATH": path, **SHORT_LEASE})


@pytest.mark.postgres
def test_a_killed_caller_s_run_is_taken_over_after_its_lease(postgres_only, tmp_path):
    """A process in weft.run is SIGKILLed in step 2: while it lived its lease was renewed (no pass took the
    run); once the lease expired a maintenance pass takes the run over and finishes it. Step 1 ran once, step 2
    (in flight at the kill) twice."""
    release = tmp_path / "release"
    lease = float(SHORT_LEASE["WEFT_LEASE_SECONDS"])
    proc = runner_process(tmp_path, {"key": "kill", "path": str(release), "max_wait": 60})
    try:
        wait_until(lambda: executions("kill:start") == 1, "the runner to reach step 2", 60, [proc])
        run = Workflow.objects.get()
        handle = weft.get_handle(run.workflow_id, run.run_id)
        assert run.status == RunStatus.RUNNING and run.lease_owner != "" and run.fence == 1
        assert [seq for seq, *_ in journal(run.run_id)] == [1]

        # Past the lease the insert granted: the live caller renewed it, and a pass does not take the run.
        past_first_lease = run.started_at + timedelta(seconds=lease + 0.5)
        wait_until(lambda: timezone.now() > past_first_lease, "the first lease to run out", 30, [proc])
        run = handle.refresh()
        assert run.runnable_at > timezone.now(), "the caller's lease was not renewed while it executed"
        with override_settings(WEFT_LEASE_SECONDS=lease, WEFT_HEARTBEAT_SECONDS=1):
            assert weft.run_maintenance().claimed == 0
        assert executions("kill:start") == 1 and handle.refresh().fence == 1

        proc.send(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL, proc.output()
    finally:
        proc.kill()
    run = handle.refresh()
    assert run.status == RunStatus.RUNNING and [seq for seq, *_ in journal(run.run_id)] == [1]
    assert executions("kill:end") == 0

    release.touch()  # step 2 returns at once when it runs again
    expires = run.runnable_at
    wait_until(lambda: timezone.now() > expires, "the dead caller's lease to expire", lease + 10)
    out = StringIO()
    with override_settings(WEFT_LEASE_SECONDS=lease, WEFT_HEARTBEAT_SECONDS=1):
        call_command("weft_maintenance", "--once", stdout=out)
    assert "claimed=1" in out.getvalue(), out.getvalue()

    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, proc.output())
    assert handle.result(timeout=0) == "released"
    assert run.fence == 2  # the takeover's claim
    assert run.lease_owner == "" and run.runnable_at is None
    assert [(seq, status) for seq, _, _, status in journal(run.run_id)] == [
        (1, "completed"), (2, "completed"), (3, "completed")]
    # Step 1, committed before the kill: once, in the runner. Step 2, in flight: started in both.
    assert pids_of("kill:before") == [proc.pid]
    assert pids_of("kill:start") == [proc.pid, os.getpid()]
    assert pids_of("kill:end") == [os.getpid()]
    assert pids_of("kill:after") == [os.getpid()]
    assert Workflow.objects.count() == 1


def test_run_in_another_process_completes_and_returns(tmp_path):
    """weft.run as a script calls it: the process returns with the run finished, on every database."""
    release = tmp_path / "release"
    release.touch()
    proc = runner_process(tmp_path, {"key": "script", "path": str(release)})
    try:
        assert proc.wait(60) == 0, proc.output()
    finally:
        proc.kill()
    printed = json.loads(proc.stdout().strip().splitlines()[-1])
    assert printed["status"] == RunStatus.COMPLETED, proc.output()
    handle = weft.get_handle(str(printed["run_id"]))
    assert handle.result(timeout=0) == "released"
    assert [pids_of(f"script:{name}") for name in ("before", "start", "end", "after")] == [[proc.pid]] * 4


# --- 8. weft.start: one autocommit INSERT, or the caller's transaction ------------------------------------


def test_plain_start_outside_a_transaction_is_one_insert(sent):
    # A start reads the paused workflow types (weft.pause_type) at most once a second per process; that read is
    # made here, outside the capture, as an earlier start in a busy process would have made it.
    weft.paused_types()
    with CaptureQueriesContext(connection) as queries:
        handle = weft.start("test.steps", spec("plain"))
    statements = [query["sql"] for query in queries.captured_queries]
    # The run's row, alone: no read of the table, no savepoint. On PostgreSQL the wake-up NOTIFY follows it,
    # after the INSERT committed on its own.
    wakeups = [sql for sql in statements if "pg_notify" in sql]
    assert len(wakeups) == (1 if connection.vendor == "postgresql" else 0), statements
    writes = [sql for sql in statements if sql not in wakeups]
    assert len(writes) == 1 and writes[0].lstrip().upper().startswith("INSERT INTO"), statements
    assert statements[0] == writes[0], "the wake-up was sent before the run was written"
    run = handle.refresh()
    assert run.status == RunStatus.PENDING and run.fence == 0 and run.lease_owner == ""
    assert run.runnable_at == run.created_at and run.started_at is None
    assert Workflow.objects.count() == 1 and Timer.objects.count() == 0
    assert sent["workflow_started"] == [handle.run_id]
    weft.run_maintenance()
    assert handle.result(timeout=0) == ["PLAIN:0", "PLAIN:1", "PLAIN:2"]


@pytest.mark.parametrize("options", [
    {},
    {"search_attributes": {"customer_id": 9, "region": "eu"}},
    {"start_after": 10},
    {"search_attributes": {"plan": "pro"}, "start_after": timedelta(seconds=5), "tags": ["x"]},
    {"workflow_id": "rolled-back"},
    {"idempotency_key": "rolled-back-key"},
], ids=["plain", "attributes", "start_after", "both", "workflow_id", "idempotency_key"])
def test_start_inside_a_rolled_back_transaction_leaves_nothing(options, sent):
    with pytest.raises(RuntimeError), transaction.atomic():
        handle = weft.start("test.steps", spec("rb"), **options)
        assert Workflow.objects.filter(pk=handle.run_id).exists()
        raise RuntimeError("the view failed")
    assert Workflow.objects.count() == 0 and Timer.objects.count() == 0
    assert SearchAttributeValue.objects.count() == 0
    assert sent["workflow_started"] == []
    weft.run_maintenance(now=timezone.now() + timedelta(seconds=20))
    assert counts("rb") == [0, 0, 0]
    # The id and the key were not used up: a start after the rollback takes them.
    again = weft.start("test.steps", spec("rb"), **options)
    assert Workflow.objects.count() == 1 and again.run_id != handle.run_id


@pytest.mark.parametrize("inside", [False, True], ids=["autocommit", "committed_atomic"])
@pytest.mark.parametrize("options", [
    {},
    {"search_attributes": {"customer_id": 9, "region": "eu"}},
    {"start_after": 10},
    {"search_attributes": {"plan": "pro"}, "start_after": timedelta(seconds=5), "tags": ["x"]},
], ids=["plain", "attributes", "start_after", "both"])
def test_start_writes_one_run_with_its_rows_and_it_executes(options, inside, sent):
    if inside:
        with transaction.atomic():
            handle = weft.start("test.steps", spec("ok"), **options)
            assert sent["workflow_started"] == []  # sent when the caller's transaction commits
    else:
        handle = weft.start("test.steps", spec("ok"), **options)
    assert sent["workflow_started"] == [handle.run_id]
    run = handle.refresh()
    assert Workflow.objects.count() == 1 and run.status == RunStatus.PENDING
    assert run.tags == options.get("tags", [])
    attributes = options.get("search_attributes", {})
    assert run.search_attributes == attributes
    assert set(SearchAttributeValue.objects.filter(run_id=run.run_id).values_list("name", flat=True)) == set(attributes)
    delayed = "start_after" in options
    assert Timer.objects.filter(run_id=run.run_id, purpose="delayed_start").count() == (1 if delayed else 0)
    if delayed:
        assert run.runnable_at > run.created_at
        assert weft.run_maintenance().claimed == 0 and counts("ok") == [0, 0, 0]  # not due yet
        weft.run_maintenance(now=timezone.now() + timedelta(seconds=11))
    else:
        assert run.runnable_at == run.created_at
        weft.run_maintenance()
    assert handle.result(timeout=0) == ["OK:0", "OK:1", "OK:2"]
    assert counts("ok") == [1, 1, 1]


def test_run_then_start_then_run_do_not_interfere():
    """A run started with weft.start is pending for the executors while weft.run executes another in the
    call; neither is executed twice."""
    queued = weft.start("test.steps", spec("q"))
    direct = weft.run("test.steps", spec("d"))
    assert direct.status == RunStatus.COMPLETED
    assert queued.status == RunStatus.PENDING and counts("q") == [0, 0, 0]
    report = weft.run_maintenance()
    assert report.claimed == 1
    assert queued.result(timeout=0) == ["Q:0", "Q:1", "Q:2"]
    assert counts("q") == [1, 1, 1] and counts("d") == [1, 1, 1]
