"""Django signals django_weft sends, always after the transaction that caused them commits (and never when it
rolls back), with ``send_robust``: a failing receiver is logged by Django and changes nothing.

Every signal is sent with ``sender=Workflow`` and ``run`` (the :class:`~django_weft.models.Workflow`);
``async_activity_pending`` also carries ``activity`` (name), ``seq``, ``attempt`` and ``task_token``.
The schedule signals are sent with ``sender=Schedule``: ``schedule_fired`` with ``schedule``, ``run`` and
``occurrence``; ``schedule_missed_fire`` with ``schedule``, ``count``, ``window_start`` and ``window_end``.

Activities (``activity`` is the activity's name, ``seq`` its step in the journal, ``attempt`` counts from 1):

* ``activity_started``: ``activity``, ``seq``, ``attempt``; as an attempt begins, on the thread that runs it
  (an attempt commits nothing before it runs; inside a caller's transaction it waits for that commit);
* ``activity_completed``: ``activity``, ``seq``, ``attempt``, ``step`` (the recorded
  :class:`~django_weft.models.WorkflowStep`, with its encoded ``result``), after the commit that records it;
* ``activity_failed``: ``activity``, ``seq``, ``attempt``, ``error`` (the recorded error dict),
  ``will_retry`` (False: the run sees ActivityError) and ``step``, after the commit that records it, once per
  failed attempt.

Signals sent to runs:

* ``signal_received``: ``name``, ``signal_pk``, ``signal_id`` and ``record`` (the stored
  :class:`~django_weft.models.Signal`), after the commit that stored it (a duplicate ``signal_id`` stores
  nothing and sends nothing);
* ``signal_consumed``: ``name``, ``signal_pk`` and ``seq`` (the step that consumed it), after the run's commit
  that records the consumption.

An operator's view of a run's life (``run`` as it was written):

* ``workflow_taken_over``: ``previous_owner`` (the executor whose lease ran out while it held the run) and
  ``owner`` (the one that took it over), after the claim;
* ``workflow_suspended``: ``reason``, after the commit that suspended it;
* ``workflow_resumed``: after the commit that made it runnable again.
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
activity_started = Signal()
activity_completed = Signal()
activity_failed = Signal()
signal_received = Signal()
signal_consumed = Signal()
workflow_taken_over = Signal()
workflow_suspended = Signal()
workflow_resumed = Signal()
