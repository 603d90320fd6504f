"""Child workflows: ``ctx.start_child``, ``ctx.wait_child`` and ``ctx.run_child``, with child ids derived from
the parent run and step so a replay re-attaches to the same child.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.registry import get_workflow
from django_weft.exceptions import ChildWorkflowFailed, InvalidArgument, WorkflowAlreadyExists
from django_weft.models import ParentClosePolicy, RunStatus, StepKind, StepStatus, Workflow
from django_weft.runtime.errors import child_category
from django_weft.runtime.replay.core import ReplayCore, durable
from django_weft.runtime.replay.pending import Pending
from django_weft.store import journal
from django_weft.store.starts import prepare_run


class ChildHandle(Pending[Any]):
    """A child run started by ``ctx.start_child``: a branch that settles when the child finishes.

    ``result()`` (or ``ctx.wait_child(handle)``) waits for it and returns its result or raises
    :class:`ChildWorkflowFailed`; ``ctx.gather`` and ``ctx.race`` take it like any branch. Waiting takes the
    journal position of the child's result when it first happens.
    """

    def __init__(self, ctx: Any, workflow_id: str, run_id: uuid.UUID, parent_close_policy: str) -> None:
        super().__init__(ctx, 0, StepKind.CHILD_RESULT, workflow_id, None)
        self.workflow_id = workflow_id
        self.run_id = run_id
        self._policy = parent_close_policy
        self._positioned = False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChildHandle) and (other.workflow_id, other.run_id) == (self.workflow_id, self.run_id)

    def __hash__(self) -> int:
        return hash((self.workflow_id, self.run_id))

    def take_position(self) -> None:
        if self._positioned:
            return
        self._positioned = True
        ctx = self._ctx
        self.seq, step = ctx._next(StepKind.CHILD_RESULT, self.workflow_id)
        self._row = step
        if step is None:
            ctx._before_new_work(side_effects=False)
            self._started = clock.now()
            ctx._started(self)
            return
        self._started = step.started_at
        if step.status == StepStatus.COMPLETED:
            self._settle(value=decode(step.result))
        elif step.status == StepStatus.FAILED:
            self._settle(error=_child_failed(self, step.error or {}, step.failure_category))
        elif not self._settle_from_row(step):
            ctx._started(self)

    @durable
    def result(self) -> Any:
        self.take_position()
        return super().result()

    def poll(self, now: datetime) -> None:
        if self._settled or not self._positioned:
            return
        started = Workflow.objects.filter(pk=self.run_id).first()
        if started is None:  # retention deleted it after it continued as new: the chain goes on under its id
            started = Workflow.objects.latest_for(self.workflow_id).filter(parent_id=self._ctx.run_id).first()
        run = Workflow.objects.end_of_chain(started)
        if run is None or not run.is_finished:
            return
        if run.status == RunStatus.COMPLETED:
            self._write_row(StepStatus.COMPLETED, result=run.result)
            self._settle(value=decode(run.result))
            return
        error = {**(run.error or {}), "status": run.status}
        category = child_category(run.failure_category, run.status)
        self._write_row(StepStatus.FAILED, error=error, failure_category=category)
        self._settle(error=_child_failed(self, error, category))

    def park_writes(self) -> list[journal.JournalWrite]:
        if self._row is None and not self._settled:
            self._write_row(StepStatus.WAITING, finished=False)
        return []

    def reason(self) -> str:
        return f"waiting for child {self.workflow_id}"

    def cancel(self, reason: str, *, with_run: bool = False) -> None:
        if self._policy != ParentClosePolicy.ABANDON:
            self._ctx._defer(journal.CancelChild(self.run_id, clock.now(), reason, self._policy))
        super().cancel(reason, with_run=with_run)


def _child_failed(child: ChildHandle, error: dict, category: str) -> ChildWorkflowFailed:
    status = error.get("status", "failed")
    return ChildWorkflowFailed(
        f"child workflow {child.workflow_id!r} {status}: {error.get('type')}: {error.get('message')}",
        workflow_id=child.workflow_id, run_id=child.run_id, status=status, error=error,
        failure_category=child_category(category, status),
    )


class Children(ReplayCore):
    """The replay context's children (mixed into runtime.context.Context)."""

    @durable
    def start_child(self, workflow: str | Callable[..., Any], input: Any = None, *,
                    workflow_id: str | None = None, parent_close_policy: str = "terminate",
                    search_attributes: dict[str, Any] | None = None, queue: str | None = None,
                    concurrency_key: str | None = None, priority: int = 0) -> ChildHandle:
        """Start a child run and return a handle to it without waiting (on ``queue`` it waits to be admitted,
        as a run started by ``weft.start`` does).

        The child's id defaults to one derived from this run and step, so a replay re-attaches to the
        child instead of starting another. ``parent_close_policy`` says what happens to the child if
        this run closes first: ``terminate`` (cancel it at once), ``request_cancel`` (cancel it once it
        is not executing), ``abandon`` (leave it running). ``search_attributes`` are the child's own (checked
        as at ``weft.start``; it does not inherit this run's).
        """

        definition = get_workflow(workflow)
        seq, step = self._next(StepKind.CHILD, definition.name)
        self._claim.has_dependents = True
        if step is not None:
            child_workflow_id, child_run_id = decode(step.result)
            return ChildHandle(self, child_workflow_id, uuid.UUID(child_run_id), parent_close_policy)
        if parent_close_policy not in ParentClosePolicy.values:
            raise InvalidArgument(f"parent_close_policy must be one of {ParentClosePolicy.values}, "
                                  f"got {parent_close_policy!r}")
        child = prepare_run(definition, input, search_attributes=search_attributes,
                            workflow_id=workflow_id if workflow_id is not None else f"{self.run_id}:{seq}",
                            queue=queue, concurrency_key=concurrency_key, priority=priority)
        child.parent_id = self.run_id
        child.parent_close_policy = parent_close_policy
        if workflow_id is not None and Workflow.objects.open().filter(workflow_id=workflow_id).exists():
            raise WorkflowAlreadyExists(f"child workflow id {workflow_id!r} already has an open run")
        self._before_new_work(side_effects=True)
        now = clock.now()
        record = self._step(seq, StepKind.CHILD, definition.name, StepStatus.COMPLETED,
                            result=encode([child.workflow_id, str(child.run_id)]), started=now, finished=now)
        self._commit([journal.InsertChild(child), self._record(record, None)])
        return ChildHandle(self, child.workflow_id, child.run_id, parent_close_policy)

    @durable
    def wait_child(self, child: ChildHandle) -> Any:
        """Wait for a child run to finish; return its result or raise :class:`ChildWorkflowFailed`
        (``child.result()`` does the same)."""
        if not isinstance(child, ChildHandle):
            raise InvalidArgument(f"wait_child takes the handle ctx.start_child returned, got {child!r}")
        return child.result()

    @durable
    def run_child(self, workflow: str | Callable[..., Any], input: Any = None, *,
                  workflow_id: str | None = None, parent_close_policy: str = "terminate",
                  search_attributes: dict[str, Any] | None = None, queue: str | None = None,
                  concurrency_key: str | None = None, priority: int = 0) -> Any:
        """Start a child run and wait for it: ``start_child`` then ``wait_child``."""
        child = self.start_child(workflow, input, workflow_id=workflow_id, parent_close_policy=parent_close_policy,
                                 queue=queue, concurrency_key=concurrency_key, priority=priority,
                                 search_attributes=search_attributes)
        return self.wait_child(child)
