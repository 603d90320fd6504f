"""Django signals django_weft sends, always after the transaction that caused them commits.

Every signal is sent with ``sender=Workflow`` and ``run`` (the :class:`~django_weft.models.Workflow`).
"""

from __future__ import annotations

from django.dispatch import Signal

workflow_started = Signal()
workflow_completed = Signal()
workflow_failed = Signal()
workflow_cancelled = Signal()
workflow_timed_out = Signal()
