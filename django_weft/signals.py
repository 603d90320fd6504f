"""Django signals django_weft sends, always after the transaction that caused them commits.

Every signal is sent with ``sender=Workflow`` and ``run`` (the :class:`~django_weft.models.Workflow`);
``async_activity_pending`` also carries ``activity`` (name), ``seq``, ``attempt`` and ``task_token``.
The schedule signals are sent with ``sender=Schedule``: ``schedule_fired`` with ``schedule``, ``run`` and
``occurrence``; ``schedule_missed_fire`` with ``schedule``, ``count``, ``window_start`` and ``window_end``.
"""

from __future__ import annotations

from django.dispatch import Signal

workflow_started = Signal()
workflow_completed = Signal()
workflow_failed = Signal()
workflow_cancelled = Signal()
workflow_timed_out = Signal()
async_activity_pending = Signal()
schedule_fired = Signal()
schedule_missed_fire = Signal()
