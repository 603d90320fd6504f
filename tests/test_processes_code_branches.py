"""Branches of workflow code and real processes (design 9.2): a run with 20 branches of 3 steps each, its executor
SIGKILLed mid-way, is taken over and finishes with every step journaled once and no finished step executed again."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import RunStatus, WorkflowStep
from tests.procs import SHORT_LEASE, outputs, wait_until
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = [f"b{branch}:{step}" for branch in range(20) for step in range(3)]


def test_twenty_branches_of_three_steps_survive_a_sigkill(row_locks, maintenance):
    handle = weft.start("branches.twenty", workflow_id="twenty")
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: Execution.objects.filter(key__in=KEYS).count() >= 15, "some steps to run", 60, [first])
    first.popen.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    before = Counter(Execution.objects.filter(key__in=KEYS).values_list("key", flat=True))
    journaled_before = {decode(data) for data in WorkflowStep.objects.filter(
        run_id=handle.run_id, name="branches.work", status="completed").values_list("result", flat=True)}
    assert 0 < len(before) < len(KEYS), before
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: handle.refresh().status == RunStatus.COMPLETED, "the run to be taken over and finish", 120,
               [second])
    assert handle.result() == 60
    rows = WorkflowStep.objects.filter(run_id=handle.run_id, name="branches.work", status="completed")
    assert rows.count() == 60, outputs([first, second])
    executed = Counter(Execution.objects.filter(key__in=KEYS).values_list("key", flat=True))
    assert set(executed) == set(KEYS)
    # A step journaled before the kill never ran again; only steps in flight at the kill ran twice.
    again = {key for key, n in executed.items() if n > 1}
    assert all(n <= 2 for n in executed.values()), executed
    assert len(again) <= 8, again  # at most WEFT_MAX_PARALLEL_ACTIVITIES attempts were in flight
    assert all(executed[key] == 1 for key in journaled_before), (journaled_before, executed)
