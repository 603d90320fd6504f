"""Activity attempts in flight (design 9.5): an attempt that has run for over a second is published here by its
executor's lease keeper, so that operators see work that has not settled yet (``handle.pending_activities()``, the
admin's run page, the API, ``weft_runs show``). A step that finishes sooner is never written here."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.models.runs import Workflow


class AttemptInFlight(models.Model):
    """The attempt of a step an executor runs now (or ran when it died: its row stays until the step settles or
    another attempt replaces it)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="attempts_in_flight")
    seq = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    activity = models.CharField(max_length=255)
    executor = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField()
    # When its timeout (per attempt) runs out, if it has one.
    timeout_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField()

    class Meta:
        verbose_name = _("attempt in flight")
        verbose_name_plural = _("attempts in flight")
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="weft_in_flight_unique_step")]

    def __str__(self) -> str:
        return f"{self.activity} step {self.seq} attempt {self.attempt}"
