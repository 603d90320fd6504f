"""``ctx.signal_workflow``: a journaled step that signals another workflow's open run exactly once (the signal is
stored in the commit that records the step, so neither a replay nor a crash sends it twice)."""

from __future__ import annotations

from typing import Any

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.storable import check_text
from django_weft.exceptions import WorkflowClosed, WorkflowNotFound
from django_weft.models import FailureCategory, Signal, StepKind, StepStatus, Workflow
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.store import journal
from django_weft.store.starts import check_id, check_opaque_id

# As for weft.signal(signal_id=...).
MAX_SIGNAL_ID_BYTES = 255


class OutgoingSignals(ReplayCore):
    """``ctx.signal_workflow`` (mixed into runtime.context.Context)."""

    @durable
    def signal_workflow(self, workflow_id: str, name: str, payload: Any = None, *,
                        signal_id: str | None = None) -> bool:
        """Send signal ``name`` to the open run of ``workflow_id``, once: the step that records it stores the signal
        in the same commit. Returns False if the other run had already received ``signal_id`` (by default one
        derived from this run and step). Raises WorkflowNotFound for an unknown id and WorkflowClosed if its
        latest run finished (both recorded, so a replay raises them again)."""
        check_id(workflow_id, "signal_workflow's workflow_id")
        check_text(name, "a signal name")
        check_id(name, "a signal name")
        if signal_id is not None:
            check_opaque_id(signal_id, "signal_id", max_bytes=MAX_SIGNAL_ID_BYTES)
        data = encode(payload, what=f"payload of signal {name!r}")
        seq, step = self._next(StepKind.SIGNAL_SENT, name)
        if step is not None:
            if step.status == StepStatus.FAILED:
                error = step.error or {}
                kind = WorkflowNotFound if error.get("type") == "WorkflowNotFound" else WorkflowClosed
                raise kind(error.get("message", f"signal {name!r} was not sent"))
            return bool(decode(step.result))
        self._before_new_work(side_effects=True)
        now = clock.now()
        latest = Workflow.objects.latest_for(workflow_id).only("status", "run_id").first()
        refused: Exception | None = None
        if latest is None:
            refused = WorkflowNotFound(f"no workflow with id {workflow_id!r}; nothing to signal")
        elif latest.is_finished:
            refused = WorkflowClosed(f"workflow {workflow_id!r} is {latest.status} (run {latest.run_id}); it cannot "
                                     f"receive signal {name!r}")
        if refused is not None or latest is None:
            assert refused is not None
            self._defer(self._record(self._step(
                seq, StepKind.SIGNAL_SENT, name, StepStatus.FAILED, started=now, finished=now,
                error={"type": type(refused).__name__, "message": str(refused)},
                failure_category=FailureCategory.APPLICATION), None))
            raise refused
        signal_id = signal_id if signal_id is not None else f"{self.run_id}:{seq}"
        duplicate = Signal.objects.filter(run_id=latest.pk, name=name, signal_id=signal_id).exists()
        self._commit([self._record(self._step(
            seq, StepKind.SIGNAL_SENT, name, StepStatus.COMPLETED, result=encode(not duplicate), started=now,
            finished=now), None), journal.SendSignal(workflow_id, name, data, signal_id, now)])
        return not duplicate
