"""Workflow code stays suspended where its run parked (runtime.sticky_runs, WEFT_STICKY_ROWS): the run's next wake
on the same thread goes on from there, running none of its code again. Code kept for a state the run has left (
another executor, here or in another process, held it since) is let go, unwinding as a park does, and the run is
replayed from its journal as before; so is code that no longer fits."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_weft as weft
from django_weft.models import RunStatus
from django_weft.runtime import sticky_runs
from tests.procs import journal, run_once
from tests.test_kept_journals import balance_run, journal_reads
from tests.testapp.cleanup_workflows import PARKING_SEEN
from tests.testapp.workflows import executions


@pytest.fixture(autouse=True)
def _forget_what_cleanup_blocks_saw():
    PARKING_SEEN.clear()


def child_run(key: str) -> weft.WorkflowHandle:
    """A run of test.child, which marks each time its code begins, then sleeps a minute."""
    return weft.start("test.child", {"key": key, "sleep": 60})


@pytest.mark.django_db
def test_a_wake_on_the_same_thread_goes_on_where_the_code_parked(weft_env):
    handle = child_run("s1")
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    weft_env.advance(timedelta(seconds=60))
    assert handle.result() == "child s1 done"
    assert executions("s1:child") == 1


@pytest.mark.django_db
def test_with_no_rows_to_keep_every_wake_runs_the_code_from_its_start(weft_env, settings):
    settings.WEFT_STICKY_ROWS = 0
    handle = child_run("s2")
    weft_env.drive()
    weft_env.advance(timedelta(seconds=60))
    assert handle.result() == "child s2 done"
    assert executions("s2:child") == 2


@pytest.mark.django_db
def test_signals_consumed_by_code_that_stayed_parked_give_the_same_state_as_a_replay(weft_env):
    handle = balance_run(weft_env)  # parked: its code waits here
    for amount in (7, 11, 13):
        handle.signal("deposit", amount)
        assert journal_reads(weft_env.drive) == 0
    assert handle.query("balance") == 36  # a query replays the journal: the same state
    handle.signal("close")
    weft_env.drive()
    assert handle.result() == 36


@pytest.mark.django_db
def test_code_that_no_longer_fits_is_let_go_as_a_park_unwinds_and_its_run_replays(weft_env, settings):
    # Room for one run's code at its first park: its journal (an activity and a sleep) and the code itself.
    settings.WEFT_STICKY_ROWS = 2 + sticky_runs.CODE_ROWS
    first = weft.start("cleanup.finally", "let-go-1", workflow_id="let-go-1")
    weft_env.drive()
    assert PARKING_SEEN.get("let-go-1") is None  # parked, not unwound
    second = weft.start("cleanup.finally", "let-go-2", workflow_id="let-go-2")
    weft_env.drive()
    # The second run's code took the room: the first's was let go, its finally block saw a park and its durable
    # call in it did nothing.
    assert PARKING_SEEN["let-go-1"] == [True]
    assert PARKING_SEEN.get("let-go-2") is None
    assert executions("let-go-1:release") == 0
    weft_env.advance(timedelta(seconds=3))
    for handle in (first, second):
        handle.signal("paid", {"amount": 1})
    weft_env.drive()
    assert first.result() == second.result() == {"amount": 1}
    assert executions("let-go-1:release") == executions("let-go-2:release") == 1


@pytest.mark.django_db(transaction=True)
def test_code_parked_here_is_not_resumed_once_another_process_moved_the_run(weft_env, tmp_path):
    handle = balance_run(weft_env)  # parked here with a balance of 5: its code waits in this process
    handle.signal("deposit", 7)
    run_once("other", tmp_path)  # another executor consumes the deposit and parks the run again
    assert handle.refresh().status == RunStatus.WAITING
    handle.signal("deposit", 9)
    handle.signal("close")
    # The code kept here knows 5, not 12: it is let go and the journal read again.
    assert journal_reads(weft_env.drive) == 1
    assert handle.result() == 21
    assert [seq for seq, *_ in journal(handle.run_id)] == list(range(1, 300 + 5))


@pytest.mark.django_db
def test_code_parked_before_an_operator_moved_the_run_is_let_go(weft_env):
    handle = weft.start("cleanup.except_base", "moved", workflow_id="moved")
    weft_env.drive()  # parked at its signal wait: its code waits here
    handle.suspend(reason="look")
    handle.resume()  # the same journal, but the run's fence moved: the code kept is of a state it has left
    handle.signal("paid", {"amount": 3})
    weft_env.drive()
    assert PARKING_SEEN["moved"] == [True]  # let go: unwound as a park, its durable call in it refused
    assert handle.result() == {"amount": 3}
    assert executions("moved:release") == 0
