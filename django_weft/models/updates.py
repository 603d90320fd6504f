"""The update rows: requests with a reply sent to a running workflow (``handle.update``). Re-exported by
:mod:`django_weft.models`."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_weft.common.codec import decode
from django_weft.fields import IdentifierField
from django_weft.models.choices import UpdateStatus


class WorkflowUpdate(models.Model):
    """An update accepted for a run: applied by the run's handler in arrival order (``sequence``, shared
    with signals), at the journal position ``applied_seq``; ``result`` or ``error`` is the caller's reply."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("django_weft.Workflow", on_delete=models.CASCADE, related_name="updates")
    name = IdentifierField(max_length=255)
    update_id = IdentifierField(max_length=128, help_text=_("Caller's id; unique per run (a repeat is one update)."))
    payload = models.BinaryField(null=True, blank=True)
    sequence = models.BigIntegerField(help_text=_("Arrival order within the run (signals and updates)."))
    status = models.CharField(max_length=16, choices=UpdateStatus.choices, default=UpdateStatus.PENDING)
    result = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    received_at = models.DateTimeField()
    applied_seq = models.PositiveIntegerField(null=True, blank=True, help_text=_("Journal position it ran at."))
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("workflow update")
        ordering = ["run", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["run", "update_id"], name="weft_update_unique_id"),
        ]
        indexes = [
            models.Index(fields=["run", "sequence"], condition=Q(status="pending"), name="weft_pending_update_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.update_id} ({self.status})"

    @property
    def decoded_payload(self) -> Any:
        return decode(self.payload)

    @property
    def decoded_result(self) -> Any:
        return decode(self.result)
