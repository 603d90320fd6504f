"""Cancels delivered to workflow code with real processes (design 9.2): runs are cancelled in every state (in an
activity, in its retry, sleeping, waiting for a signal, not started yet) while three ``weft_maintenance`` processes
execute them and are SIGKILLed and replaced. Every run ends cancelled, its saga's compensations are journaled
once each and executed before the run ended; a cleanup past its cleanup_timeout ends terminated."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import pytest

import django_weft as weft
from django_weft.common.codec import decode
from django_weft.models import RunStatus, Workflow, WorkflowStep
from tests.procs import SHORT_LEASE, outputs, wait_until
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

ORDERS = 30
DEADLINE = 180.0


def test_cancels_in_every_state_while_executors_are_killed(row_locks, maintenance):
    rng = random.Random(31)
    names = iter(f"executor-{i}" for i in range(100))
    procs = [maintenance(next(names), "--workers", "3", "--interval", "0.2", **SHORT_LEASE) for _ in range(3)]
    orders = [weft.start("cancel.order", {"key": f"o{i}", "step": rng.choice([0.1, 0.5, 1.5])},
                         workflow_id=f"order-{i}") for i in range(ORDERS)]
    slow = [weft.start("cancel.slow_cleanup", f"s{i}", workflow_id=f"slow-{i}") for i in range(2)]
    late = weft.start("cancel.order", {"key": "late"}, workflow_id="late", start_after=3600)
    kills = 0

    def kill_one() -> None:
        nonlocal kills
        victim = procs.pop(rng.randrange(len(procs)))
        victim.popen.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        kills += 1
        procs.append(maintenance(next(names), "--workers", "3", "--interval", "0.2", **SHORT_LEASE))

    # Cancel each order at a random moment of its life, killing an executor now and then.
    for i, handle in enumerate(rng.sample(orders, len(orders))):
        time.sleep(rng.uniform(0, 0.4))
        assert handle.cancel(f"cancel {i}") is True
        if i % 6 == 5:
            kill_one()
    wait_until(lambda: Workflow.objects.filter(pk__in=[h.run_id for h in slow], status=RunStatus.WAITING).count()
               == len(slow), "the slow-cleanup runs to park", DEADLINE, procs)
    for handle in slow:
        handle.cancel("cleanup too slow")
    assert late.cancel("before it started") is True
    kill_one()
    everything = [h.run_id for h in [*orders, *slow, late]]
    wait_until(lambda: not Workflow.objects.open().filter(pk__in=everything).exists(),
               "every cancelled run to end", DEADLINE, procs,
               describe=lambda: str(list(Workflow.objects.open().filter(pk__in=everything)
                                         .values_list("workflow_id", "status", "wait_reason"))))
    assert kills >= 5

    where = Counter(WorkflowStep.objects.filter(run_id__in=[h.run_id for h in orders], status="cancelled")
                    .values_list("kind", flat=True))
    assert len(where) >= 2, f"the cancels all reached the code at one kind of call: {where}"
    for handle in orders:
        run = handle.refresh()
        assert (run.status, run.failure_category, run.termination_reason) == (
            RunStatus.CANCELLED, "cancellation", "cancel_requested"), (run.workflow_id, run.status, run.error)
        steps = WorkflowStep.objects.filter(run_id=run.pk)
        done = {decode(s.result) for s in steps.filter(name="cancel.do", status="completed")}
        undone = [decode(s.result) for s in steps.filter(name="cancel.undo", status="completed").order_by("seq")]
        # Each step the journal says was done is compensated, once, in reverse order.
        assert sorted(undone) == sorted(done) and len(undone) == len(set(undone)), (run.workflow_id, done, undone)
        assert undone == sorted(done, key=lambda key: key.endswith(":hold")), (run.workflow_id, undone)
        for key in undone:
            executed = Execution.objects.filter(key=f"undo {key}")
            assert executed.exists(), key
            assert all(at <= run.finished_at for at in executed.values_list("created_at", flat=True)), (
                f"{key} compensated after its run ended")
        assert not Execution.objects.filter(key=f"undo {run.workflow_id}:never").exists()

    for handle in slow:
        run = handle.refresh()
        assert (run.status, run.termination_reason) == (RunStatus.TIMED_OUT, "cleanup_timeout"), run.error
        # Its cleanup began (unless a killed executor held it past the timeout) and never got past its long sleep.
        key = f"s{handle.workflow_id.split('-')[1]}"
        assert not Execution.objects.filter(key=f"undo {key}:never").exists(), outputs(procs)

    assert late.refresh().status == RunStatus.CANCELLED
    assert not Execution.objects.filter(key__startswith="late").exists(), "a run cancelled before it started ran"
