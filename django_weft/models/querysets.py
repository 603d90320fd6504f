"""The read vocabulary of runs: what 'open', 'runnable', 'finished' mean as queries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models

from django_weft.models.choices import RunStatus


class WorkflowQuerySet(models.QuerySet):
    def open(self) -> WorkflowQuerySet:


        return self.filter(status__in=RunStatus.open_values())

    def finished(self) -> WorkflowQuerySet:


        return self.filter(status__in=RunStatus.terminal_values())

    def runnable(self, now: datetime) -> WorkflowQuerySet:
        # Matches the partial index weft_runnable_idx.
        return self.filter(runnable_at__isnull=False, runnable_at__lte=now)

    def past_deadline(self, now: datetime) -> WorkflowQuerySet:
        return self.filter(execution_deadline__isnull=False, finished_at__isnull=True,
                           execution_deadline__lte=now)

    def end_of_chain(self, run: Any) -> Any:
        """``run``, or, if it continued as new, the run its chain has reached now."""


        while run is not None and run.status == RunStatus.CONTINUED:
            following = (self.filter(restarted_from_id=run.pk, workflow_id=run.workflow_id)
                         .order_by("created_at").first())
            if following is None:
                return run
            run = following
        return run

    def latest_for(self, workflow_id: str) -> WorkflowQuerySet:
        """Runs of ``workflow_id``, latest first: the open run (at most one), then by creation (continued
        runs last)."""


        return self.filter(workflow_id=workflow_id).order_by(
            # A run that continued as new is never the latest: its successor is.
            models.Case(models.When(status__in=RunStatus.open_values(), then=0),
                        models.When(status=RunStatus.CONTINUED, then=2), default=1),
            "-created_at", "-finished_at",
        )
