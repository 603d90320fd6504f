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


class ActivitySlotState(models.TextChoices):
    WAITING = "waiting", _("Waiting")
    # Granted while its run was parked: its attempt begins when the run resumes, and counts in the rate window
    # until then.
    GRANTED = "granted", _("Granted")
    HELD = "held", _("Held")


class ActivitySlot(models.Model):
    """An attempt of a limited activity (``@weft.activity(concurrency=, rate=)``): waiting for a slot, granted one
    (its run resumes to begin it), holding one while it executes. One row per step of a run, deleted when its
    attempt ends (a retry asks again, at the back of the line). Granted in start order (``requested_at``, then
    ``id``) under the activity's ActivityLimitState lock; deleted with its run."""

    id = models.BigAutoField(primary_key=True)
    activity = models.CharField(max_length=255)
    key = IdentifierField(max_length=255, null=True, blank=True)
    run = models.ForeignKey("Workflow", on_delete=models.CASCADE, related_name="activity_slots")
    seq = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=ActivitySlotState.choices)
    requested_at = models.DateTimeField()
    granted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("activity slot")
        ordering = ["activity", "requested_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="weft_activity_slot_per_step")]
        indexes = [models.Index(fields=["activity", "state", "requested_at"], name="weft_activity_slot_idx")]

    def __str__(self) -> str:
        return f"{self.activity} step {self.seq} ({self.state})"


class ActivityGrant(models.Model):
    """The moment an attempt of an activity with a ``rate`` began: what its rate windows count. It outlives the
    attempt and the run (an attempt of a run that ended still took its place in the window) and is purged an
    hour later, the longest period a rate takes."""

    id = models.BigAutoField(primary_key=True)
    activity = models.CharField(max_length=255)
    key = IdentifierField(max_length=255, null=True, blank=True)
    granted_at = models.DateTimeField()

    class Meta:
        verbose_name = _("activity grant")
        indexes = [models.Index(fields=["activity", "granted_at"], name="weft_activity_window_idx")]

    def __str__(self) -> str:
        return f"{self.activity} at {self.granted_at.isoformat()}"


class ActivityLimitState(models.Model):
    """The lock row of a limited activity: every grant pass of its slots holds it, so passes take turns. It keeps
    the activity's limits as its code declared them at the last request, for the passes made where that code
    is not at hand (a run that ended freed a slot)."""

    activity = models.CharField(primary_key=True, max_length=255)
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    rate = models.CharField(max_length=32, blank=True, default="")
    keyed = models.BooleanField(default=False)
    last_pass_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("activity limit")

    def __str__(self) -> str:
        return self.activity
