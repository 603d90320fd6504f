"""Schedules at their edges: a restart of weft_maintenance (the WEFT_SCHEDULES sync), an edit while an
occurrence is due, a trigger at the instant of an occurrence, an occurrence at the end of weft_env.advance().

Whatever happens, an occurrence that fell due is decided once, by the schedule's own policy, and leaves a
ScheduleOccurrence row (design §9.1, "Settings schedules survive restarts").
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC, timedelta

import pytest

import django_weft as weft
from django_weft.models import ScheduleOccurrence, Workflow
from django_weft.testing import WeftTestEnv

pytestmark = pytest.mark.django_db

EVENING = dt.datetime(2026, 6, 1, 19, 14, 40, tzinfo=UTC)
MINUTE = dt.datetime(2026, 6, 1, 19, 15, tzinfo=UTC)  # the occurrence that falls due while nothing runs


def runs(schedule_id):
    return list(Workflow.objects.filter(schedule__schedule_id=schedule_id).order_by("scheduled_for"))


def ledger(schedule_id):
    """(scheduled_for, outcome, count) of every decision, in order."""
    return list(ScheduleOccurrence.objects.filter(schedule__schedule_id=schedule_id).order_by("scheduled_for", "id")
                .values_list("scheduled_for", "outcome", "count"))


# --- an edit while an occurrence is due ---------------------------------------------------------------


def test_an_update_keeps_the_occurrence_that_is_due_but_not_ticked_yet():
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("edited", "test.collect", 0, cron="*/1 * * * *", timezone="UTC")
    with WeftTestEnv(start=MINUTE + timedelta(milliseconds=400)) as env:
        schedule.update(overlap="allow_all")  # before the tick at 19:15 came
        assert schedule.next_fire_at == MINUTE + timedelta(minutes=1)
        env.drive()
    assert [run.scheduled_for for run in runs("edited")] == [MINUTE]
    assert ledger("edited") == [(MINUTE, "started", 1)]


def test_an_update_that_changes_nothing_of_the_timing_keeps_the_next_occurrence():
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("kept", "test.collect", 0, every=timedelta(minutes=10), backfill=True)
        first = schedule.next_fire_at
    with WeftTestEnv(start=first + timedelta(minutes=3)) as env:
        schedule.update(input=5)  # the 19:24:40 occurrence was due, unticked: it runs now, with the new input
        assert schedule.next_fire_at == first + timedelta(minutes=10)
        env.drive()
    assert [(run.scheduled_for, run.decoded_input) for run in runs("kept")] == [(first, 5)]


def test_a_backlog_beyond_one_tick_is_counted_when_the_cadence_changes():
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("backlog", "test.collect", 0, every=timedelta(seconds=1), backfill=True,
                                        overlap="allow_all")
    with WeftTestEnv(start=EVENING + timedelta(seconds=300, milliseconds=500)):
        schedule.update(every=timedelta(minutes=1))
    decided = ledger("backlog")
    assert sum(count for _, outcome, count in decided if outcome == "started") == 256
    assert [(outcome, count) for _, outcome, count in decided if outcome != "started"] == [("missed", 44)]
    assert weft.get_schedule("backlog").missed_fire_count == 44


# --- an occurrence that already has a run ------------------------------------------------------------


def test_a_trigger_at_the_instant_an_occurrence_started_is_traced():
    with WeftTestEnv(start=EVENING) as env:
        schedule = weft.create_schedule("t", "test.collect", 0, cron="*/1 * * * *", timezone="UTC",
                                        overlap="allow_all")
        env.advance(MINUTE - EVENING)
        [started] = runs("t")
        assert schedule.trigger() is None
    assert runs("t") == [started]
    assert ledger("t") == [(MINUTE, "started", 1), (MINUTE, "skipped", 1)]
    trace = ScheduleOccurrence.objects.filter(schedule=schedule).order_by("id").last()
    assert trace.run_id == started.pk and "already has a run" in trace.detail


@pytest.mark.parametrize("overlap", ["cancel_other", "buffer_one", "buffer_all", "skip"])
def test_the_tick_of_an_occurrence_a_trigger_started_leaves_that_run_alone(overlap):
    """trigger() at 19:15:00.000, then the tick for 19:15: the occurrence has its run. cancel_other used to
    cancel it (and start nothing), buffer_one to buffer the occurrence and drop it unrecorded later."""
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("o", "test.collect", 1, cron="*/1 * * * *", timezone="UTC", overlap=overlap)
    with WeftTestEnv(start=MINUTE) as env:
        triggered = schedule.trigger()
        env.drive()  # the tick for 19:15
        assert triggered is not None
        schedule.refresh_from_db()
        assert schedule.queued_runs == 0
        weft.signal(triggered.workflow_id, "item", "done")
        env.drive()
    assert [(run.scheduled_for, run.status) for run in runs("o")] == [(MINUTE, "completed")]
    assert ledger("o") == [(MINUTE, "started", 1), (MINUTE, "skipped", 1)]


def test_the_tick_traces_an_occurrence_that_a_backfill_started_first():
    with WeftTestEnv(start=EVENING) as env:
        schedule = weft.create_schedule("bf", "test.collect", 0, cron="*/1 * * * *", timezone="UTC")
        assert schedule.backfill(MINUTE, MINUTE) == 1
        env.advance(MINUTE - EVENING)
    assert len(runs("bf")) == 1
    assert ledger("bf") == [(MINUTE, "started", 1), (MINUTE, "skipped", 1)]


def test_a_late_tick_does_not_count_an_occurrence_that_a_trigger_started_as_missed():
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("late", "test.collect", 0, cron="*/1 * * * *", timezone="UTC")
    with WeftTestEnv(start=MINUTE):
        assert schedule.trigger() is not None  # at 19:15:00 exactly: it is the 19:15 occurrence's run
        weft.run_maintenance(now=MINUTE + timedelta(minutes=5, seconds=30))
    schedule.refresh_from_db()
    assert ledger("late") == [(MINUTE, "started", 1), (MINUTE, "skipped", 1),
                              (MINUTE + timedelta(minutes=1), "missed", 5)]
    assert (schedule.missed_fire_count, schedule.last_missed_fire_at) == (5, MINUTE + timedelta(minutes=5))
