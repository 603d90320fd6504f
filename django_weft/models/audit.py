"""What operators did to many runs at once, and idempotency keys that outlive their runs. Re-exported by
:mod:`django_weft.models`."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.fields import IdentifierField
from django_weft.models.choices import BulkOperationStatus


class BulkOperation(models.Model):
    """The audit record of one bulk operation (``weft.bulk.*``, the admin's "all matching", ``weft_runs``)."""

    id = models.BigAutoField(primary_key=True)
    operation = models.CharField(max_length=16)
    filters = models.JSONField(default=dict, blank=True)
    arguments = models.JSONField(default=dict, blank=True, help_text=_("Reason, signal name... (no payloads)."))
    requested_by = models.CharField(max_length=255, blank=True)
    matched = models.PositiveIntegerField(help_text=_("Runs the filter matched when it was confirmed."))
    count = models.PositiveIntegerField(default=0, help_text=_("Runs the operation changed."))
    status = models.CharField(max_length=16, choices=BulkOperationStatus.choices, default=BulkOperationStatus.RUNNING)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("bulk operation")
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"{self.operation} of {self.count}/{self.matched} run(s) ({self.status})"


class SpentIdempotencyKey(models.Model):
    """An idempotency key whose run was purged: reusing it raises IdempotencyKeyPurged instead of starting a
    second run (which could, say, charge a card twice)."""

    key = IdentifierField(max_length=255, primary_key=True)
    workflow_id = IdentifierField(max_length=255)
    run_id = models.UUIDField()
    spent_at = models.DateTimeField(help_text=_("When its run was purged."))

    class Meta:
        verbose_name = _("spent idempotency key")

    def __str__(self) -> str:
        return self.key
