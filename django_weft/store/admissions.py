"""Admission: queued runs become pending, as their queue's limits allow (state writer).

A run started on a queue of WEFT_QUEUES (or of a paused type, or debounced) is inserted ``queued``: not
runnable, so no executor claims it. An admission pass of a queue makes some of them ``pending`` and runnable:

* it first writes the queue's :class:`QueueState` row, which holds the row's lock to the end of its
  transaction, so the passes of every process on one queue take turns (on SQLite the IMMEDIATE transaction
  already does), and the counts it reads cannot change under it but by runs ending, which only frees slots;
* ``concurrency`` is checked against the queue's admitted runs that are still open (``pending``, ``running``,
  ``waiting``, ``suspended``), ``concurrency_per_key`` against those of each key: a slot is a run's open
  status, so any way a run ends frees its slot, and an executor killed with SIGKILL holds it only until the
  run is taken over and ends; a run that continues as new hands its slot to its successor (inserted
  ``pending``, never queued again);
* ``rate`` and ``rate_per_key`` are checked against ``admitted_at`` of the runs admitted in the last period: a
  pass admits at ``now`` only while fewer than N were admitted in ``(now - period, now]``, so no window of
  the period ever holds more than N admissions (the clocks of the admitting processes are assumed to agree);
* order: lower ``priority`` first; within a priority the keys take turns, each key's oldest ready run
  (by ``admit_at``, then creation) before any key's second, so a key with a thousand runs waiting holds back
  the others by at most one run per turn; runs without a key take their turns as one key.

Passes run after the commit that queued a run or ended an admitted one (in the process that did it) and on
every maintenance pass (any process), which also covers rate windows that reopen and delayed starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, router, transaction
from django.db.models import Count, F, Window
from django.db.models.functions import RowNumber

from django_weft.common import clock, queues
from django_weft.models import PausedType, QueueState, RunStatus, Workflow
from django_weft.store import wakeups

logger = logging.getLogger("django_weft.admissions")

S = RunStatus


def state_name(queue: str) -> str:
    """The QueueState row of ``queue`` ("" is no queue: runs of a paused type or debounced)."""
    return queue or queues.NO_QUEUE


def limits_of(queue: str, overrides: dict[str, Any] | None = None) -> queues.Limits:
    """The limits of ``queue`` now: its setting's with an operator's overrides over them."""
    if not queue:
        return queues.Limits()
    values = dict(queues.configured().get(queue) or {})
    values.update(overrides or {})
    return queues.limits_from(values)


def current_limits(queue: str) -> queues.Limits:
    """The limits of ``queue`` with the overrides stored now (read without the lock: for display and waits)."""
    overrides = QueueState.objects.filter(name=state_name(queue)).values_list("overrides", flat=True).first()
    return limits_of(queue, overrides)


def _lock(queue: str, now: datetime) -> QueueState:
    """Lock the queue's row (creating it the first time) to the end of the transaction. (On SQLite the
    IMMEDIATE transaction system check weft.E001 asks for already holds the database's write lock.)"""
    name = state_name(queue)
    states = QueueState.objects.select_for_update().filter(name=name)
    state = states.first()
    if state is None:
        try:
            with transaction.atomic():
                QueueState.objects.create(name=name, last_pass_at=now, updated_at=now)
        except IntegrityError:  # another process created it first; its insert made us wait for its commit
            pass
        state = states.get()
    return state


def lock_queue(queue: str, now: datetime) -> QueueState:
    """Take the admission lock of ``queue`` inside the caller's transaction (a debounce or an ``on_conflict``
    start holds it so that its look at the queued runs stays true until it commits)."""
    return _lock(queue, now)


# --- paused workflow types ------------------------------------------------------------------------------

# Starts read the paused types from a cache of this long: a type paused in another process is queued by this
# one's starts from at most this much later (admission passes read the table itself, so no run of a paused type
# is admitted from the moment the pause commits).
PAUSED_CACHE_SECONDS = 1.0
_paused_cache: tuple[float, frozenset[str]] | None = None
_paused_lock = threading.Lock()


def paused_types(*, fresh: bool = False) -> frozenset[str]:
    global _paused_cache
    cached = _paused_cache
    if not fresh and cached is not None and time.monotonic() - cached[0] < PAUSED_CACHE_SECONDS:
        return cached[1]
    names = frozenset(PausedType.objects.values_list("workflow_type", flat=True))
    with _paused_lock:
        _paused_cache = (time.monotonic(), names)
    return names


def forget_paused_types() -> None:
    global _paused_cache
    with _paused_lock:
        _paused_cache = None


# --- the admission pass ---------------------------------------------------------------------------------


def _counts(runs: Any, keys: Iterable[str]) -> Counter:
    return Counter(dict(runs.filter(concurrency_key__in=list(keys)).values("concurrency_key")
                        .annotate(n=Count("pk")).values_list("concurrency_key", "n").order_by()))


def _full_keys(runs: Any, limit: int) -> list[str]:
    return list(runs.exclude(concurrency_key=None).values("concurrency_key").annotate(n=Count("pk"))
                .filter(n__gte=limit).values_list("concurrency_key", flat=True).order_by())


def admit(queue: str, now: datetime | None = None) -> int:
    """One admission pass of ``queue``; how many runs it admitted (at most queues.MAX_PER_PASS)."""
    now = now or clock.now()
    with transaction.atomic(using=router.db_for_write(Workflow)):
        state = _lock(queue, now)
        limits = limits_of(queue, state.overrides)
        ready = (Workflow.objects.filter(queue=queue, status=S.QUEUED, admit_at__lte=now)
                 .exclude(workflow_type__in=PausedType.objects.values("workflow_type")))
        admitted = Workflow.objects.filter(queue=queue, status__in=S.admitted_values())
        free = queues.MAX_PER_PASS
        if limits.concurrency is not None:
            free = min(free, limits.concurrency - admitted.count())
        rate_free = free
        if limits.rate is not None:
            recent = Workflow.objects.filter(queue=queue, admitted_at__gt=now - timedelta(seconds=limits.rate.period))
            rate_free = min(free, limits.rate.count - recent.count())
        if free <= 0:
            return _done(state, now, 0, 0)
        candidates = ready
        per_key = limits.concurrency_per_key
        if per_key is not None:
            candidates = candidates.exclude(concurrency_key__in=_full_keys(admitted, per_key))
        key_rate = limits.rate_per_key
        recent_of_keys = None
        if key_rate is not None:
            recent_of_keys = Workflow.objects.filter(
                queue=queue, admitted_at__gt=now - timedelta(seconds=key_rate.period))
            candidates = candidates.exclude(concurrency_key__in=_full_keys(recent_of_keys, key_rate.count))
        order = ("priority", "admit_at", "created_at", "queue_order", "run_id")
        # Most passes find no more ready runs than free slots (a start on a queue that keeps up): then the order
        # between keys does not matter, and the cheaper query without the window function finds them all.
        page = list(candidates.order_by(*order).values_list("pk", "concurrency_key")[: free + 1])
        if len(page) > free:
            caps = [free, per_key, None if key_rate is None else key_rate.count]
            turn_cap = min(cap for cap in caps if cap is not None)
            page = list(
                candidates.annotate(turn=Window(RowNumber(), partition_by=[F("concurrency_key")],
                                                order_by=[F(name).asc() for name in order]))
                .filter(turn__lte=turn_cap)
                .order_by("priority", "turn", *order[1:])
                .values_list("pk", "concurrency_key")[: min(free * 4 + 100, 5000)]
            )
        keys = {key for _, key in page if key is not None}
        key_admitted = _counts(admitted, keys) if per_key is not None else Counter()
        key_recent = _counts(recent_of_keys, keys) if recent_of_keys is not None else Counter()
        chosen: list[Any] = []
        held_by_rate = 0
        for pk, key in page:
            if len(chosen) >= free:
                break
            if len(chosen) >= rate_free:
                held_by_rate += 1
                continue
            if key is not None and per_key is not None and key_admitted[key] >= per_key:
                continue
            if key is not None and key_rate is not None and key_recent[key] >= key_rate.count:
                held_by_rate += 1
                continue
            chosen.append(pk)
            if key is not None:
                key_admitted[key] += 1
                key_recent[key] += 1
        if not chosen:
            return _done(state, now, 0, held_by_rate)
        count = Workflow.objects.filter(pk__in=chosen, status=S.QUEUED, admit_at__lte=now).update(
            status=S.PENDING, runnable_at=now, admitted_at=now, updated_at=now)
        for pk in chosen:
            wakeups.runnable(pk, now, now)
        return _done(state, now, count, held_by_rate)


def _done(state: QueueState, now: datetime, admitted: int, held_by_rate: int) -> int:
    """Record the pass on the queue's row (locked): when, how many it admitted, how many a rate held back."""
    fields: dict[str, Any] = {"last_pass_at": now}
    if admitted:
        fields["admitted_total"] = F("admitted_total") + admitted
    if held_by_rate != state.rate_limited:
        fields["rate_limited"] = held_by_rate
    QueueState.objects.filter(pk=state.pk).update(**fields)
    return admitted


def admit_until_blocked(queue: str, now: datetime | None = None) -> int:
    """Admission passes of ``queue`` until one admits less than a full pass."""
    total = 0
    while True:
        admitted = admit(queue, now)
        total += admitted
        if admitted < queues.MAX_PER_PASS:
            return total


def queues_with_ready_runs(now: datetime) -> list[str]:
    return sorted(Workflow.objects.filter(status=S.QUEUED, admit_at__lte=now).order_by()
                  .values_list("queue", flat=True).distinct())


def admit_all(now: datetime | None = None) -> int:
    """Admission passes of every queue that has runs ready to be admitted (the maintenance pass's)."""
    now = now or clock.now()
    total = 0
    for queue in queues_with_ready_runs(now):
        try:
            total += admit_until_blocked(queue, now)
        except Exception:
            logger.exception("admission pass of queue %r failed; the next maintenance pass retries it", queue)
    return total


def admit_after_commit(queue: str) -> None:
    """Run an admission pass of ``queue`` once the current transaction commits (at once outside one): a run
    was queued, or an admitted one ended. A failure is logged: the next maintenance pass admits instead."""
    alias = router.db_for_write(Workflow)

    def attempt() -> None:
        try:
            admit_until_blocked(queue)
        except Exception:
            logger.exception("admission pass of queue %r failed; the next maintenance pass retries it", queue)

    transaction.on_commit(attempt, using=alias)


def next_admission_at() -> datetime | None:
    """When the soonest queued run's admit_at falls (a loop waits no longer than that)."""
    return (Workflow.objects.filter(status=S.QUEUED).order_by("admit_at")
            .values_list("admit_at", flat=True).first())
