"""Workflow code stays suspended where its run parked (runtime.sticky_runs, WEFT_STICKY_ROWS): from a run's second
execution on, its next wake on the same thread goes on from there, running none of its code again. Code kept for
a state the run has left (another executor, here or in another process, or an operator held it since) is let go,
unwinding as a park does, and the run is replayed from its journal as before; so is code that no longer fits."""

from __future__ import annotations

import pytest

import django_weft as weft
from django_weft.models import RunStatus
from django_weft.runtime import sticky_runs
from tests.procs import journal, run_once
from tests.test_kept_journals import balance_run, journal_reads

# Per run (its input): each time its code began, and what each of its finally blocks saw of ctx.is_parking.
BEGAN: list[str] = []
PARKING: dict[str, list[bool]] = {}


@pytest.fixture(autouse=True)
def _forget():
    BEGAN.clear()
    PARKING.clear()


@weft.workflow(name="sticky.tally")
def tally(ctx: weft.Context, key: str) -> int:
    """Adds the ``add`` signals it takes until one carries None."""
    BEGAN.append(key)
    total = 0
    try:
        while (amount := ctx.wait_for_signal("add")) is not None:
            total += amount
        return total
    finally:
        PARKING.setdefault(key, []).append(ctx.is_parking)


def add(weft_env, handle: weft.WorkflowHandle, amount: int | None) -> None:
    handle.signal("add", amount)
    weft_env.drive()


def started(weft_env, key: str) -> weft.WorkflowHandle:
    """A tally whose code is kept where it parked: its first execution parks (and unwinds), the second is kept."""
    handle = weft.start(tally, key, workflow_id=key)
    weft_env.drive()
    add(weft_env, handle, 1)
    assert handle.refresh().status == RunStatus.WAITING
    return handle


@pytest.mark.django_db
def test_from_the_second_execution_a_wake_goes_on_where_the_code_parked(weft_env):
    handle = started(weft_env, "t1")
    for amount in (2, 3, 4):
        add(weft_env, handle, amount)
    add(weft_env, handle, None)
    assert handle.result() == 10
    assert BEGAN == ["t1", "t1"]  # its first execution, then the replay of its second: never again
    assert PARKING["t1"] == [True, False]  # the first park unwound the code; the end ran the finally for real


@pytest.mark.django_db
def test_with_no_rows_to_keep_every_wake_runs_the_code_from_its_start(weft_env, settings):
    settings.WEFT_STICKY_ROWS = 0
    handle = started(weft_env, "t2")
    for amount in (2, 3, 4):
        add(weft_env, handle, amount)
    add(weft_env, handle, None)
    assert handle.result() == 10
    assert BEGAN == ["t2"] * 6
    assert PARKING["t2"] == [True] * 5 + [False]


@pytest.mark.django_db
def test_signals_consumed_by_code_that_stayed_parked_give_the_same_state_as_a_replay(weft_env):
    handle = balance_run(weft_env)
    for amount in (7, 11, 13):
        handle.signal("deposit", amount)
        assert journal_reads(weft_env.drive) == 0
    assert handle.query("balance") == 36  # a query replays the journal: the same state
    handle.signal("close")
    weft_env.drive()
    assert handle.result() == 36


@pytest.mark.django_db
def test_code_that_no_longer_fits_is_let_go_as_a_park_unwinds_and_its_run_replays(weft_env, settings):
    # Room for one tally's code at its second park: its journal (two signal steps) and the code itself.
    settings.WEFT_STICKY_ROWS = 2 + sticky_runs.CODE_ROWS
    first = started(weft_env, "fits-1")
    assert PARKING["fits-1"] == [True]  # its first park only
    second = started(weft_env, "fits-2")
    # The second tally's code took the room: the first's was let go, and its finally block saw a park.
    assert PARKING["fits-1"] == [True, True]
    assert BEGAN == ["fits-1", "fits-1", "fits-2", "fits-2"]
    add(weft_env, first, 5)
    assert BEGAN.count("fits-1") == 3  # replayed: its code began again
    for handle in (first, second):
        add(weft_env, handle, None)
    assert (first.result(), second.result()) == (6, 1)


@pytest.mark.django_db
def test_code_parked_before_an_operator_moved_the_run_is_let_go(weft_env):
    handle = started(weft_env, "moved")
    handle.suspend(reason="look")
    handle.resume()  # the same journal, but the run's fence moved: the code kept is of a state it has left
    add(weft_env, handle, 2)
    assert PARKING["moved"] == [True, True]  # let go: unwound as a park
    add(weft_env, handle, None)
    assert handle.result() == 3
    assert BEGAN == ["moved"] * 3


@pytest.mark.django_db
def test_a_cancel_reaches_code_that_stayed_parked(weft_env):
    handle = started(weft_env, "cancelled")
    handle.cancel("no more")
    weft_env.drive()
    assert handle.refresh().status == RunStatus.CANCELLED
    assert BEGAN == ["cancelled"] * 2
    assert PARKING["cancelled"] == [True, False]  # its finally ran once, for real, where the code waited


@pytest.mark.django_db(transaction=True)
def test_code_parked_here_is_not_resumed_once_another_process_moved_the_run(weft_env, tmp_path):
    handle = balance_run(weft_env)
    handle.signal("deposit", 7)
    weft_env.drive()  # its second execution: its code, with a balance of 12, waits in this process
    handle.signal("deposit", 9)
    run_once("other", tmp_path)  # another executor consumes the deposit and parks the run again
    assert handle.refresh().status == RunStatus.WAITING
    handle.signal("deposit", 1)
    handle.signal("close")
    # The code kept here knows 12, not 21: it is let go and the journal read again.
    assert journal_reads(weft_env.drive) == 1
    assert handle.result() == 22
    assert [seq for seq, *_ in journal(handle.run_id)] == list(range(1, 300 + 6))
