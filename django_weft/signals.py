"""Django signals django_weft sends, always after the transaction that caused them commits.

Every signal is sent with ``sender=Workflow`` and ``run`` (the :class:`~django_weft.models.Workflow`);
``async_activity_pending`` also carries ``activity`` (name), ``seq``, ``attempt`` and ``task_token``.
"""

from __future__ import annotations

from django.dispatch import Signal

workflow_started = Signal()
workflow_completed = Signal()
workflow_failed = Signal()
workflow_cancelled = Signal()
workflow_timed_out = Signal()
async_activity_pending = Signal()
