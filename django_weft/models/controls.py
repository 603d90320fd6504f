"""What an operator changed about one step of a run (design 9.5): its retries paused, its attempt count reset, its
retry policy or timeouts replaced; and the audit record of every such control. The replay reads a run's controls
only when the run has any (``Workflow.has_step_controls``)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.models.runs import Workflow


class StepControl(models.Model):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="step_controls")
    seq = models.PositiveIntegerField()
    retries_paused = models.BooleanField(default=False)
    # Attempts up to this number no longer count against the retry policy (an operator reset the count).
    attempts_reset_after = models.PositiveIntegerField(default=0)
    # Replacements of the activity's own options ({"max_attempts": ..., "initial_backoff": ...}), or null.
    retry = models.JSONField(null=True, blank=True)
    timeout = models.FloatField(null=True, blank=True)
    schedule_to_close_timeout = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = _("step control")
        verbose_name_plural = _("step controls")
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="weft_step_control_unique")]

    def __str__(self) -> str:
        return f"step {self.seq} of {self.run_id}"


class RunAction(models.Model):
    """The audit record of one operator control of a run's step (fire now, reset attempts, pause, options)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="operator_actions")
    seq = models.PositiveIntegerField(null=True, blank=True)
    action = models.CharField(max_length=32)
    detail = models.JSONField(default=dict, blank=True)
    requested_by = models.CharField(max_length=255, blank=True)
    at = models.DateTimeField()

    class Meta:
        verbose_name = _("operator action")
        verbose_name_plural = _("operator actions")
        ordering = ["run", "at", "id"]

    def __str__(self) -> str:
        return f"{self.action} on step {self.seq}"
