"""Schedules: cadence, time zones and DST, late ticks, backfill, overlap policies, jitter, operations."""

from __future__ import annotations

import datetime as dt
from datetime import UTC, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.test import override_settings

import django_weft as weft
from django_weft import signals
from django_weft.models import Schedule, ScheduleOccurrence, Workflow
from django_weft.testing import WeftTestEnv

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # a Monday, noon UTC


@pytest.fixture
def env():
    with WeftTestEnv(start=T0) as env:
        yield env


def runs(schedule):
    return list(Workflow.objects.filter(schedule=schedule).order_by("scheduled_for"))


def outcomes(schedule):
    return list(ScheduleOccurrence.objects.filter(schedule=schedule).order_by("scheduled_for", "id")
                .values_list("outcome", flat=True))


# --- creation and validation --------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({}, weft.InvalidArgument, "exactly one of cron and every"),
    ({"cron": "* * * * *", "every": 60}, weft.InvalidArgument, "exactly one of cron and every"),
    ({"cron": "61 * * * *"}, weft.InvalidArgument, "invalid cron expression"),
    ({"cron": "* * *"}, weft.InvalidArgument, "has 3 fields"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, weft.InvalidArgument, "unknown time zone 'Mars/Olympus'"),
    ({"every": 0}, weft.InvalidArgument, "every must be positive"),
    ({"every": timedelta(milliseconds=10)}, weft.InvalidArgument, "at least one second"),
    ({"cron": "* * * * *", "overlap": "queue"}, weft.InvalidArgument, "overlap must be one of"),
    ({"cron": "* * * * *", "jitter": -1}, weft.InvalidArgument, "jitter must be positive"),
    ({"cron": "* * * * *", "catchup_window": "1h"}, weft.InvalidArgument, "catchup_window must be a timedelta"),
    ({"cron": "* * * * *", "start_at": dt.datetime(2026, 1, 1)}, weft.InvalidArgument, "aware datetime"),
    ({"cron": "* * * * *", "start_at": T0, "end_at": T0}, weft.InvalidArgument, "end_at must be after"),
])
def test_invalid_schedules_are_rejected_and_nothing_is_written(env, kwargs, error, message):
    with pytest.raises(error, match=message):
        weft.create_schedule("bad", "test.collect", 0, **kwargs)
    assert Schedule.objects.count() == 0


def test_unknown_workflow_and_duplicate_ids(env):
    with pytest.raises(weft.WorkflowNotRegistered):
        weft.create_schedule("s", "no.such", cron="* * * * *")
    weft.create_schedule("s", "test.collect", 0, cron="* * * * *")
    with pytest.raises(weft.ScheduleAlreadyExists, match="'s' already exists"):
        weft.create_schedule("s", "test.collect", 0, cron="* * * * *")
    assert Schedule.objects.count() == 1


def test_a_cron_schedule_starts_one_run_per_occurrence(env):
    fired = []
    signals.schedule_fired.connect(lambda **kw: fired.append(kw["occurrence"]), weak=False, dispatch_uid="f")
    try:
        schedule = weft.create_schedule("every-5", "test.collect", 0, cron="*/5 * * * *", timezone="UTC")
        assert schedule.next_fire_at == T0 + timedelta(minutes=5)
        env.advance(timedelta(minutes=4, seconds=59))
        assert runs(schedule) == []
        env.advance(timedelta(seconds=1))
        env.advance(timedelta(minutes=5))
    finally:
        signals.schedule_fired.disconnect(dispatch_uid="f")
    started = runs(schedule)
    assert [r.scheduled_for for r in started] == [T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)]
    assert all(r.status == "completed" for r in started)
    schedule.refresh_from_db()
    assert schedule.last_fire_at == T0 + timedelta(minutes=10)
    assert schedule.next_fire_at == T0 + timedelta(minutes=15)
    assert outcomes(schedule) == ["started", "started"]


def test_six_field_cron_has_seconds_first(env):
    schedule = weft.create_schedule("s6", "test.collect", 0, cron="*/20 * * * * *", timezone="UTC")
    assert weft_next(schedule, 3) == [T0 + timedelta(seconds=20), T0 + timedelta(seconds=40), T0 + timedelta(minutes=1)]


def weft_next(schedule, count):
    from django_weft.services.schedules import next_occurrences

    return next_occurrences(schedule, count)


def test_interval_schedule_is_anchored_at_creation_or_start_at(env):
    a = weft.create_schedule("a", "test.collect", 0, every=timedelta(hours=1))
    assert weft_next(a, 2) == [T0 + timedelta(hours=1), T0 + timedelta(hours=2)]
    start = T0 + timedelta(minutes=10)
    b = weft.create_schedule("b", "test.collect", 0, every=timedelta(hours=1), start_at=start,
                             end_at=start + timedelta(hours=1, minutes=30))
    assert weft_next(b, 5) == [start, start + timedelta(hours=1)]


# --- daylight saving time ------------------------------------------------------------------------------

def test_a_local_time_that_does_not_exist_fires_once_at_the_shifted_time():
    # Europe/Berlin springs forward on 2026-03-29: 02:00 CET becomes 03:00 CEST.
    start = dt.datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
    berlin = ZoneInfo("Europe/Berlin")
    with WeftTestEnv(start=start) as env:
        schedule = weft.create_schedule("dst-gap", "test.collect", 0, cron="30 2 * * *", timezone="Europe/Berlin")
        for _ in range(3 * 24 * 4):  # tick every 15 minutes, on time
            env.advance(timedelta(minutes=15))
        local = [r.scheduled_for.astimezone(berlin) for r in runs(schedule)]
    assert [(t.day, t.hour, t.minute) for t in local] == [(29, 3, 30), (30, 2, 30), (31, 2, 30)]


def test_a_local_time_that_exists_twice_fires_once():
    # Europe/Berlin falls back on 2026-10-25: 02:30 happens at 00:30 UTC and again at 01:30 UTC.
    start = dt.datetime(2026, 10, 24, 12, 0, tzinfo=UTC)
    with WeftTestEnv(start=start) as env:
        schedule = weft.create_schedule("dst-twice", "test.collect", 0, cron="30 2 * * *",
                                        timezone="Europe/Berlin")
        for _ in range(24 * 4):  # tick every 15 minutes through the change
            env.advance(timedelta(minutes=15))
        fired = [r.scheduled_for for r in runs(schedule)]
    assert fired == [dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]


def test_hourly_cron_across_the_gap_never_fires_an_instant_twice():
    start = dt.datetime(2026, 3, 28, 23, 30, tzinfo=UTC)
    with WeftTestEnv(start=start):
        schedule = weft.create_schedule("dst-hourly", "test.collect", 0, cron="0 * * * *",
                                        timezone="Europe/Berlin")
        upcoming = weft_next(schedule, 4)
    assert upcoming == [dt.datetime(2026, 3, 29, h, 0, tzinfo=UTC) for h in (0, 1, 2, 3)]


# --- late ticks, backfill --------------------------------------------------------------------------------

def test_a_late_tick_counts_missed_occurrences_and_starts_none(env, django_capture_on_commit_callbacks):
    missed = []
    signals.schedule_missed_fire.connect(lambda **kw: missed.append(kw), weak=False, dispatch_uid="m")
    try:
        schedule = weft.create_schedule("late", "test.collect", 0, cron="* * * * *", timezone="UTC",
                                        catchup_window=timedelta(seconds=1))  # nothing late starts
        with django_capture_on_commit_callbacks(execute=True):
            weft.run_maintenance(now=T0 + timedelta(minutes=5, seconds=30))
    finally:
        signals.schedule_missed_fire.disconnect(dispatch_uid="m")
    schedule.refresh_from_db()
    assert runs(schedule) == []
    assert schedule.missed_fire_count == 5
    assert schedule.last_missed_fire_at == T0 + timedelta(minutes=5)
    assert schedule.next_fire_at == T0 + timedelta(minutes=6)
    assert [(m["count"], m["window_start"], m["window_end"]) for m in missed] == [
        (5, T0 + timedelta(minutes=1), T0 + timedelta(minutes=5))]
    [trace] = ScheduleOccurrence.objects.filter(schedule=schedule)
    assert (trace.outcome, trace.count) == ("missed", 5)


def test_a_late_tick_starts_the_latest_occurrence_within_the_late_start_window(env):
    # Down from 12:00:30 to 12:35:30: the 34 occurrences before the latest are missed, the latest (30 s
    # late, within WEFT_SCHEDULE_LATE_START) starts once, as Celery beat runs a missed entry once.
    schedule = weft.create_schedule("late-start", "test.collect", 0, cron="* * * * *", timezone="UTC")
    weft.run_maintenance(now=T0 + timedelta(minutes=35, seconds=30))
    schedule.refresh_from_db()
    assert [run.scheduled_for for run in runs(schedule)] == [T0 + timedelta(minutes=35)]
    assert schedule.missed_fire_count == 34
    # Later than the window (one hour by default): the latest is missed too.
    hourly = weft.create_schedule("late-hourly", "test.collect", 0, cron="0 * * * *", timezone="UTC")
    weft.run_maintenance(now=T0 + timedelta(hours=2, minutes=1))
    hourly.refresh_from_db()
    assert [run.scheduled_for for run in runs(hourly)] == [T0 + timedelta(hours=2)]
    weft.run_maintenance(now=T0 + timedelta(hours=4, minutes=1, seconds=1))
    hourly.refresh_from_db()
    assert [run.scheduled_for for run in runs(hourly)] == [T0 + timedelta(hours=2), T0 + timedelta(hours=4)]
    weft.run_maintenance(now=T0 + timedelta(hours=6, minutes=59))
    weft.run_maintenance(now=T0 + timedelta(hours=7, minutes=30))
    hourly.refresh_from_db()
    assert [run.scheduled_for for run in runs(hourly)][2:] == [T0 + timedelta(hours=6), T0 + timedelta(hours=7)]


def test_a_tick_within_one_second_is_on_time(env):
    schedule = weft.create_schedule("grace", "test.collect", 0, cron="* * * * *", timezone="UTC",
                                    catchup_window=timedelta(seconds=1))
    weft.run_maintenance(now=T0 + timedelta(minutes=1, milliseconds=999))
    assert len(runs(schedule)) == 1
    weft.run_maintenance(now=T0 + timedelta(minutes=2, seconds=1, milliseconds=1))
    schedule.refresh_from_db()
    assert len(runs(schedule)) == 1 and schedule.missed_fire_count == 1


def test_backfill_runs_missed_occurrences_in_order_up_to_256_per_tick(env):
    schedule = weft.create_schedule("bf", "test.collect", 0, cron="* * * * *", timezone="UTC", backfill=True,
                                    overlap="allow_all")
    weft.run_maintenance(now=T0 + timedelta(minutes=300, seconds=30))
    first = runs(schedule)
    assert len(first) == 256
    assert [r.scheduled_for for r in first] == [T0 + timedelta(minutes=i) for i in range(1, 257)]
    weft.run_maintenance(now=T0 + timedelta(minutes=300, seconds=31))
    assert len(runs(schedule)) == 300
    schedule.refresh_from_db()
    assert schedule.missed_fire_count == 0 and schedule.next_fire_at == T0 + timedelta(minutes=301)


def test_catchup_window_bounds_how_far_back_backfill_reaches(env):
    schedule = weft.create_schedule("cw", "test.collect", 0, cron="* * * * *", timezone="UTC", backfill=True,
                                    overlap="allow_all", catchup_window=timedelta(minutes=3))
    weft.run_maintenance(now=T0 + timedelta(minutes=10, seconds=30))
    assert [r.scheduled_for for r in runs(schedule)] == [T0 + timedelta(minutes=m) for m in (8, 9, 10)]
    schedule.refresh_from_db()
    assert schedule.missed_fire_count == 7
    assert outcomes(schedule) == ["outside_catchup", "started", "started", "started"]


# --- overlap -----------------------------------------------------------------------------------------------

def fire(env, minutes=1):
    env.advance(timedelta(minutes=minutes))


def test_skip_keeps_one_run_while_it_is_open(env):
    schedule = weft.create_schedule("skip", "test.collect", 1, cron="* * * * *", timezone="UTC")
    fire(env)
    fire(env)
    [run] = runs(schedule)
    assert run.status == "waiting", "a waiting run counts as open"
    assert outcomes(schedule) == ["started", "skipped"]
    weft.signal(run.workflow_id, "item", "done")
    env.drive()
    fire(env)
    assert len(runs(schedule)) == 2


def test_buffer_one_keeps_one_and_starts_it_when_the_run_finishes(env):
    schedule = weft.create_schedule("b1", "test.collect", 1, cron="* * * * *", timezone="UTC",
                                    overlap="buffer_one")
    fire(env)
    fire(env)
    fire(env)
    schedule.refresh_from_db()
    assert schedule.queued_runs == 1
    assert outcomes(schedule) == ["started", "buffered", "buffer_full"]
    first = runs(schedule)[0]
    weft.signal(first.workflow_id, "item", "done")  # wakes it
    env.drive()  # it completes; the buffered occurrence starts in the same transaction
    started = runs(schedule)
    assert len(started) == 2 and started[1].scheduled_for == T0 + timedelta(minutes=2)
    schedule.refresh_from_db()
    assert schedule.queued_runs == 0 and schedule.current_run_id == started[1].pk


def test_buffer_all_counts_every_occurrence_and_starts_one_per_finished_run(env):
    schedule = weft.create_schedule("ba", "test.collect", 1, cron="* * * * *", timezone="UTC",
                                    overlap="buffer_all")
    for _ in range(4):
        fire(env)
    schedule.refresh_from_db()
    assert schedule.queued_runs == 3
    for expected in (2, 3, 4):
        current = Workflow.objects.get(pk=schedule.current_run_id)
        weft.signal(current.workflow_id, "item", "done")
        env.drive()
        schedule.refresh_from_db()
        assert len(runs(schedule)) == expected
        assert schedule.queued_runs == 4 - expected


def test_cancel_other_cancels_the_open_run_then_starts(env):
    schedule = weft.create_schedule("co", "test.collect", 1, cron="* * * * *", timezone="UTC",
                                    overlap="cancel_other")
    fire(env)
    fire(env)
    first, second = runs(schedule)
    assert first.status == "cancelled" and "cancel_other" in first.error["message"]
    assert second.status == "waiting"


def test_allow_all_starts_regardless(env):
    schedule = weft.create_schedule("aa", "test.collect", 1, cron="* * * * *", timezone="UTC",
                                    overlap="allow_all")
    for _ in range(3):
        fire(env)
    assert [r.status for r in runs(schedule)] == ["waiting"] * 3


# --- jitter ------------------------------------------------------------------------------------------------

def test_jitter_is_deterministic_and_stays_before_the_next_occurrence(env):
    jitter = timedelta(seconds=30)
    a = weft.create_schedule("j1", "test.collect", 0, cron="* * * * *", timezone="UTC", jitter=jitter)
    b = weft.create_schedule("j2", "test.collect", 0, cron="* * * * *", timezone="UTC", jitter=jitter)
    for schedule in (a, b):
        assert schedule.next_fire_at == T0 + timedelta(minutes=1)  # nominal
        assert T0 + timedelta(minutes=1) <= schedule.due_at < T0 + timedelta(minutes=1, seconds=30)
    assert a.due_at != b.due_at, "the delay depends on the schedule"
    from django_weft.common.occurrences import jitter_offset

    assert jitter_offset("j1", a.next_fire_at, jitter, None) == a.due_at - a.next_fire_at
    env.advance(a.due_at - T0 - timedelta(microseconds=1))
    assert runs(a) == []
    env.advance(timedelta(microseconds=1))
    assert [r.scheduled_for for r in runs(a)] == [T0 + timedelta(minutes=1)]
    a.refresh_from_db()
    assert a.missed_fire_count == 0, "lateness is measured against the jittered time"


def test_jitter_never_reaches_the_next_occurrence(env):
    schedule = weft.create_schedule("jcap", "test.collect", 0, cron="* * * * *", timezone="UTC",
                                    jitter=timedelta(hours=1))
    assert T0 + timedelta(minutes=1) <= schedule.due_at < T0 + timedelta(minutes=2)


# --- errors -------------------------------------------------------------------------------------------------

def test_an_error_in_a_tick_pauses_the_schedule_with_the_reason(env):
    schedule = weft.create_schedule("err", "test.collect", 0, cron="* * * * *", timezone="UTC")
    healthy = weft.create_schedule("ok", "test.collect", 0, cron="* * * * *", timezone="UTC")
    Schedule.objects.filter(pk=schedule.pk).update(workflow_type="retired.workflow")
    fire(env)
    schedule.refresh_from_db()
    assert schedule.status == "paused" and "retired.workflow" in schedule.note
    assert "error" in outcomes(schedule)
    assert len(runs(healthy)) == 1, "one schedule's error does not stop the others"


def test_an_occurrence_started_already_is_not_started_twice_and_the_page_goes_on(env):
    """Backfill already started the due occurrence: the tick's start of it fails on the unique constraint,
    which neither pauses the schedule nor stops the others ticked with it."""
    clash = weft.create_schedule("clash", "test.collect", 0, cron="* * * * *", timezone="UTC")
    others = [weft.create_schedule(f"other-{i}", "test.collect", 0, cron="* * * * *", timezone="UTC")
              for i in range(3)]
    due = Schedule.objects.get(pk=clash.pk).next_fire_at
    assert clash.backfill(due, due) == 1
    env.advance(due - env.now())
    clash.refresh_from_db()
    assert clash.status == "active" and [r.scheduled_for for r in runs(clash)] == [due]
    assert clash.next_fire_at == due + timedelta(minutes=1)
    for other in others:
        assert [r.scheduled_for for r in runs(other)] == [due]
        assert outcomes(other) == ["started"]


def test_a_failed_run_does_not_pause_the_schedule(env):
    schedule = weft.create_schedule("fails", "test.uncaught", "x", cron="* * * * *", timezone="UTC")
    fire(env)
    fire(env)
    schedule.refresh_from_db()
    assert schedule.status == "active"
    assert [r.status for r in runs(schedule)] == ["failed", "failed"]


# --- operations ----------------------------------------------------------------------------------------------

def test_pause_resume_trigger_update_cancel(env):
    schedule = weft.create_schedule("ops", "test.collect", 0, cron="0 * * * *", timezone="UTC")
    schedule.pause("maintenance window")
    assert (schedule.status, schedule.note, schedule.next_fire_at) == ("paused", "maintenance window", None)
    env.advance(timedelta(hours=2))
    assert runs(schedule) == []
    schedule.resume()
    assert schedule.status == "active" and schedule.next_fire_at == T0 + timedelta(hours=3)
    run = schedule.trigger()
    assert run is not None and run.scheduled_for == env.now()
    schedule.update(every=timedelta(minutes=10))
    assert schedule.cron == "" and schedule.next_fire_at == env.now() + timedelta(minutes=10)
    with pytest.raises(weft.InvalidArgument, match="cannot update"):
        schedule.update(schedule_id="renamed")
    schedule.cancel()
    assert schedule.status == "cancelled" and schedule.next_fire_at is None
    with pytest.raises(weft.TransitionNotAllowed, match="cannot be resumed"):
        schedule.resume()


def test_backfill_a_range_starts_each_occurrence_once(env):
    schedule = weft.create_schedule("range", "test.collect", 0, cron="0 * * * *", timezone="UTC")
    start, end = T0 - timedelta(hours=5), T0 - timedelta(hours=1)
    assert schedule.backfill(start, end) == 5
    assert schedule.backfill(start, end) == 0, "a second backfill of the same range starts nothing"
    assert len(runs(schedule)) == 5


# --- schedules in code ------------------------------------------------------------------------------------

def test_weft_schedules_setting_is_synced_and_removed_ones_are_paused(env):
    with override_settings(WEFT_SCHEDULES={
        "nightly": {"workflow": "test.collect", "input": 0, "cron": "0 3 * * *", "timezone": "Europe/Berlin"},
        "hourly": {"workflow": "test.collect", "input": 0, "every": timedelta(hours=1)},
    }):
        out = StringIO()
        call_command("weft_schedules", "sync", stdout=out)
        assert "created 2" in out.getvalue()
    nightly = weft.get_schedule("nightly")
    assert nightly.from_settings and nightly.timezone == "Europe/Berlin"
    with override_settings(WEFT_SCHEDULES={
        "nightly": {"workflow": "test.collect", "input": 0, "cron": "0 4 * * *", "timezone": "Europe/Berlin"},
    }):
        call_command("weft_schedules", "sync", stdout=StringIO())
    nightly.refresh_from_db()
    assert nightly.cron == "0 4 * * *" and nightly.status == "active"
    hourly = weft.get_schedule("hourly")
    assert hourly.status == "paused" and hourly.note == "removed from WEFT_SCHEDULES"


def test_weft_schedules_command(env):
    weft.create_schedule("cmd", "test.collect", 0, cron="0 * * * *", timezone="UTC")
    out = StringIO()
    call_command("weft_schedules", "list", stdout=out)
    call_command("weft_schedules", "pause", "cmd", "--note", "checking", stdout=out)
    call_command("weft_schedules", "resume", "cmd", stdout=out)
    call_command("weft_schedules", "trigger", "cmd", stdout=out)
    text = out.getvalue()
    assert "cmd" in text and "paused cmd" in text and "resumed cmd" in text and "started run" in text
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no schedule with id 'nope'"):
        call_command("weft_schedules", "pause", "nope")


@override_settings(WEFT_SCHEDULE_HISTORY=timedelta(days=7))
def test_the_occurrence_trace_is_bounded_by_retention(env):
    schedule = weft.create_schedule("hist", "test.collect", 0, cron="0 * * * *", timezone="UTC",
                                    catchup_window=timedelta(seconds=1))
    env.advance(timedelta(hours=1))
    assert ScheduleOccurrence.objects.filter(schedule=schedule).count() == 1
    weft.run_maintenance(now=env.now() + timedelta(days=6, hours=22, minutes=30))
    assert ScheduleOccurrence.objects.filter(schedule=schedule, outcome="started").count() == 1
    weft.run_maintenance(now=env.now() + timedelta(days=7, minutes=1))
    assert not ScheduleOccurrence.objects.filter(schedule=schedule, outcome="started").exists()


def test_a_long_outage_counts_every_missed_occurrence(env):
    schedule = weft.create_schedule("outage", "test.collect", 0, every=timedelta(seconds=1))
    weft.run_maintenance(now=T0 + timedelta(seconds=1000, milliseconds=500))
    schedule.refresh_from_db()
    # The 1000th occurrence fell due half a second ago, within the grace: it starts; the rest are missed.
    assert [run.scheduled_for for run in runs(schedule)] == [T0 + timedelta(seconds=1000)]
    assert schedule.missed_fire_count == 999
    assert schedule.next_fire_at == T0 + timedelta(seconds=1001)
    outcomes = sorted(ScheduleOccurrence.objects.filter(schedule=schedule).values_list("outcome", "count"))
    assert outcomes == [("missed", 999), ("started", 1)]


def test_a_late_tick_still_starts_the_latest_occurrence_if_it_is_on_time(env):
    # Ticked once, exactly on the 60th occurrence: the 59 before it are missed, the 60th is on time.
    schedule = weft.create_schedule("late-tick", "test.collect", 0, every=timedelta(minutes=1))
    weft.run_maintenance(now=T0 + timedelta(minutes=60))
    schedule.refresh_from_db()
    assert [run.scheduled_for for run in Workflow.objects.filter(schedule=schedule)] == [T0 + timedelta(minutes=60)]
    assert schedule.missed_fire_count == 59
    assert schedule.next_fire_at == T0 + timedelta(minutes=61)
    outcomes = sorted(ScheduleOccurrence.objects.filter(schedule=schedule).values_list("outcome", "count"))
    assert outcomes == [("missed", 59), ("started", 1)]


def test_a_cron_that_never_fires_is_refused():
    with pytest.raises(weft.InvalidArgument, match="never fires"):
        weft.create_schedule("feb30", "test.collect", 0, cron="0 0 30 2 *", timezone="UTC")
    assert not Schedule.objects.exists()
