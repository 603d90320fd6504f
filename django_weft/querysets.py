"""The read vocabulary of runs: what 'open', 'runnable', 'finished' mean as queries."""

from __future__ import annotations

from datetime import datetime

from django.db import models


class WorkflowQuerySet(models.QuerySet):
    def open(self) -> WorkflowQuerySet:
        from .models import RunStatus

        return self.filter(status__in=RunStatus.open_values())

    def finished(self) -> WorkflowQuerySet:
        from .models import RunStatus

        return self.filter(status__in=RunStatus.terminal_values())

    def runnable(self, now: datetime) -> WorkflowQuerySet:
        # Matches the partial index weft_runnable_idx.
        return self.filter(runnable_at__isnull=False, runnable_at__lte=now)

    def past_deadline(self, now: datetime) -> WorkflowQuerySet:
        return self.filter(execution_deadline__isnull=False, finished_at__isnull=True,
                           execution_deadline__lte=now)
