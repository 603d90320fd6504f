"""handle.terminate / weft.terminate and handle.fork, through the public API."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings

import django_weft as weft
from django_weft import signals
from django_weft.models import (
    RunStatus,
    SearchAttributeValue,
    Signal,
    StepKind,
    Timer,
    UpdateStatus,
    Workflow,
    WorkflowStep,
    WorkflowUpdate,
)
from tests.procs import in_threads, wait_until
from tests.testapp.fork_workflows import BUG
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def buggy_again():
    BUG["fixed"] = False
    yield
    BUG["fixed"] = False


def journal(handle) -> list[tuple[int, str, str]]:
    return list(WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq").values_list("seq", "kind", "status"))


def assert_terminated(handle, reason: str = "") -> Workflow:
    run = handle.refresh()
    assert run.status == RunStatus.TIMED_OUT
    assert run.termination_reason == "terminated"
    assert run.failure_category == "cancellation"
    assert run.error["type"] == "Terminated" and run.error["reason"] == reason
    assert (reason or "terminated by an operator") in run.error["message"]
    assert run.runnable_at is None and run.lease_owner == "" and run.finished_at is not None
    assert not Timer.objects.filter(run_id=handle.run_id, fired_at__isnull=True).exists()
    with pytest.raises(weft.WorkflowTimedOut, match="Terminated"):
        handle.result()
    return run


# --- terminate -----------------------------------------------------------------------------------------


def test_terminate_a_pending_run_with_a_delayed_start(weft_env):
    handle = weft.start("test.steps", {"key": "tp", "count": 1}, start_after=60)
    assert handle.terminate("wrong order") is True
    assert_terminated(handle, "wrong order")
    weft_env.advance(timedelta(minutes=5))
    assert executions("tp:0") == 0


@pytest.mark.django_db(transaction=True)  # the Django signal is sent after commit
def test_terminate_a_waiting_run_and_the_signal_it_sends(weft_env):
    ended = []
    signals.workflow_timed_out.connect(lambda **kw: ended.append(kw["run"]), weak=False, dispatch_uid="term")
    try:
        handle = weft.start("test.long_sleep", workflow_id="sleeper")
        weft_env.drive()
        assert handle.status == RunStatus.WAITING
        assert weft.terminate("sleeper", reason="stuck") is True
    finally:
        signals.workflow_timed_out.disconnect(dispatch_uid="term")
    run = assert_terminated(handle, "stuck")
    assert [r.pk for r in ended] == [run.pk] and ended[0].failure_category == "cancellation"
    weft_env.advance(timedelta(days=3))
    assert handle.status == RunStatus.TIMED_OUT


def test_terminate_a_suspended_run(weft_env):
    handle = weft.start("test.long_sleep")
    weft_env.drive()
    handle.suspend("looking into it")
    assert handle.terminate() is True
    assert_terminated(handle)
    with pytest.raises(weft.TransitionNotAllowed):
        handle.resume()


@pytest.mark.django_db(transaction=True)
def test_terminate_while_a_step_runs_refuses_the_executors_late_commit(weft_env):
    handle = weft.start("fork.terminated_mid_step", "mid-term", workflow_id="mid-term")
    report = weft_env.drive()
    assert report.outcomes == {"lost": 1}
    assert_terminated(handle, "operator terminated mid-step")
    # The step that was running when the terminate landed is not recorded, and nothing after it ran.
    assert [seq for seq, _, _ in journal(handle)] == [1]
    assert executions("mid-term") == 1 and executions("mid-term:never") == 0


def test_terminate_a_finished_run_returns_false_and_changes_nothing(weft_env):
    handle = weft.start("test.steps", {"key": "tf", "count": 1}, workflow_id="tf")
    assert handle.result() == ["TF:0"]
    assert handle.terminate() is False and weft.terminate("tf") is False
    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED and run.termination_reason == "" and run.error is None


def test_terminate_bad_reason_and_unknown_id(weft_env):
    handle = weft.start("test.long_sleep")
    with pytest.raises(weft.InvalidArgument, match="reason"):
        handle.terminate("x" * 2001)
    with pytest.raises(weft.WorkflowNotFound):
        weft.terminate("no-such-id")
    assert handle.status == RunStatus.PENDING


def test_terminate_follows_a_chain_that_continued_as_new(weft_env):
    first = weft.start("evolve.counter", {"total": 0, "every": 2}, workflow_id="chain")
    weft_env.drive()
    first.signal("tick", 1)
    first.signal("tick", 2)
    weft_env.drive()
    assert first.status == RunStatus.CONTINUED
    assert first.terminate("enough") is True
    assert first.refresh().status == RunStatus.CONTINUED
    current = weft.get_handle("chain")
    assert current.run_id != first.run_id
    assert_terminated(current, "enough")


@pytest.mark.parametrize(("policy", "child_status"), [
    ("terminate", RunStatus.CANCELLED),
    ("request_cancel", RunStatus.CANCELLED),
    ("abandon", RunStatus.WAITING),
])
def test_terminate_applies_the_childrens_parent_close_policy(weft_env, policy, child_status):
    parent = weft.start("test.fire_and_forget", {"key": f"pc-{policy}", "policy": policy, "sleep": 600})
    weft_env.drive()
    child = Workflow.objects.get(parent_id=parent.run_id)
    assert child.status == RunStatus.WAITING
    assert parent.terminate() is True
    assert_terminated(parent)
    weft_env.drive()  # a child whose cancel was requested sees it in its code
    child.refresh_from_db()
    assert child.status == child_status
    if policy != "abandon":
        assert child.termination_reason == "parent_closed"


def test_terminating_a_child_wakes_its_waiting_parent(weft_env):
    parent = weft.start("test.parent", {"key": "woken", "sleep": 600})
    weft_env.drive()
    assert parent.status == RunStatus.WAITING
    child = weft.get_handle(Workflow.objects.get(parent_id=parent.run_id).workflow_id)
    assert child.terminate("child stuck") is True
    assert_terminated(child, "child stuck")
    assert parent.refresh().runnable_at is not None  # woken, not waiting for the child's timer
    assert parent.result() == "child failed: timed_out"
    assert executions("woken:parent-after") == 1


def test_terminate_fails_the_updates_the_run_did_not_apply(weft_env):
    handle = weft.start("updates.ledger", 1)
    weft_env.drive()
    sent = handle.start_update("append", "late", update_id="late")
    assert handle.terminate() is True
    record = WorkflowUpdate.objects.get(update_id="late")
    assert record.status == UpdateStatus.FAILED and record.error["type"] == "WorkflowClosed"
    with pytest.raises(weft.UpdateFailed):
        sent.result()


@pytest.mark.django_db(transaction=True)
def test_terminate_inside_a_rolled_back_transaction_changes_nothing(weft_env):
    handle = weft.start("test.long_sleep")
    weft_env.drive()
    with pytest.raises(RuntimeError), transaction.atomic():
        handle.terminate()
        raise RuntimeError("the view failed")
    assert handle.status == RunStatus.WAITING


def attribute_rows(handle) -> list[tuple]:
    return list(SearchAttributeValue.objects.filter(run_id=handle.run_id).order_by("name", "id").values_list(
        "name", "int_value", "keyword_value"))


# --- fork ----------------------------------------------------------------------------------------------


def failed_pipeline(key: str, workflow_id: str | None = None, **options):
    handle = weft.start("fork.pipeline", key, workflow_id=workflow_id or key, **options)
    with pytest.raises(weft.WorkflowFailed, match="the bug"):
        handle.result()
    return handle


@override_settings(WEFT_SEARCH_ATTRIBUTES={"shop": "int"})
def test_fork_a_failed_run_from_the_failed_step_runs_only_that_step_and_after(weft_env):
    source = failed_pipeline("order-42", tags=["nightly"], search_attributes={"shop": 7})
    assert [executions(f"order-42:{i}") for i in (1, 2, 3, 4, 5)] == [1, 1, 1, 1, 0]
    BUG["fixed"] = True  # the fix is deployed

    fork = source.fork(from_step=4)
    assert fork.workflow_id == "order-42:fork:4"
    assert fork.result() == ["ORDER-42:1", "ORDER-42:2", "ORDER-42:3", "fixed order-42:4", "ORDER-42:5"]
    assert [executions(f"order-42:{i}") for i in (1, 2, 3, 4, 5)] == [1, 1, 1, 2, 1]
    run, original = fork.refresh(), source.refresh()
    assert run.restarted_from_id == source.run_id
    assert (run.workflow_type, run.version, run.input) == (original.workflow_type, original.version, original.input)
    assert run.tags == ["nightly"] and run.search_attributes == {"shop": 7}
    assert attribute_rows(fork) == attribute_rows(source)
    assert run.idempotency_key is None and run.parent_id is None
    assert original.status == RunStatus.FAILED  # the source is only read
    copied = WorkflowStep.objects.filter(run_id=fork.run_id, seq__lt=4).order_by("seq")
    kept = WorkflowStep.objects.filter(run_id=source.run_id, seq__lt=4).order_by("seq")
    assert [(s.kind, s.name, s.result, s.started_at) for s in copied] == [
        (s.kind, s.name, s.result, s.started_at) for s in kept]


def test_fork_from_the_first_step_and_from_the_journal_end(weft_env):
    source = failed_pipeline("edges")
    BUG["fixed"] = True
    assert source.fork(from_step=1).result()[0] == "EDGES:1"
    assert executions("edges:1") == 2 and executions("edges:4") == 2
    # From the end + 1: the whole journal is copied, so the recorded failure replays and fails the fork too.
    tail = source.fork(from_step=5)
    assert tail.workflow_id == "edges:fork:5"
    with pytest.raises(weft.WorkflowFailed, match="the bug"):
        tail.result()
    assert executions("edges:4") == 2  # not executed again: the copied failed step replays


def test_fork_takes_the_given_workflow_id_or_derives_a_free_one(weft_env):
    source = failed_pipeline("ids")
    first = source.fork(from_step=4)
    second = source.fork(from_step=4)  # the derived id has an open run: a short random suffix
    assert first.workflow_id == "ids:fork:4"
    assert second.workflow_id.startswith("ids:fork:4:") and len(second.workflow_id) == len("ids:fork:4:") + 8
    named = source.fork(from_step=2, workflow_id="ids-again")
    assert named.workflow_id == "ids-again"
    with pytest.raises(weft.WorkflowAlreadyExists, match="ids-again"):
        source.fork(from_step=2, workflow_id="ids-again")
    same = source.fork(from_step=4, workflow_id="ids")  # the source finished: its id is free
    assert weft.get_handle("ids") == same
    long_source = failed_pipeline("long", workflow_id="x" * 255)
    assert long_source.fork(from_step=4).workflow_id == "x" * (255 - len(":fork:4")) + ":fork:4"


@pytest.mark.parametrize(("from_step", "message"), [
    (0, "from_step=0 is outside the journal of run .* which ends at step 4: fork from a step between 1 and 5"),
    (6, "from_step=6 is outside"),
    (-1, "outside"),
    ("4", "from_step must be an int"),
    (True, "from_step must be an int"),
    (2.0, "from_step must be an int"),
])
def test_fork_refuses_a_step_outside_the_journal(weft_env, from_step, message):
    source = failed_pipeline("range")
    with pytest.raises(weft.InvalidArgument, match=message):
        source.fork(from_step=from_step)
    assert Workflow.objects.count() == 1


def test_fork_refuses_to_copy_a_waiting_step_and_forks_an_open_run_before_it(weft_env):
    source = weft.start("test.steps", {"key": "open", "count": 4, "sleep": 60})
    weft_env.drive()
    assert journal(source) == [(1, "activity", "completed"), (2, "activity", "completed"),
                               (3, "sleep", "waiting")]
    with pytest.raises(weft.InvalidArgument, match=r"step 3 \(sleep 'sleep'\) is still waiting.*from_step=3"):
        source.fork(from_step=4)
    fork = source.fork(from_step=3)
    weft_env.advance(timedelta(seconds=61))
    assert fork.result() == ["OPEN:0", "OPEN:1", "OPEN:2", "OPEN:3"]
    assert source.result() == ["OPEN:0", "OPEN:1", "OPEN:2", "OPEN:3"]  # the source kept running
    assert [executions(f"open:{i}") for i in range(4)] == [1, 1, 2, 2]


def test_fork_refuses_to_copy_a_child_start(weft_env):
    source = weft.start("test.parent", {"key": "kid"})
    assert source.result() == "child kid done"
    assert journal(source)[0][1] == StepKind.CHILD
    with pytest.raises(weft.InvalidArgument, match=r"step 1 started child 'test.child'.*from_step=1"):
        source.fork(from_step=2)
    fork = source.fork(from_step=1)
    assert fork.result() == "child kid done"
    assert Workflow.objects.filter(parent_id=fork.run_id).count() == 1  # its own child
    assert executions("kid:child") == 2


def test_fork_refuses_a_gap_left_by_a_branch_that_never_settled(weft_env):
    source = weft.start("fork.unsettled_branch", "gap")
    with pytest.raises(weft.WorkflowFailed):
        source.result()
    assert [seq for seq, _, _ in journal(source)] == [2]
    with pytest.raises(weft.InvalidArgument, match=r"step 1 has no recorded outcome.*from_step=1"):
        source.fork(from_step=2)
    assert source.fork(from_step=1).status == RunStatus.PENDING


def test_fork_refuses_an_unregistered_version(weft_env):
    source = failed_pipeline("gone")
    Workflow.objects.filter(pk=source.run_id).update(version=9)
    with pytest.raises(weft.WorkflowNotRegistered, match="version 9"):
        source.fork(from_step=4)


def test_fork_copies_the_signals_its_journal_consumed(weft_env):
    source = weft.start("fork.signalled", "sig", workflow_id="sig")
    weft_env.drive()
    assert source.signal("go", "yes", signal_id="go-1") is True
    with pytest.raises(weft.WorkflowFailed):
        source.result()
    BUG["fixed"] = True
    fork = source.fork(from_step=2, workflow_id="sig")  # takes the source's id: senders reach it
    assert weft.signal("sig", "go", "again", signal_id="go-1") is False  # a sender's retry: already delivered
    assert fork.result() == ["yes", "fixed sig:2"]
    copied = Signal.objects.get(run_id=fork.run_id)
    assert (copied.signal_id, copied.decoded_payload, copied.consumed_by_seq) == ("go-1", "yes", 1)
    assert fork.refresh().inbox_seq >= copied.sequence
    # From step 1 the wait runs again: nothing is copied, and it waits for a new signal.
    again = source.fork(from_step=1)
    weft_env.drive()
    assert again.status == RunStatus.WAITING and not Signal.objects.filter(run_id=again.run_id).exists()
    assert again.signal("go", "once more", signal_id="go-1") is True


def test_fork_copies_applied_updates_and_refuses_to_cut_inside_their_step(weft_env):
    source = weft.start("updates.ledger", 1)
    weft_env.drive()
    assert source.update("append", "a", update_id="u1") == 1
    assert source.result() == ["a"]
    assert journal(source) == [(1, "condition", "completed"), (2, "update", "completed")]
    with pytest.raises(weft.InvalidArgument, match="step 2: it is update 'append', applied within step 1; fork "
                                                   "from step 1 or 3"):
        source.fork(from_step=2)
    fork = source.fork(from_step=3)
    assert fork.result() == ["a"]  # the handler row replays
    assert WorkflowUpdate.objects.get(run_id=fork.run_id).applied_seq == 2
    assert fork.update("append", "a", update_id="u1") == 1  # a repeat gets its reply, not a second application


def test_fork_of_an_open_run_leaves_it_running_and_commits_with_the_callers_transaction(weft_env):
    source = weft.start("test.steps", {"key": "tx", "count": 2, "sleep": 5})
    weft_env.drive()
    assert source.status == RunStatus.WAITING
    with pytest.raises(RuntimeError), transaction.atomic():
        source.fork(from_step=2)
        raise RuntimeError("rolled back")
    assert Workflow.objects.count() == 1 and WorkflowStep.objects.exclude(run_id=source.run_id).count() == 0
    fork = source.fork(from_step=2)
    weft_env.advance(timedelta(seconds=6))
    assert source.result() == fork.result() == ["TX:0", "TX:1"]
    assert executions("tx:0") == 1 and executions("tx:1") == 2


# --- PostgreSQL: terminate racing a real executor --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrent
@pytest.mark.parametrize("release", ["after", "together"])
def test_terminate_racing_an_executor_process_ends_the_run_once_and_nothing_after_is_recorded(
        row_locks, maintenance, tmp_path, release):
    """A weft_maintenance process is inside the run's activity while four threads terminate it; the activity
    is let go after the terminates ("after") or at the same moment ("together"). One terminate wins, and no
    journal row is written after it: the executor's late commit is refused."""
    key = f"race-{release}"
    path = tmp_path / "release"
    handle = weft.start("fork.held", {"key": key, "path": str(path), "max_wait": 30}, workflow_id=key)
    proc = maintenance("loop", "--interval", "0.2")
    wait_until(lambda: executions(key + ":start") == 1, "the executor to enter the activity", 60, [proc])
    snapshots: dict = {}

    def action(index: int):
        if index == 4:
            if release == "together":
                path.touch()
            return None
        won = weft.terminate(key, reason=f"thread {index}")
        if won:
            snapshots["journal"] = journal(handle)
        return won

    results = in_threads(5, action)
    assert sorted(map(repr, results[:4])) == ["False", "False", "False", "True"], results
    path.touch()
    wait_until(lambda: executions(key + ":end") == 1, "the activity to return", 60, [proc])
    time.sleep(1.0)  # the executor tries to commit the activity's result, and is refused
    run = handle.refresh()
    assert run.status == RunStatus.TIMED_OUT and run.termination_reason == "terminated"
    assert run.error["reason"] == f"thread {results.index(True)}"
    assert journal(handle) == snapshots["journal"], "a row was recorded after the terminate"
    if release == "after":  # terminated while the executor was inside step 2
        assert snapshots["journal"] == [(1, "activity", "completed")]
    assert executions(key + ":after") == 0 or (2, "activity", "completed") in snapshots["journal"]
    assert proc.alive, proc.output()
