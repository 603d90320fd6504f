"""The heartbeat rows: of the processes that execute runs, and of the activity attempts they run.
Re-exported by :mod:`django_weft.models`."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.models.choices import ExecutorKind


class Executor(models.Model):
    """A process that executes runs: a ``weft_maintenance`` loop or a Celery worker process.

    Written by the process itself (``runtime/leases.py``): inserted when it starts, ``last_seen`` and
    ``expires_at`` refreshed with each heartbeat, deleted when it stops cleanly. A row past its
    ``expires_at`` belongs to a process that died or hangs; the maintenance pass deletes it after a while.
    Readers (``django_weft.services.liveness``) only ever compare ``expires_at`` with the clock.
    """

    # A fresh id per process start: two hosts may share a name, and a pid is reused once its process died.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=16, choices=ExecutorKind.choices)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    threads = models.PositiveIntegerField(help_text=_("Executor threads; 0: maintenance only (--no-execute)."))
    version = models.CharField(max_length=32, blank=True, help_text=_("django_weft version of the process."))
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    expires_at = models.DateTimeField(help_text=_("Counted as dead from then on unless seen again."))

    class Meta:
        verbose_name = _("executor")
        ordering = ["host", "pid"]
        indexes = [
            models.Index(fields=["expires_at"], name="weft_executor_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} on {self.host} pid {self.pid}"


class ActivityHeartbeat(models.Model):
    """The last ``weft.heartbeat(details)`` of a run's activity step, handed to the step's next attempt as
    ``activity_info().heartbeat_details`` (also after the process that beat died)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("django_weft.Workflow", on_delete=models.CASCADE, related_name="heartbeats")
    seq = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    details = models.BinaryField(null=True, blank=True)
    beat_at = models.DateTimeField()

    class Meta:
        verbose_name = _("activity heartbeat")
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="weft_heartbeat_unique_seq")]

    def __str__(self) -> str:
        return f"step {self.seq} attempt {self.attempt} at {self.beat_at:%Y-%m-%d %H:%M:%S}"
