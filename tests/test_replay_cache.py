"""Queries and update admissions on a long run that has not moved answer from the state kept since the last
replay (services.replay_cache, WEFT_REPLAY_CACHE_ROWS); once the run moves they replay its journal again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_weft as weft
from django_weft.models import WorkflowStep

pytestmark = pytest.mark.django_db

LONG = 300  # journal rows past the 200 from which a replay is kept


def statements(call) -> tuple[object, int]:
    with CaptureQueriesContext(connection) as captured:
        value = call()
    return value, len(captured.captured_queries)


def journal_reads(call) -> tuple[object, int]:
    """``call()``'s value and how many of its statements read the journal table."""
    table = WorkflowStep._meta.db_table
    with CaptureQueriesContext(connection) as captured:
        value = call()
    return value, sum(table in q["sql"] for q in captured.captured_queries)


def test_a_repeated_query_on_a_long_run_that_has_not_moved_reads_no_journal(weft_env):
    handle = weft.start("queries.ledger", LONG)
    handle.signal("deposit", 5)
    weft_env.drive()
    assert journal_reads(lambda: handle.query("balance")) == (5, 1)
    assert journal_reads(lambda: handle.query("balance")) == (5, 0)
    _, count = statements(lambda: handle.query("balance"))
    assert count == 1  # the run's row, to know it has not moved


def test_once_the_run_moves_the_query_replays_and_answers_its_new_state(weft_env):
    handle = weft.start("queries.ledger", LONG)
    handle.signal("deposit", 5)
    weft_env.drive()
    assert handle.query("balance") == 5
    handle.signal("deposit", 7)
    assert handle.query("balance") == 5  # delivered, not consumed: the journal has not moved
    weft_env.drive()
    assert journal_reads(lambda: handle.query("balance")) == (12, 1)
    handle.signal("close")
    weft_env.drive()
    assert handle.result() == 12
    assert journal_reads(lambda: handle.query("balance")) == (12, 1)  # finished: a new fence, replayed once
    assert journal_reads(lambda: handle.query("balance")) == (12, 0)


def test_a_short_run_is_replayed_at_every_query(weft_env):
    handle = weft.start("queries.ledger", 3)
    handle.signal("deposit", 2)
    weft_env.drive()
    assert journal_reads(lambda: handle.query("balance")) == (2, 1)
    assert journal_reads(lambda: handle.query("balance")) == (2, 1)


def test_with_no_rows_to_keep_every_query_replays(weft_env, settings):
    settings.WEFT_REPLAY_CACHE_ROWS = 0
    handle = weft.start("queries.ledger", LONG)
    weft_env.drive()
    assert journal_reads(lambda: handle.query("balance")) == (0, 1)
    assert journal_reads(lambda: handle.query("balance")) == (0, 1)


def test_a_run_whose_journal_passes_the_limit_is_not_kept(weft_env, settings):
    settings.WEFT_REPLAY_CACHE_ROWS = LONG - 1
    handle = weft.start("queries.ledger", LONG)
    weft_env.drive()
    assert journal_reads(lambda: handle.query("balance")) == (0, 1)
    assert journal_reads(lambda: handle.query("balance")) == (0, 1)


def test_the_least_recently_used_run_is_dropped_first(weft_env, settings):
    settings.WEFT_REPLAY_CACHE_ROWS = 2 * (LONG + 2)  # room for two runs' journals, not three
    first, second, third = (weft.start("queries.ledger", LONG) for _ in range(3))
    weft_env.drive()
    for handle in (first, second, first, third):  # first used again: second is the least recently used
        handle.query("balance")
    assert journal_reads(lambda: first.query("balance"))[1] == 0
    assert journal_reads(lambda: third.query("balance"))[1] == 0
    assert journal_reads(lambda: second.query("balance"))[1] == 1


def test_an_update_is_validated_against_the_state_after_the_run_moved(weft_env):
    handle = weft.start("queries.ledger", LONG)
    handle.signal("deposit", 5)
    weft_env.drive()
    with pytest.raises(weft.UpdateRejected, match="only 5 to withdraw"):
        handle.start_update("withdraw", 9)
    handle.signal("deposit", 10)
    weft_env.drive()
    update = handle.start_update("withdraw", 9)  # 15 now: accepted, not judged on the kept state of 5
    weft_env.drive()
    assert update.result(timeout=0) == 6
    assert handle.query("balance") == 6
    with pytest.raises(weft.UpdateRejected, match="only 6 to withdraw"):
        handle.start_update("withdraw", 7)


def test_an_operator_action_that_moves_the_fence_drops_the_kept_state(weft_env):
    handle = weft.start("queries.ledger", LONG)
    handle.signal("deposit", 4)
    weft_env.drive()
    assert handle.query("balance") == 4
    handle.suspend(reason="inspecting")
    assert journal_reads(lambda: handle.query("balance")) == (4, 1)
    handle.resume()
    assert journal_reads(lambda: handle.query("balance")) == (4, 1)


def test_a_change_of_payload_codec_drops_the_kept_state(weft_env, settings):
    handle = weft.start("queries.ledger", LONG)
    weft_env.drive()
    handle.query("balance")
    assert journal_reads(lambda: handle.query("balance"))[1] == 0
    settings.WEFT_PAYLOAD_CODEC = None  # a new key ring (even the same one): rows kept decoded with the old go
    assert journal_reads(lambda: handle.query("balance")) == (0, 1)
