"""What a run publishes while it runs (design 9.4): the latest value of each event key (``ctx.set_event``) and
the ordered values of its streams (``ctx.write_stream``). Both are written in the commit that journals the
call, and read by callers through ``handle.get_event`` / ``handle.read_stream`` and the HTTP API."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.fields import IdentifierField
from django_weft.models.runs import Workflow


class WorkflowEvent(models.Model):
    """The latest value a run set for one event key."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="events")
    key = IdentifierField(max_length=200)
    value = models.BinaryField(null=True, blank=True)
    # The journal position of the ctx.set_event call that set this value.
    seq = models.PositiveIntegerField()
    set_at = models.DateTimeField()

    class Meta:
        verbose_name = _("event")
        verbose_name_plural = _("events")
        ordering = ["run", "key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="weft_event_unique_key")]

    def __str__(self) -> str:
        return self.key

    @property
    def decoded_value(self) -> Any:
        from django_weft.common.codec import decode

        return decode(self.value)


class StreamEntry(models.Model):
    """One value written to a run's stream, or (``closed``) the stream's end. Entries are read in ``id`` order,
    the order their commits made them; ``seq`` is the journal position of the call, so a replay writes none
    twice."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="stream_entries")
    key = IdentifierField(max_length=200)
    seq = models.PositiveIntegerField()
    value = models.BinaryField(null=True, blank=True)
    closed = models.BooleanField(default=False)
    written_at = models.DateTimeField()

    class Meta:
        verbose_name = _("stream entry")
        verbose_name_plural = _("stream entries")
        ordering = ["run", "key", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="weft_stream_unique_seq")]
        indexes = [models.Index(fields=["run", "key", "id"], name="weft_stream_read_idx")]

    def __str__(self) -> str:
        return f"{self.key} (closed)" if self.closed else self.key

    @property
    def decoded_value(self) -> Any:
        from django_weft.common.codec import decode

        return decode(self.value)
