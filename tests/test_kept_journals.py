"""A run's next wake in the process that parked it reads no journal rows (runtime.kept_journals,
WEFT_EXECUTOR_CACHE_ROWS); a run another executor held in between, here or in another process, is read from the
database again, and ends as if nothing had been kept."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_weft as weft
from django_weft.models import RunStatus, WorkflowStep
from tests.procs import journal, run_once

LONG = 300


@pytest.fixture(autouse=True)
def _nothing_stays_parked(settings):
    settings.WEFT_STICKY_ROWS = 0  # code that stays parked needs no journal at all (tests/test_sticky_runs.py)


def journal_reads(call) -> int:
    """How many SELECTs of journal rows ``call()`` sends (a COUNT of them is not one)."""
    table = WorkflowStep._meta.db_table
    with CaptureQueriesContext(connection) as captured:
        call()
    return sum(sql.lstrip().upper().startswith("SELECT") and f'FROM "{table}"' in sql and "COUNT(" not in sql.upper()
               for sql in (q["sql"].replace("`", '"') for q in captured.captured_queries))


def balance_run(weft_env) -> weft.WorkflowHandle:
    handle = weft.start("queries.ledger", LONG)
    handle.signal("deposit", 5)
    weft_env.drive()
    assert handle.refresh().status == RunStatus.WAITING
    return handle


@pytest.mark.django_db
def test_a_wake_in_the_process_that_parked_the_run_reads_no_journal_rows(weft_env):
    handle = balance_run(weft_env)
    handle.signal("deposit", 7)
    assert journal_reads(weft_env.drive) == 0
    handle.signal("close")
    assert journal_reads(weft_env.drive) == 0
    assert handle.result() == 12
    assert [seq for seq, *_ in journal(handle.run_id)] == list(range(1, LONG + 4))


@pytest.mark.django_db
def test_with_no_rows_to_keep_every_wake_reads_the_journal(weft_env, settings):
    settings.WEFT_EXECUTOR_CACHE_ROWS = 0
    handle = balance_run(weft_env)
    handle.signal("deposit", 7)
    assert journal_reads(weft_env.drive) == 1
    assert handle.query("balance") == 12


@pytest.mark.django_db
def test_a_journal_longer_than_the_rows_to_keep_is_read_again(weft_env, settings):
    settings.WEFT_EXECUTOR_CACHE_ROWS = LONG
    handle = balance_run(weft_env)  # LONG + 2 rows once parked
    handle.signal("deposit", 7)
    assert journal_reads(weft_env.drive) == 1


@pytest.mark.django_db
def test_a_run_suspended_and_resumed_in_between_is_read_again(weft_env):
    handle = balance_run(weft_env)
    handle.suspend(reason="look")
    handle.resume()
    handle.signal("deposit", 7)
    assert journal_reads(weft_env.drive) == 1
    assert handle.query("balance") == 12


@pytest.mark.django_db(transaction=True)
def test_a_run_another_process_moved_in_between_is_read_again_and_ends_right(weft_env, tmp_path):
    handle = balance_run(weft_env)  # parked here: its journal is kept in this process
    handle.signal("deposit", 7)
    run_once("other", tmp_path)  # another executor takes the run, consumes the deposit and parks it again
    assert handle.refresh().status == RunStatus.WAITING
    assert handle.query("balance") == 12
    handle.signal("deposit", 9)
    handle.signal("close")
    # This process's kept journal lacks the other executor's rows: it must not be used.
    assert journal_reads(weft_env.drive) == 1
    assert handle.result() == 21
    seqs = [seq for seq, *_ in journal(handle.run_id)]
    assert seqs == list(range(1, LONG + 5))


@pytest.mark.django_db
def test_an_update_handler_making_durable_calls_keeps_no_journal(weft_env):
    # Its rows are written from a context of its own: the run's next wake reads the journal again.
    handle = weft.start("updates.cart", "kept")
    weft_env.drive()
    update = handle.start_update("durable")
    weft_env.drive()
    assert update.result(timeout=0) is not None
    handle.start_update("add_item", "A1")
    assert journal_reads(weft_env.drive) == 1
    assert handle.query("items") == ["A1"]


@pytest.mark.django_db
def test_a_change_of_payload_codec_drops_the_kept_journals(weft_env, settings):
    handle = balance_run(weft_env)
    settings.WEFT_PAYLOAD_CODEC = None  # a new key ring (even the same one): rows kept decoded with the old go
    handle.signal("deposit", 7)
    assert journal_reads(weft_env.drive) == 1
    assert handle.query("balance") == 12
