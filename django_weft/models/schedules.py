"""The records of schedules: a schedule, and the trace of what it decided for each occurrence."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_weft.common.codec import decode
from django_weft.fields import IdentifierField
from django_weft.models.choices import OccurrenceOutcome, OverlapPolicy, ScheduleStatus
from django_weft.models.runs import Workflow


class Schedule(models.Model):
    """Starts runs of a workflow on a cron or interval cadence. Create with ``weft.create_schedule``."""

    id = models.BigAutoField(primary_key=True)
    schedule_id = IdentifierField(max_length=255, unique=True)
    workflow_type = IdentifierField(max_length=200)
    input = models.BinaryField(null=True, blank=True)
    cron = models.CharField(max_length=255, blank=True)
    every = models.DurationField(null=True, blank=True)
    timezone = models.CharField(max_length=64)
    overlap = models.CharField(max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.SKIP)
    # Pause the schedule when one of its runs fails (an operator resumes it once the cause is fixed).
    pause_on_failure = models.BooleanField(default=False, db_default=False)
    # create_schedule(backfill=True): run missed occurrences instead of counting them as missed.
    backfill_missed = models.BooleanField(default=False)
    catchup_window = models.DurationField(null=True, blank=True)
    jitter = models.DurationField(null=True, blank=True)
    # The queue (WEFT_QUEUES) its runs start on ("" for the workflow's own default), and their priority there.
    queue = models.CharField(max_length=100, blank=True, default="", db_default="")
    priority = models.IntegerField(default=0, db_default=0)
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    # Anchor of interval schedules (start_at, or when the cadence was last set).
    anchor = models.DateTimeField()
    status = models.CharField(max_length=16, choices=ScheduleStatus.choices, default=ScheduleStatus.ACTIVE)
    note = models.TextField(blank=True)
    # next_fire_at is the nominal next occurrence; due_at adds its jitter and is what the tick queries.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)
    missed_fire_count = models.PositiveBigIntegerField(default=0)
    last_missed_fire_at = models.DateTimeField(null=True, blank=True)
    # Occurrences held back by buffer_one / buffer_all until the open run finishes (ISO timestamps).
    queued_occurrences = models.JSONField(default=list, blank=True)
    current_run = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    from_settings = models.BooleanField(default=False, help_text=_("Managed by the WEFT_SCHEDULES setting."))
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = _("schedule")
        ordering = ["schedule_id"]
        indexes = [
            models.Index(fields=["due_at"], condition=Q(status="active", due_at__isnull=False),
                         name="weft_due_schedule_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every__isnull=False)) | (~Q(cron="") & Q(every__isnull=True)),
                name="weft_schedule_cron_xor_every",
            ),
        ]

    def __str__(self) -> str:
        return self.schedule_id

    @property
    def queued_runs(self) -> int:
        return len(self.queued_occurrences or ())

    @property
    def decoded_input(self) -> Any:
        """The input every run of the schedule starts with."""
        return decode(self.input)

    # Operations, each one transaction. They live in django_weft.services.schedules (the services layer), which binds
    # them here when it is imported (always, from the app's ready()): models never import a service.
    operations: Any = None

    def _ops(self) -> Any:
        if Schedule.operations is None:
            raise RuntimeError("django_weft.services.schedules is not loaded; is django_weft in INSTALLED_APPS?")
        return Schedule.operations

    def pause(self, note: str = "") -> None:
        self._ops().pause(self, note)

    def resume(self) -> None:
        self._ops().resume(self)

    def update(self, **changes: object) -> None:
        self._ops().update(self, **changes)

    def trigger(self) -> Workflow | None:
        return self._ops().trigger(self)

    def backfill(self, start: datetime, end: datetime) -> int:
        return self._ops().backfill(self, start, end)

    def cancel(self) -> None:
        self._ops().cancel(self)


class ScheduleOccurrence(models.Model):
    """What the engine decided about one occurrence (or one window of missed occurrences)."""

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="occurrences")
    scheduled_for = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=OccurrenceOutcome.choices)
    run = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    count = models.PositiveIntegerField(default=1, help_text=_("Occurrences this row stands for."))
    detail = models.TextField(blank=True)
    decided_at = models.DateTimeField()

    class Meta:
        verbose_name = _("schedule occurrence")
        ordering = ["-decided_at", "-id"]
        indexes = [
            models.Index(fields=["schedule", "-scheduled_for"], name="weft_occurrence_idx"),
            models.Index(fields=["decided_at"], name="weft_occurrence_age_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.scheduled_for:%Y-%m-%d %H:%M:%S} {self.outcome}"
