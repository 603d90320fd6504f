"""Cleanup code and real processes (design 9.1): a ``finally:`` block makes no durable call for real while a
stopping ``weft_maintenance`` hands the run back or a killed one loses it; it runs once, in the process that
ends the workflow."""

from __future__ import annotations

import signal

import pytest

import django_weft as weft
from django_weft.models import RunStatus
from tests.procs import SHORT_LEASE, assert_ran_in, journal, outputs, run_once, wait_until
from tests.testapp.workflows import executions

pytestmark = pytest.mark.django_db(transaction=True)

RELEASE = "tests.testapp.cleanup_workflows.release_stock"


def test_a_worker_that_stops_hands_the_run_back_without_running_its_cleanup(row_locks, maintenance, tmp_path):
    release = tmp_path / "release"
    handle = weft.start("cleanup.worker_stop", {"key": "stop", "path": str(release), "max_wait": 60})
    first = maintenance("first", "--interval", "0.2")
    wait_until(lambda: executions("stop:start") == 1, "wait_for_file to start", 30, [first])

    first.send(signal.SIGTERM)
    wait_until(lambda: "finishing current steps" in first.stderr(), "the process to acknowledge SIGTERM", 30, [first])
    release.touch()
    assert first.wait(30) == 0, first.output()
    # The step in flight was recorded, the run handed back at the next one: the finally block ran while the
    # code unwound, and its activity neither executed nor was recorded.
    assert executions("stop:release") == 0, first.output()
    assert [name for _, _, name, _ in journal(handle.run_id)] == ["tests.testapp.workflows.wait_for_file"]
    assert handle.refresh().status == RunStatus.RUNNING

    second = run_once("second", tmp_path)
    assert handle.refresh().status == RunStatus.COMPLETED, outputs([first, second])
    assert executions("stop:release") == 1
    assert_ran_in("stop:release", second)
    names = [name for _, _, name, _ in journal(handle.run_id)]
    assert names.count(RELEASE) == 1, names


def test_a_killed_worker_runs_no_cleanup_and_the_next_one_runs_it_once(row_locks, maintenance, tmp_path):
    release = tmp_path / "release"
    handle = weft.start("cleanup.worker_stop", {"key": "kill", "path": str(release), "max_wait": 60})
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: executions("kill:start") == 1, "wait_for_file to start", 30, [first])
    first.popen.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert executions("kill:release") == 0

    release.touch()
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().status == RunStatus.COMPLETED, "the run to be taken over and finish", 60,
               [second])
    assert executions("kill:release") == 1
    assert_ran_in("kill:release", second)
