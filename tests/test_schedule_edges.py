"""Schedules at their edges: a restart of weft_maintenance (the WEFT_SCHEDULES sync), an edit while an
occurrence is due, a trigger at the instant of an occurrence, an occurrence at the end of weft_env.advance().

Whatever happens, an occurrence that fell due is decided once, by the schedule's own policy, and leaves a
ScheduleOccurrence row (design §9.1, "Settings schedules survive restarts").
"""

from __future__ import annotations

import datetime as dt
import threading
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.signals import pre_save
from django.test import override_settings

import django_weft as weft
from django_weft import signals
from django_weft.models import Schedule, ScheduleOccurrence, Workflow
from django_weft.services.schedules import sync_schedules
from django_weft.testing import WeftTestEnv

pytestmark = pytest.mark.django_db

EVENING = dt.datetime(2026, 6, 1, 19, 14, 40, tzinfo=UTC)
MINUTE = dt.datetime(2026, 6, 1, 19, 15, tzinfo=UTC)  # the occurrence that falls due while nothing runs
RESTART = dt.datetime(2026, 6, 1, 19, 15, 18, tzinfo=UTC)


def runs(schedule_id):
    return list(Workflow.objects.filter(schedule__schedule_id=schedule_id).order_by("scheduled_for"))


def ledger(schedule_id):
    """(scheduled_for, outcome, count) of every decision, in order."""
    return list(ScheduleOccurrence.objects.filter(schedule__schedule_id=schedule_id).order_by("scheduled_for", "id")
                .values_list("scheduled_for", "outcome", "count"))


def sync(definitions, now):
    """What weft_maintenance does at start, at ``now``: sync WEFT_SCHEDULES; returns what it printed."""
    out = StringIO()
    with WeftTestEnv(start=now), override_settings(WEFT_SCHEDULES=definitions):
        call_command("weft_schedules", "sync", stdout=out)
    return out.getvalue()


def first_pass(now):
    """The restarted loop's first pass (its tick and its runs), at ``now``."""
    with WeftTestEnv(start=now) as env:
        env.drive()


@pytest.fixture
def missed_signals():
    sent = []
    signals.schedule_missed_fire.connect(lambda **kw: sent.append(kw), weak=False, dispatch_uid="edges")
    yield sent
    signals.schedule_missed_fire.disconnect(dispatch_uid="edges")


def every_minute(**options):
    return {"workflow": "test.collect", "input": 0, "cron": "*/1 * * * *", "timezone": "UTC", **options}


# --- a restart (the WEFT_SCHEDULES sync at every start) --------------------------------------------------


def test_a_restart_leaves_an_unchanged_settings_schedule_alone_and_its_missed_occurrence_runs():
    """The issue's case: stopped at 19:14:40, restarted at 19:15:18, with backfill: the 19:15 occurrence
    runs (the sync used to move next_fire_at to 19:16, leaving no run and no trace)."""
    definitions = {"minutely": every_minute(backfill=True)}
    assert "created 1" in sync(definitions, EVENING)
    printed = sync(definitions, RESTART)
    assert "updated 0" in printed and "unchanged 1" in printed
    schedule = weft.get_schedule("minutely")
    assert schedule.next_fire_at == MINUTE, "the unchanged schedule keeps its next occurrence"
    first_pass(RESTART)
    assert [run.scheduled_for for run in runs("minutely")] == [MINUTE]
    assert ledger("minutely") == [(MINUTE, "started", 1)]


def test_a_restart_without_backfill_starts_the_occurrence_it_missed_as_for_a_schedule_made_in_code(
        django_capture_on_commit_callbacks, missed_signals):
    definitions = {"minutely": every_minute()}
    sync(definitions, EVENING)
    with WeftTestEnv(start=EVENING):
        weft.create_schedule("in-code", "test.collect", 0, cron="*/1 * * * *", timezone="UTC")
    sync(definitions, RESTART)
    with django_capture_on_commit_callbacks(execute=True):
        first_pass(RESTART)
    for schedule_id in ("minutely", "in-code"):
        schedule = weft.get_schedule(schedule_id)
        assert [run.scheduled_for for run in runs(schedule_id)] == [MINUTE]
        assert ledger(schedule_id) == [(MINUTE, "started", 1)]
        assert (schedule.missed_fire_count, schedule.next_fire_at) == (0, MINUTE + timedelta(minutes=1))
    assert missed_signals == []


@override_settings(WEFT_SCHEDULE_LATE_START=timedelta(seconds=10))
def test_a_restart_later_than_the_late_start_window_counts_the_occurrence_as_missed(
        django_capture_on_commit_callbacks, missed_signals):
    definitions = {"minutely": every_minute(), "patient": every_minute(catchup_window=timedelta(minutes=1))}
    sync(definitions, EVENING)
    sync(definitions, RESTART)
    with django_capture_on_commit_callbacks(execute=True):
        first_pass(RESTART)
    assert runs("minutely") == [] and ledger("minutely") == [(MINUTE, "missed", 1)]
    assert weft.get_schedule("minutely").last_missed_fire_at == MINUTE
    assert [(kw["schedule"].schedule_id, kw["count"]) for kw in missed_signals] == [("minutely", 1)]
    # A schedule's own catchup_window says instead of the setting.
    assert ledger("patient") == [(MINUTE, "started", 1)]


def test_a_deploy_that_restarts_the_only_process_at_3_does_not_skip_the_nightly_job():
    definitions = {"nightly": {"workflow": "test.collect", "input": 0, "cron": "0 3 * * *",
                               "timezone": "Europe/Berlin", "backfill": True, "catchup_window": timedelta(hours=2)}}
    three = dt.datetime(2026, 6, 2, 1, 0, tzinfo=UTC)  # 03:00 in Berlin (CEST)
    sync(definitions, three - timedelta(seconds=20))
    sync(definitions, three + timedelta(seconds=40))
    first_pass(three + timedelta(seconds=40))
    assert [run.scheduled_for for run in runs("nightly")] == [three]
    assert weft.get_schedule("nightly").next_fire_at == three + timedelta(days=1)


def test_a_restart_keeps_the_occurrence_of_an_interval_schedule():
    definitions = {"sync-crm": {"workflow": "test.collect", "input": 0, "every": timedelta(minutes=10),
                                "backfill": True}}
    sync(definitions, EVENING)
    created = weft.get_schedule("sync-crm")
    due = EVENING + timedelta(minutes=10)
    assert created.next_fire_at == due
    sync(definitions, due + timedelta(seconds=30))
    schedule = weft.get_schedule("sync-crm")
    assert (schedule.anchor, schedule.next_fire_at) == (created.anchor, due)
    first_pass(due + timedelta(seconds=30))
    assert [run.scheduled_for for run in runs("sync-crm")] == [due]


def test_the_sync_reports_only_real_changes():
    definitions = {"a": every_minute(), "b": every_minute(input=1)}
    assert "created 2, updated 0, unchanged 0, paused 0" in sync(definitions, EVENING)
    assert "created 0, updated 0, unchanged 2, paused 0" in sync(definitions, EVENING + timedelta(seconds=5))
    changed = {"a": every_minute(), "b": every_minute(input=2)}
    assert "created 0, updated 1, unchanged 1, paused 0" in sync(changed, EVENING + timedelta(seconds=10))
    assert weft.get_schedule("b").decoded_input == 2
    assert "created 0, updated 0, unchanged 1, paused 1" in sync({"a": every_minute()}, EVENING + timedelta(seconds=15))
    assert "created 0, updated 1, unchanged 1, paused 0" in sync(changed, EVENING + timedelta(seconds=20))
    assert weft.get_schedule("b").status == "active", "defined again: resumed"


def test_a_changed_settings_schedule_still_decides_what_fell_due_before_the_change():
    """A deploy that changes the input: the occurrence that fell due while the process was down runs (with
    the input the deployed code expects), then the schedule goes on."""
    sync({"minutely": every_minute(backfill=True)}, EVENING)
    printed = sync({"minutely": every_minute(backfill=True, input=2)}, RESTART)
    assert "updated 1" in printed
    [run] = runs("minutely")
    assert (run.scheduled_for, run.decoded_input) == (MINUTE, 2)
    assert ledger("minutely") == [(MINUTE, "started", 1)]
    assert weft.get_schedule("minutely").next_fire_at == MINUTE + timedelta(minutes=1)


def test_a_new_cadence_applies_from_now_after_the_old_one_decided_what_fell_due(missed_signals,
                                                                                 django_capture_on_commit_callbacks):
    # catchup_window of 1 s: the occurrence the old cadence left due is late, so it is missed, not started.
    sync({"report": every_minute(cron="15 19 * * *", catchup_window=timedelta(seconds=1))}, EVENING)
    with django_capture_on_commit_callbacks(execute=True):
        sync({"report": every_minute(cron="45 19 * * *", catchup_window=timedelta(seconds=1))}, RESTART)
    schedule = weft.get_schedule("report")
    assert ledger("report") == [(MINUTE, "missed", 1)], "late, no backfill: counted as missed, not dropped"
    assert schedule.missed_fire_count == 1 and [kw["count"] for kw in missed_signals] == [1]
    assert schedule.next_fire_at == MINUTE + timedelta(minutes=30)


def test_two_processes_starting_at_once_create_a_new_settings_schedule_once(transactional_db, row_locks):
    """Both see no row; the second one's insert fails on the unique id: it compares with the row the
    first one created instead of stopping weft_maintenance with an error."""
    definitions = {"fresh": every_minute()}
    reports = {}

    def second_process() -> None:
        try:
            reports["second"] = sync_schedules(definitions)
        finally:
            connection.close()

    def meanwhile(sender, instance, **kwargs):
        if instance.schedule_id == "fresh" and "second" not in reports and threading.current_thread() is main:
            other = threading.Thread(target=second_process)
            other.start()
            other.join(60)

    main = threading.current_thread()
    pre_save.connect(meanwhile, sender=Schedule, dispatch_uid="edges-race")
    try:
        reports["first"] = sync_schedules(definitions)
    finally:
        pre_save.disconnect(dispatch_uid="edges-race")
    assert reports["second"].created == ["fresh"]
    assert reports["first"].unchanged == ["fresh"]
    assert Schedule.objects.filter(schedule_id="fresh", from_settings=True).count() == 1


def test_removing_the_last_settings_schedule_pauses_it_at_the_next_start():
    """weft_maintenance synced only when WEFT_SCHEDULES was non-empty: emptying it left the schedules it had
    defined active for good."""
    pytest.importorskip("django_celery_beat")
    sync({"minutely": every_minute()}, EVENING)
    out = StringIO()
    with WeftTestEnv(start=RESTART), override_settings(WEFT_SCHEDULES={}):
        call_command("weft_maintenance", "--install-beat", stdout=out)  # syncs, as at every start
    schedule = weft.get_schedule("minutely")
    assert (schedule.status, schedule.note) == ("paused", "removed from WEFT_SCHEDULES")
    assert "paused 1" in out.getvalue()


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


@pytest.mark.parametrize("operation", ["pause", "cancel"])
def test_pausing_or_cancelling_traces_the_occurrence_that_was_due_and_not_ticked(operation):
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("stopped", "test.collect", 0, cron="*/1 * * * *", timezone="UTC")
    with WeftTestEnv(start=MINUTE + timedelta(minutes=2, milliseconds=400)) as env:
        getattr(schedule, operation)()
        env.drive()
    assert runs("stopped") == []
    [(scheduled_for, outcome, count)] = ledger("stopped")
    assert (scheduled_for, outcome, count) == (MINUTE, "paused", 3)
    assert f"schedule {operation}" in ScheduleOccurrence.objects.get(schedule=schedule).detail


def test_a_tick_error_is_recorded_at_the_occurrence_that_failed():
    with WeftTestEnv(start=EVENING):
        schedule = weft.create_schedule("broken", "test.collect", 0, cron="*/1 * * * *", timezone="UTC",
                                        backfill=True)
        Schedule.objects.filter(pk=schedule.pk).update(workflow_type="retired.workflow")
        weft.run_maintenance(now=MINUTE + timedelta(seconds=30))
    assert ledger("broken") == [(MINUTE, "error", 1)]


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
        schedule = weft.create_schedule("late", "test.collect", 0, cron="*/1 * * * *", timezone="UTC",
                                        catchup_window=timedelta(seconds=1))  # nothing late starts: all are counted
    with WeftTestEnv(start=MINUTE):
        assert schedule.trigger() is not None  # at 19:15:00 exactly: it is the 19:15 occurrence's run
        weft.run_maintenance(now=MINUTE + timedelta(minutes=5, seconds=30))
    schedule.refresh_from_db()
    assert ledger("late") == [(MINUTE, "started", 1), (MINUTE, "skipped", 1),
                              (MINUTE + timedelta(minutes=1), "missed", 5)]
    assert (schedule.missed_fire_count, schedule.last_missed_fire_at) == (5, MINUTE + timedelta(minutes=5))


# --- an occurrence at the end of weft_env.advance() -----------------------------------------------------


def test_a_run_started_at_the_very_end_of_advance_is_driven_as_far_as_it_can_go(weft_env):
    """A guard (it passes on the code before this change too: the issue's report did not reproduce here):
    the occurrence falls due at exactly now + delta; its run, its child and the parent's resumption all
    happen at that instant, so advance() leaves nothing runnable behind."""
    schedule = weft.create_schedule("at-the-end", "test.parent", {"key": "end"}, every=timedelta(minutes=1))
    weft_env.advance(schedule.due_at - weft_env.now())
    [run] = runs("at-the-end")
    assert run.status == "completed" and weft_env.now() == run.scheduled_for
    report = weft_env.drive()
    assert not (report.claimed or report.schedules_fired)
