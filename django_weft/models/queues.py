"""The records of flow control: each queue's operator-set limits and admission state, and paused workflow types."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.fields import IdentifierField


class QueueState(models.Model):
    """A queue of WEFT_QUEUES as the database knows it: the limits an operator set at run time over the settings'
    ones, and what the last admission pass saw. Every admission pass on a queue writes its row first, which
    serialises the passes of all processes on that queue (the row is its admission lock, on every database)."""

    name = models.CharField(primary_key=True, max_length=100)
    # Limits set by an operator ({"concurrency": 5, "rate": "10/s", ...}); a key present overrides the
    # setting's (None there: no limit), a key absent keeps it.
    overrides = models.JSONField(default=dict, blank=True)
    # Queued runs ready to be admitted that the last pass held back only because of a rate limit.
    rate_limited = models.PositiveIntegerField(default=0)
    # Runs admitted by this queue, ever (a counter for metrics).
    admitted_total = models.BigIntegerField(default=0)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class PausedType(models.Model):
    """A workflow type an operator paused (weft.pause_type): its new and queued runs wait, queued, until it is
    resumed; its admitted runs go on."""

    workflow_type = IdentifierField(primary_key=True, max_length=200)
    reason = models.TextField(blank=True, default="")
    paused_at = models.DateTimeField()

    class Meta:
        verbose_name = _("paused workflow type")
        verbose_name_plural = _("paused workflow types")
        ordering = ["workflow_type"]

    def __str__(self) -> str:
        return self.workflow_type
