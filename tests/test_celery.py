"""WEFT_EXECUTOR = "celery" in one process: which ``django_weft`` tasks are sent, when, and what they do.

Celery runs eagerly here (``task_always_eager``: a task runs in the sending thread at ``apply_async``), or
sends are recorded instead of made. The same paths against a real broker, worker and beat are in
tests/test_celery_broker.py. Data is committed (``transaction=True``): tasks are sent after commit.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from celery import current_app
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

import django_weft as weft
from django_weft import tasks
from django_weft.models import RunStatus, Schedule, Workflow
from django_weft.services.maintenance import maintenance_pass
from django_weft.testing import WeftTestEnv
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "weft-test-queue"


@pytest.fixture
def celery_executes():
    with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_QUEUE=QUEUE):
        yield


@pytest.fixture
def eager(celery_executes):
    """Tasks run in this thread when sent."""
    previous = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True
    try:
        yield
    finally:
        current_app.conf.task_always_eager = previous


# How a task is sent (within WEFT_CELERY_SEND_TIMEOUT: tests/test_celery_sends.py), not what is sent.
HOW_SENT = ("producer", "retry", "confirm_timeout")


class Sent:
    """Records ``apply_async`` calls of django_weft's tasks (the message's options) instead of sending them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail: bool = False) -> None:
        self.calls: list[tuple[str, list, dict]] = []
        self.attempts = 0
        self.fail = fail
        for task in (tasks.drive, tasks.tick):
            monkeypatch.setattr(task, "apply_async", self._recorder(task.name))

    def _recorder(self, name: str) -> Any:
        def apply_async(args: Any = None, kwargs: Any = None, **options: Any) -> None:
            self.attempts += 1
            if self.fail:
                raise ConnectionError("broker unreachable")
            self.calls.append((name, list(args or []), {k: v for k, v in options.items() if k not in HOW_SENT}))
        return apply_async

    def drives(self) -> list[tuple[str | None, Any]]:
        return [(args[0], options.get("eta")) for name, args, options in self.calls if name == "django_weft.drive"]


@pytest.fixture
def sent(celery_executes, monkeypatch):
    return Sent(monkeypatch)


def test_a_start_is_executed_by_the_drive_task_sent_after_commit(eager):
    handle = weft.start("test.steps", {"key": "celery", "count": 3})
    run = handle.refresh()
    assert run.status == RunStatus.COMPLETED, (run.status, run.error)
    assert handle.result(timeout=0) == ["CELERY:0", "CELERY:1", "CELERY:2"]
    assert [executions(f"celery:{i}") for i in range(3)] == [1, 1, 1]


def test_drive_is_sent_once_per_committed_start_to_the_configured_queue_and_never_for_a_rollback(sent):
    with pytest.raises(RuntimeError), transaction.atomic():
        weft.start("test.steps", {"key": "rolled-back", "count": 1})
        raise RuntimeError("the view failed after starting")
    assert sent.calls == []
    assert not Workflow.objects.exists()

    handle = weft.start("test.steps", {"key": "committed", "count": 1})
    assert sent.calls == [("django_weft.drive", [str(handle.run_id)], {"ignore_result": True, "queue": QUEUE})]
    assert handle.status == RunStatus.PENDING  # recorded, not executed


def test_a_signal_wakes_the_waiting_run_through_a_drive_task(eager):
    handle = weft.start("test.approval", "signalled")
    assert handle.refresh().status == RunStatus.WAITING
    assert executions("signalled:after") == 0

    weft.signal(handle.workflow_id, "approval", "yes")

    assert handle.refresh().status == RunStatus.COMPLETED
    assert handle.result(timeout=0) == "yes"
    assert (executions("signalled:before"), executions("signalled:after")) == (1, 1)


def test_a_short_sleep_is_sent_with_its_eta_and_an_early_delivery_changes_nothing(sent):
    handle = weft.start("test.steps", {"key": "nap", "count": 2, "sleep": 5})
    [(run_id, eta)] = sent.drives()
    assert (run_id, eta) == (str(handle.run_id), None)

    assert tasks.drive(run_id) == {"waiting": 1}
    run = handle.refresh()
    assert run.status == RunStatus.WAITING
    [(again, wake_eta)] = sent.drives()[1:]
    assert again == str(handle.run_id)
    assert wake_eta == run.runnable_at  # the durable timer's instant

    # The ETA message delivered early (a clock skew, a worker that ignores ETAs) finds nothing to do.
    assert tasks.drive(run_id) == {"not_runnable": 1}
    assert handle.refresh().status == RunStatus.WAITING
    assert executions("nap:1") == 0


def test_duplicate_deliveries_for_a_finished_run_are_harmless(eager):
    handle = weft.start("test.steps", {"key": "dup", "count": 1})
    assert handle.status == RunStatus.COMPLETED
    assert tasks.drive(str(handle.run_id)) == {"not_runnable": 1}
    assert tasks.drive(None) == {"not_runnable": 1}
    assert executions("dup:0") == 1


def test_a_lost_delivery_is_logged_and_the_maintenance_pass_delivers_the_run(celery_executes, monkeypatch,
                                                                             caplog):
    failing = Sent(monkeypatch, fail=True)
    with caplog.at_level(logging.ERROR, logger="django_weft.wakeups"):
        handle = weft.start("test.steps", {"key": "lost", "count": 2})
    assert failing.calls == []
    assert handle.status == RunStatus.PENDING  # the start committed although the broker did not answer
    assert f"could not send django_weft.drive for run {handle.run_id}" in caplog.text

    monkeypatch.undo()
    with override_settings(WEFT_EXECUTOR="celery"):
        current_app.conf.task_always_eager = True
        try:
            with WeftTestEnv(handle.refresh().created_at + timedelta(seconds=10), send_celery_tasks=True):
                report = tasks.maintenance(every=5)
        finally:
            current_app.conf.task_always_eager = False
    assert report["dispatched"] == 1
    assert handle.refresh().status == RunStatus.COMPLETED
    assert [executions("lost:0"), executions("lost:1")] == [1, 1]


def test_after_a_failed_send_a_pass_sends_nothing_more_until_the_pause_ends(celery_executes, monkeypatch, caplog):
    with override_settings(WEFT_CLAIM_BATCH_SIZE=1, WEFT_CELERY_SEND_TIMEOUT=0.2):
        Sent(monkeypatch)  # the starts' own sends are made, and lost
        handles = [weft.start("test.steps", {"key": f"paused{i}", "count": 1}) for i in range(3)]
        later = handles[-1].refresh().created_at + timedelta(seconds=10)
        failing = Sent(monkeypatch, fail=True)
        with caplog.at_level(logging.ERROR, logger="django_weft.wakeups"), WeftTestEnv(later, send_celery_tasks=True):
            report = tasks.maintenance(every=5)
        # One batch task per run is due; against a broker that hangs each send would wait the send timeout.
        assert (failing.attempts, report["dispatched"]) == (1, 0)
        assert caplog.text.count("could not send") == 1

        monkeypatch.undo()
        time.sleep(0.3)  # the pause (WEFT_CELERY_SEND_TIMEOUT) after the failed send ends
        current_app.conf.task_always_eager = True
        try:
            with WeftTestEnv(later, send_celery_tasks=True):
                report = tasks.maintenance(every=5)
        finally:
            current_app.conf.task_always_eager = False
    assert report["dispatched"] == 3
    assert {h.refresh().status for h in handles} == {RunStatus.COMPLETED}


def test_a_timer_beyond_the_eta_horizon_is_sent_ahead_by_the_maintenance_pass(sent):
    handle = weft.start("test.long_sleep")
    tasks.drive(str(handle.run_id))
    run = handle.refresh()
    assert run.status == RunStatus.WAITING
    assert len(sent.drives()) == 1  # the start only: a two-day timer gets no ETA message when it is set

    with WeftTestEnv(run.runnable_at - timedelta(seconds=30), send_celery_tasks=True):
        tasks.maintenance(every=5)
    assert len(sent.drives()) == 1  # not in the next 5 s yet
    with WeftTestEnv(run.runnable_at - timedelta(seconds=3), send_celery_tasks=True):
        report = tasks.maintenance(every=5)
    assert report["dispatched"] == 1
    assert sent.drives()[-1] == (str(run.pk), run.runnable_at)


def test_the_maintenance_task_sends_ticks_for_schedule_instants_of_the_next_window(sent):
    with WeftTestEnv(send_celery_tasks=True) as env:
        schedule = weft.create_schedule("every-2s", "test.steps", {"key": "tick", "count": 1}, every=2,
                                        overlap="allow_all")
        due = Schedule.objects.get(pk=schedule.pk).due_at
        ticks = [options["eta"] for name, _, options in sent.calls if name == "django_weft.tick"]
        assert ticks == [due]  # sent when the schedule was created
        report = tasks.maintenance(every=5)
    ticks = [options["eta"] for name, _, options in sent.calls if name == "django_weft.tick"]
    # Again by the pass, with the occurrences after it: the window reaches two passes (10 s) ahead.
    window_end = env.now() + timedelta(seconds=10)
    ahead = [due + timedelta(seconds=2 * k) for k in range(6) if due + timedelta(seconds=2 * k) <= window_end]
    assert ticks == [due, *ahead] and len(ahead) >= 4
    assert report["ticks_sent"] == len(ahead)
    assert env.now() < due

    # The tick task itself fires what is due at its ETA.
    with WeftTestEnv(due, send_celery_tasks=True):
        assert tasks.tick() == 1
    assert Workflow.objects.filter(schedule=schedule.pk).count() == 1


def test_install_beat_creates_then_updates_one_periodic_task(celery_executes):
    call_command("weft_maintenance", "--install-beat")
    task = PeriodicTask.objects.get(name="django_weft maintenance")
    assert (task.task, task.interval.every, task.interval.period) == ("django_weft.maintenance", 5, "seconds")
    assert json.loads(task.kwargs) == {"every": 5}
    assert task.queue == QUEUE and task.enabled

    call_command("weft_maintenance", "--install-beat", "--every", "2")
    task = PeriodicTask.objects.get(name="django_weft maintenance")
    assert (task.interval.every, json.loads(task.kwargs)) == (2, {"every": 2})
    assert PeriodicTask.objects.filter(task="django_weft.maintenance").count() == 1
    assert IntervalSchedule.objects.filter(every=2, period="seconds").count() == 1


def test_install_beat_refuses_bad_input_and_writes_nothing():
    with pytest.raises(CommandError, match="--every must be at least 1 second"):
        call_command("weft_maintenance", "--install-beat", "--every", "0")
    with override_settings(INSTALLED_APPS=[
        "django.contrib.auth", "django.contrib.contenttypes", "django_weft", "tests.testapp",
    ]), pytest.raises(CommandError, match="django_celery_beat is not in INSTALLED_APPS"):
        call_command("weft_maintenance", "--install-beat")
    assert not PeriodicTask.objects.exists()


def test_an_unknown_executor_fails_the_system_checks():
    with override_settings(WEFT_EXECUTOR="threads"), pytest.raises(SystemCheckError, match=r"weft\.E002"):
        call_command("check")


def test_no_execute_once_runs_maintenance_but_executes_nothing():
    handle = weft.start("test.steps", {"key": "not-executed", "count": 1})
    call_command("weft_maintenance", "--once", "--no-execute")
    assert handle.refresh().status == RunStatus.PENDING
    assert executions("not-executed:0") == 0


def test_a_drive_task_hands_a_long_run_on_after_its_time_budget_one_step_at_least(sent):
    handle = weft.start("test.steps", {"key": "budget", "count": 3})
    with override_settings(WEFT_CELERY_TASK_SECONDS=0):
        outcomes = [tasks.drive(str(handle.run_id)) for _ in range(3)]
    # Each task takes one new step, then the run goes back and a new task is sent for it.
    assert outcomes == [{"released": 1}, {"released": 1}, {"completed": 1}]
    assert [run_id for run_id, _ in sent.drives()] == [str(handle.run_id)] * 3
    assert [executions(f"budget:{i}") for i in range(3)] == [1, 1, 1]


def test_a_run_due_within_a_moment_is_sent_with_its_eta_and_an_early_task_waits_for_it(sent):
    handle = weft.start("test.steps", {"key": "moment", "count": 2, "sleep": 1})
    tasks.drive(str(handle.run_id))
    run = handle.refresh()
    assert run.status == RunStatus.WAITING
    assert sent.drives()[-1] == (str(run.pk), run.runnable_at)
    # Delivered before the timer is due (hosts' clocks differ a little): the task waits for it rather than
    # leaving the run to the next maintenance pass.
    assert tasks.drive(str(run.pk)) == {"completed": 1}
    assert handle.refresh().status == RunStatus.COMPLETED
    assert [executions("moment:0"), executions("moment:1")] == [1, 1]


def test_a_tick_delivered_a_moment_early_waits_for_its_instant(sent):
    schedule = weft.create_schedule("every-second", "test.steps", {"key": "early-tick", "count": 1}, every=1,
                                    overlap="allow_all")
    due = Schedule.objects.get(pk=schedule.pk).due_at
    assert tasks.tick() == 1  # sent for `due`, run before it: waits rather than leaving it to a later pass
    run = Workflow.objects.get(schedule=schedule.pk)
    assert run.scheduled_for == due
    assert Schedule.objects.get(pk=schedule.pk).missed_fire_count == 0


def test_the_test_env_drives_runs_itself_and_sends_no_celery_task(sent):
    with WeftTestEnv() as env:
        handle = weft.start("test.steps", {"key": "in-test-env", "count": 2, "sleep": 60})
        env.drive()
        assert handle.status == RunStatus.WAITING
        env.advance(60)
    assert handle.result(timeout=0) == ["IN-TEST-ENV:0", "IN-TEST-ENV:1"]
    assert sent.calls == []


def test_install_beat_reuses_an_existing_interval_even_when_it_is_duplicated():
    first = IntervalSchedule.objects.create(every=7, period="seconds")
    IntervalSchedule.objects.create(every=7, period="seconds")  # the project made one already, twice
    call_command("weft_maintenance", "--install-beat", "--every", "7")
    assert PeriodicTask.objects.get(name="django_weft maintenance").interval_id == first.pk
    assert IntervalSchedule.objects.filter(every=7).count() == 2


def test_a_queue_routed_to_a_celery_queue_has_its_runs_drive_tasks_sent_there(sent):
    queues = {"emails": {"concurrency": 1, "celery_queue": "weft-emails"}, "open": {}}
    with override_settings(WEFT_QUEUES=queues):
        first = weft.start("test.steps", {"key": "routed-1", "count": 1}, queue="emails")
        second = weft.start("test.steps", {"key": "routed-2", "count": 1}, queue="emails")
        other = weft.start("test.steps", {"key": "not-routed", "count": 1}, queue="open")
        plain = weft.start("test.steps", {"key": "plain", "count": 1})
        routed = {args[0]: options.get("queue") for name, args, options in sent.calls}
        assert routed == {str(first.run_id): "weft-emails", str(other.run_id): QUEUE, str(plain.run_id): QUEUE}
        assert second.status == RunStatus.QUEUED, "not admitted: no task"
        # A due run no task covers (a lost send) is sent by the maintenance pass where its queue goes, alone: a
        # batch task would claim runs of any queue.
        sent.calls.clear()
        Workflow.objects.filter(pk=first.run_id).update(updated_at=timezone.now() - timedelta(minutes=5),
                                                        runnable_at=timezone.now() - timedelta(minutes=5))
        maintenance_pass(timezone.now(), window=5)
        drives = [(args[0], options.get("queue")) for name, args, options in sent.calls if name == "django_weft.drive"]
        assert (str(first.run_id), "weft-emails") in drives and (None, QUEUE) not in drives


def test_a_bad_celery_queue_in_weft_queues_fails_the_system_check():
    from django.core.checks import run_checks

    with override_settings(WEFT_QUEUES={"emails": {"celery_queue": ""}}):
        assert [e.id for e in run_checks() if e.id == "weft.E008"] == ["weft.E008"]
    with override_settings(WEFT_QUEUES={"emails": {"celery_queue": "weft-emails", "concurrency": 3}}):
        assert [e.id for e in run_checks() if e.id == "weft.E008"] == []
