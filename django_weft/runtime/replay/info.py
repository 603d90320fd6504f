"""``ctx.info``: what a run's code may know about itself (its ids, its parent, the schedule occurrence that started
it, its operator retries, how long its journal is)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django_weft.conf import weft_settings
from django_weft.models import Schedule, Workflow
from django_weft.runtime.replay.core import ReplayCore

# ctx.info.continue_as_new_suggested once the journal holds this share of WEFT_MAX_HISTORY.
CONTINUE_AS_NEW_SHARE = 0.5


@dataclass(frozen=True)
class WorkflowInfo:
    """The run as its code sees it (``ctx.info``)."""

    workflow_id: str
    run_id: uuid.UUID
    workflow_type: str
    version: int
    parent_workflow_id: str | None
    parent_run_id: uuid.UUID | None
    schedule_id: str | None
    # The occurrence of its schedule that started it (None for a run no schedule started).
    scheduled_for: datetime | None
    # 1, plus one per operator retry of the run (handle.retry, the admin's retry).
    attempt: int
    # Journal positions the code has taken so far (the same at this line on every replay);
    # continue_as_new_suggested once they pass half of WEFT_MAX_HISTORY.
    history_length: int
    continue_as_new_suggested: bool


class RunInfo(ReplayCore):
    """``ctx.info`` (mixed into runtime.context.Context)."""

    _owners: tuple[str | None, str | None] | None = None  # the parent's workflow id and the schedule's id

    @property
    def info(self) -> WorkflowInfo:
        run = self._claim.run
        if self._owners is None:
            parent = (None if run.parent_id is None else
                      Workflow.objects.filter(pk=run.parent_id).values_list("workflow_id", flat=True).first())
            schedule = (None if run.schedule_id is None else
                        Schedule.objects.filter(pk=run.schedule_id).values_list("schedule_id", flat=True).first())
            self._owners = (parent, schedule)
        length = self._seq
        return WorkflowInfo(
            workflow_id=run.workflow_id, run_id=run.run_id, workflow_type=run.workflow_type, version=run.version,
            parent_workflow_id=self._owners[0], parent_run_id=run.parent_id, schedule_id=self._owners[1],
            scheduled_for=run.scheduled_for, attempt=run.retries + 1, history_length=length,
            continue_as_new_suggested=length >= CONTINUE_AS_NEW_SHARE * int(weft_settings.MAX_HISTORY),
        )
