"""Child workflows: ``ctx.start_child``, ``ctx.wait_child`` and ``ctx.run_child``, with child ids derived from
the parent run and step so a replay re-attaches to the same child.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import clock, journal
from ...codec import decode, encode
from ...exceptions import ChildWorkflowFailed, InvalidArgument, WorkflowAlreadyExists
from ...models import ParentClosePolicy, RunStatus, StepKind, StepStatus, Workflow
from ...registry import get_workflow
from ...starts import prepare_run
from .core import ReplayCore


@dataclass(frozen=True)
class ChildHandle:
    """A child run started by ``ctx.start_child``; pass it to ``ctx.wait_child``."""

    workflow_id: str
    run_id: uuid.UUID


class Children(ReplayCore):
    """The replay context's children (mixed into runtime.context.Context)."""

    def start_child(self, workflow: str | Callable[..., Any], input: Any = None, *,
                    workflow_id: str | None = None, parent_close_policy: str = "terminate") -> ChildHandle:
        """Start a child run and return a handle to it without waiting.

        The child's id defaults to one derived from this run and step, so a replay re-attaches to the
        child instead of starting another. ``parent_close_policy`` says what happens to the child if
        this run closes first: ``terminate`` (cancel it at once), ``request_cancel`` (cancel it once it
        is not executing), ``abandon`` (leave it running).
        """

        definition = get_workflow(workflow)
        seq, step = self._next(StepKind.CHILD, definition.name)
        self._claim.has_dependents = True
        if step is not None:
            child_workflow_id, child_run_id = decode(step.result)
            return ChildHandle(child_workflow_id, uuid.UUID(child_run_id))
        if parent_close_policy not in ParentClosePolicy.values:
            raise InvalidArgument(f"parent_close_policy must be one of {ParentClosePolicy.values}, "
                                  f"got {parent_close_policy!r}")
        child = prepare_run(definition, input,
                            workflow_id=workflow_id if workflow_id is not None else f"{self.run_id}:{seq}")
        child.parent_id = self.run_id
        child.parent_close_policy = parent_close_policy
        if workflow_id is not None and Workflow.objects.open().filter(workflow_id=workflow_id).exists():
            raise WorkflowAlreadyExists(f"child workflow id {workflow_id!r} already has an open run")
        self._before_new_work(side_effects=True)
        now = clock.now()
        record = self._step(seq, StepKind.CHILD, definition.name, StepStatus.COMPLETED,
                            result=encode([child.workflow_id, str(child.run_id)]), started=now, finished=now)
        self._commit([journal.InsertChild(child), self._record(record, None)])
        return ChildHandle(child.workflow_id, child.run_id)

    def wait_child(self, child: ChildHandle) -> Any:
        """Wait for a child run to finish; return its result or raise :class:`ChildWorkflowFailed`."""
        seq, step = self._next(StepKind.CHILD_RESULT, child.workflow_id)
        if step is not None and step.status == StepStatus.COMPLETED:
            return decode(step.result)
        if step is not None and step.status == StepStatus.FAILED:
            raise self._child_failed(child, step.error or {})
        self._before_new_work(side_effects=False)
        now = clock.now()
        run = Workflow.objects.filter(pk=child.run_id).only("status", "result", "error").first()
        if run is None or not run.is_finished:
            waiting = self._step(seq, StepKind.CHILD_RESULT, child.workflow_id, StepStatus.WAITING,
                                 started=now, finished=None)
            self._park(wake_at=None, reason=f"waiting for child {child.workflow_id}",
                       writes=[] if step is not None else [self._record(waiting, None)])
        started = step.started_at if step is not None else now
        if run.status == RunStatus.COMPLETED:
            self._defer(self._record(self._step(seq, StepKind.CHILD_RESULT, child.workflow_id,
                                                StepStatus.COMPLETED, result=run.result, started=started,
                                                finished=now), step))
            return decode(run.result)
        error = {**(run.error or {}), "status": run.status}
        self._defer(self._record(self._step(seq, StepKind.CHILD_RESULT, child.workflow_id, StepStatus.FAILED,
                                            error=error, started=started, finished=now), step))
        raise self._child_failed(child, error)

    def run_child(self, workflow: str | Callable[..., Any], input: Any = None, *,
                  workflow_id: str | None = None, parent_close_policy: str = "terminate") -> Any:
        """Start a child run and wait for it: ``start_child`` then ``wait_child``."""
        child = self.start_child(workflow, input, workflow_id=workflow_id, parent_close_policy=parent_close_policy)
        return self.wait_child(child)

    @staticmethod
    def _child_failed(child: ChildHandle, error: dict) -> ChildWorkflowFailed:
        status = error.get("status", "failed")
        return ChildWorkflowFailed(
            f"child workflow {child.workflow_id!r} {status}: {error.get('type')}: {error.get('message')}",
            workflow_id=child.workflow_id, run_id=child.run_id, status=status, error=error,
        )
