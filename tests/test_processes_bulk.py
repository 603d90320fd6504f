"""A bulk cancel under real concurrency (PostgreSQL): single cancels in threads and a weft_maintenance process
executing the same runs race it, and each run is changed once.

Like the other process tests, it commits its data (``transaction=True``) so that the subprocess and the threads,
each on its own connection, see it; every wait has a deadline; the subprocess is killed when the test ends.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter

import pytest
from django.db import connection

import django_weft as weft
from django_weft.common import clock
from django_weft.models import BulkOperation, RunStatus, Workflow, WorkflowStep
from django_weft.services import bulk
from django_weft.store import transitions
from tests.procs import outputs, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

BUSY = 12  # executing steps the whole time
WAITING = 12  # parked in a sleep of an hour
DELAYED = 12  # pending: their start is an hour away
RACERS = 6
DEADLINE = 60.0
FREEZE = 2.0  # seconds the executor keeps going after the cancels, to show it records nothing for them


def journal_lengths(run_ids) -> dict:
    counts = Counter(WorkflowStep.objects.filter(run_id__in=run_ids).values_list("run_id", flat=True))
    return {run_id: counts.get(run_id, 0) for run_id in run_ids}


def test_a_bulk_cancel_racing_single_cancels_and_an_executor_changes_each_run_once(row_locks, maintenance,
                                                                                   monkeypatch):
    monkeypatch.setattr(bulk, "BATCH_SIZE", 5)  # many batches, so the racers meet it midway
    # Beats every second: a busy run learns of its cancel at the next renewal of its lease.
    proc = maintenance("executor", "--workers", "4", "--interval", "0.2", WEFT_HEARTBEAT_SECONDS="1")
    waiting = [weft.start("test.steps", {"count": 2, "sleep": 3600, "key": f"wait{i}"}, tags=["race"])
               for i in range(WAITING)]
    wait_until(lambda: Workflow.objects.filter(pk__in=[h.run_id for h in waiting], status=RunStatus.WAITING)
               .count() == WAITING, "the sleepers to park", DEADLINE, [proc])
    delayed = [weft.start("test.steps", {"count": 1, "key": f"later{i}"}, tags=["race"], start_after=3600)
               for i in range(DELAYED)]
    busy = [weft.start("test.steps", {"count": 1_000_000, "key": f"busy{i}"}, tags=["race"]) for i in range(BUSY)]
    runs = [*busy, *waiting, *delayed]
    ids = [h.run_id for h in runs]
    wait_until(lambda: sum(1 for n in journal_lengths([h.run_id for h in busy]).values() if n >= 3) >= 3,
               "the executor to be inside busy runs", DEADLINE, [proc])

    preview = weft.bulk.cancel("bulk", dry_run=True, tags=["race"])
    assert preview.matched == len(runs)
    confirmed = threading.Event()
    failures: list[str] = []
    result: list[bulk.BulkResult] = []
    single_wins: Counter = Counter()
    lock = threading.Lock()

    def bulk_cancel() -> None:
        try:
            outcome = weft.bulk.cancel("bulk", confirmation_token=preview.confirmation_token, tags=["race"],
                                       requested_by="race test",
                                       progress=lambda done, total: confirmed.set())
            assert isinstance(outcome, bulk.BulkResult)
            result.append(outcome)
        except BaseException:
            failures.append(traceback.format_exc())
        finally:
            confirmed.set()
            connection.close()

    def single_cancels(seed: int) -> None:
        try:
            order = list(ids)
            random.Random(seed).shuffle(order)
            assert confirmed.wait(DEADLINE), "the bulk cancel never confirmed its set"
            for run_id in order:
                if transitions.cancel(run_id, clock.now(), "single"):
                    with lock:
                        single_wins[run_id] += 1
        except BaseException:
            failures.append(traceback.format_exc())
        finally:
            connection.close()

    threads = [threading.Thread(target=bulk_cancel, name="bulk", daemon=True)]
    threads += [threading.Thread(target=single_cancels, args=(seed,), name=f"single{seed}", daemon=True)
                for seed in range(RACERS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + DEADLINE
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not [t.name for t in threads if t.is_alive()], f"threads still running\n{outputs([proc])}"
    assert not failures, failures[0] + outputs([proc])

    # Each run's cancel was requested once: by the bulk operation or by one single cancel, never both; the
    # executor then ends each one cancelled (its code sees the cancel where it is).
    (outcome,) = result
    wait_until(lambda: not Workflow.objects.open().filter(pk__in=ids).exists(), "every run to end cancelled",
               DEADLINE, [proc], describe=lambda: str(list(Workflow.objects.open().filter(pk__in=ids).values_list(
                   "workflow_id", "status", "lease_owner", "cancel_requested_at", "runnable_at"))))
    rows = {run.pk: run for run in Workflow.objects.filter(pk__in=ids)}
    assert {run.status for run in rows.values()} == {RunStatus.CANCELLED}
    assert all(n == 1 for n in single_wins.values()), single_wins
    by_bulk = {pk for pk, run in rows.items() if run.error["message"] == "bulk"}
    assert {pk for pk, run in rows.items() if run.error["message"] == "single"} == set(single_wins)
    assert by_bulk.isdisjoint(single_wins) and len(by_bulk) + len(single_wins) == len(runs)
    assert (outcome.count, outcome.matched, outcome.skipped) == (len(by_bulk), len(runs), len(single_wins))
    audit = BulkOperation.objects.get()
    assert (audit.status, audit.count, audit.matched, audit.requested_by) == ("completed", len(by_bulk), len(runs),
                                                                              "race test")
    assert all(run.termination_reason == transitions.CANCEL_REQUESTED and run.runnable_at is None
               for run in rows.values())

    # Nothing is recorded for them after they ended, while the executor goes on with a control run (started now,
    # so that it is far from WEFT_MAX_HISTORY however long the cancels took to reach the busy runs).
    control = weft.start("test.steps", {"count": 1_000_000, "key": "control"}, tags=["control"])
    wait_until(lambda: journal_lengths([control.run_id])[control.run_id] > 0, "the control run to begin", DEADLINE,
               [proc])
    frozen = journal_lengths(ids)
    control_before = journal_lengths([control.run_id])[control.run_id]
    time.sleep(FREEZE)
    assert proc.alive, proc.output()
    assert journal_lengths([control.run_id])[control.run_id] > control_before, proc.output()
    assert journal_lengths(ids) == frozen
    assert Workflow.objects.filter(pk__in=ids).exclude(status=RunStatus.CANCELLED).count() == 0
    assert Workflow.objects.get(pk=control.run_id).status == RunStatus.RUNNING
