"""A real ``weft_maintenance`` with WEFT_SCHEDULES, stopped, an occurrence falling due while none runs, then
restarted: the occurrence is caught up by each schedule's own policy (design §9.1).

The settings reach the subprocess as a settings module written to the test's directory (``tests.settings``
plus WEFT_SCHEDULES). Every wait has a deadline; the processes are killed when the test ends.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_weft.models import Schedule, ScheduleOccurrence, Workflow
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKFLOW = "test.scheduled_pid"  # tests/testapp/schedule_workflows.py
EVERY_4S = "*/4 * * * * *"
SCHEDULES = {
    "caught-up": {"workflow": WORKFLOW, "cron": EVERY_4S, "timezone": "UTC", "backfill": True},
    # catchup_window of 1 s: nothing later than the grace starts, so what fell due is counted as missed.
    "counted": {"workflow": WORKFLOW, "cron": EVERY_4S, "timezone": "UTC", "catchup_window": 1},
    # Neither: the latest due occurrence starts (within WEFT_SCHEDULE_LATE_START), the ones before are missed.
    "latest": {"workflow": WORKFLOW, "cron": EVERY_4S, "timezone": "UTC"},
}


def settings_with_schedules(directory: Path) -> dict[str, str]:
    """The environment that makes a subprocess load tests.settings with SCHEDULES as WEFT_SCHEDULES."""
    (directory / "restart_settings.py").write_text(
        f"from tests.settings import *  # noqa: F403\nWEFT_SCHEDULES = {SCHEDULES!r}\n")
    return {"DJANGO_SETTINGS_MODULE": "restart_settings", "PYTHONPATH": str(directory)}


def start(maintenance, name: str, env: dict[str, str]):
    proc = maintenance(name, "--interval", "0.2", **env)
    wait_until(lambda: "running with" in proc.stdout(), f"{name} to start", 60, [proc])
    return proc


def stop(proc) -> None:
    proc.send(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output()


def test_a_restart_catches_up_the_occurrence_that_fell_due_while_no_process_ran(row_locks, maintenance, tmp_path):
    env = settings_with_schedules(tmp_path)
    first = start(maintenance, "first", env)
    assert "WEFT_SCHEDULES synced (created 3, updated 0, unchanged 0, paused 0)" in first.stdout()
    stop(first)

    # The next undecided occurrence of each schedule (the same instant for both) falls due with none running.
    due = {s.schedule_id: s.next_fire_at for s in Schedule.objects.all()}
    assert due["caught-up"] == due["counted"] == due["latest"]
    moment = due["caught-up"]
    while timezone.now() < moment + timedelta(seconds=2):  # past the 1 s grace: the restart is late
        time.sleep(0.1)

    second = start(maintenance, "second", env)
    assert "WEFT_SCHEDULES synced (created 0, updated 0, unchanged 3, paused 0)" in second.stdout()
    caught_up = Workflow.objects.filter(schedule__schedule_id="caught-up", scheduled_for=moment)
    wait_until(lambda: caught_up.filter(status="completed").exists(),
               f"the run of the {moment.isoformat()} occurrence of 'caught-up'", 60, [second])
    counted = ScheduleOccurrence.objects.filter(schedule__schedule_id="counted", scheduled_for=moment)
    wait_until(counted.exists, f"the decision about the {moment.isoformat()} occurrence of 'counted'", 60, [second])
    latest = Workflow.objects.filter(schedule__schedule_id="latest", scheduled_for__gte=moment)
    wait_until(lambda: latest.filter(status="completed").exists(),
               "a run of the latest occurrence of 'latest' after the restart", 60, [second])
    stop(second)

    assert ScheduleOccurrence.objects.filter(schedule__schedule_id="caught-up", scheduled_for=moment,
                                             outcome="started").count() == 1
    [missed] = counted
    assert missed.outcome == "missed" and missed.count >= 1
    assert Schedule.objects.get(schedule_id="counted").missed_fire_count >= missed.count
    assert not Workflow.objects.filter(schedule__schedule_id="counted", scheduled_for=moment).exists()
