"""Slots of limited activities (``@weft.activity(concurrency=, rate=, key=)``): who may start an attempt now
(state writer).

An attempt of a limited activity asks for a slot before it begins (:func:`acquire`). Its request is a
``waiting`` :class:`ActivitySlot` row; a grant pass makes waiting rows ``held`` in start order (requested_at,
then id) while the limits allow: ``concurrency`` held slots in all, ``concurrency`` of one key when the activity
has a ``key``, and no more than ``rate`` grants in any window of its period. Every pass holds the activity's
:class:`ActivityLimitState` row, so the executors of all processes take turns. A waiting attempt holds no
thread: its run parks, and the pass that grants its slot wakes it; its timeouts start when it begins. The
attempt's slot is released when its body returns or raises (:func:`release`), and every slot of a run goes with
the run when it ends, so a SIGKILLed executor leaks nothing: its run is taken over and finds its slot held.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import IntegrityError, router, transaction
from django.db.models import Case, Count, F, Min, Q, Value, When

from django_weft.common import clock, queues
from django_weft.common.queues import ActivityLimits
from django_weft.models import ActivityLimitState, ActivitySlot, ActivitySlotState, RunStatus, Workflow
from django_weft.store import wakeups
from django_weft.store.lock_retries import retrying

logger = logging.getLogger("django_weft.activity_slots")

A = ActivitySlotState
# Released rows are kept this long for the rate limits (the longest period a rate takes is an hour).
KEEP_RELEASED = timedelta(hours=1)


def _lock(activity: str, now: datetime, declared: ActivityLimits | None = None) -> ActivityLimits:
    """Lock the activity's row (creating it the first time); its limits (``declared`` ones are stored first)."""
    states = ActivityLimitState.objects.select_for_update().filter(activity=activity)
    state = states.first()
    if state is None:
        try:
            with transaction.atomic():
                ActivityLimitState.objects.create(activity=activity, last_pass_at=now)
        except IntegrityError:  # created meanwhile by another process, whose insert we waited for
            pass
        state = states.get()
    if declared is not None:
        stored = (declared.concurrency, "" if declared.rate is None else str(declared.rate), declared.keyed)
        if stored != (state.concurrency, state.rate, state.keyed):
            states.update(concurrency=stored[0], rate=stored[1], keyed=stored[2])
        return declared
    return ActivityLimits(concurrency=state.concurrency, rate=queues.parse_rate(state.rate or None, "rate"),
                          keyed=state.keyed)


@retrying("slot_acquire")  # decided under the activity's lock from what it reads: safe to run again
def acquire(activity: str, limits: ActivityLimits, key: str | None, run_id: Any, seq: int,
            now: datetime) -> tuple[bool, datetime | None]:
    """Ask for the slot of step ``seq`` of run ``run_id``: (True, None) once it is held (at once, or granted
    since); otherwise (False, when to ask again: the moment a rate window lets it in, or None to be woken by
    the grant)."""
    with transaction.atomic(using=router.db_for_write(ActivitySlot)):
        _lock(activity, now, limits)
        slot = ActivitySlot.objects.filter(run_id=run_id, seq=seq).first()
        if slot is not None and slot.state == A.HELD:
            return True, None
        if slot is None:
            slot = ActivitySlot.objects.create(activity=activity, key=key, run_id=run_id, seq=seq, state=A.WAITING,
                                               requested_at=now)
        elif slot.state == A.RELEASED:  # the step's next attempt: at the back of the line
            ActivitySlot.objects.filter(pk=slot.pk).update(state=A.WAITING, requested_at=now, granted_at=None,
                                                           key=key)
        granted, retry_at = _grant(activity, limits, now, exclude_run=run_id)
        return slot.pk in granted, (None if slot.pk in granted else retry_at)


@retrying("slot_release")  # decided under the activity's lock from what it reads: safe to run again
def release(activity: str, run_id: Any, seq: int, now: datetime) -> None:
    """The attempt of step ``seq`` ended: its slot is free, and waiting attempts that fit now are granted."""
    with transaction.atomic(using=router.db_for_write(ActivitySlot)):
        limits = _lock(activity, now)
        ActivitySlot.objects.filter(run_id=run_id, seq=seq, state=A.HELD).update(state=A.RELEASED)
        # Its own run's waiting branches find their grant when they ask next (SlotWait); waking it would only
        # make its next park a spurious wake-up.
        _grant(activity, limits, now, exclude_run=run_id, if_waiting=True)


@retrying("slot_grant")  # decided under the activity's lock from what it reads: safe to run again
def grant_waiting(activity: str, now: datetime) -> int:
    """A grant pass of ``activity`` (after a run freed its slots; the maintenance pass's, for rate windows)."""
    with transaction.atomic(using=router.db_for_write(ActivitySlot)):
        limits = _lock(activity, now)
        return len(_grant(activity, limits, now, if_waiting=True)[0])


def grant_all(now: datetime) -> int:
    """Grant passes of every activity with waiting slots (the maintenance pass)."""
    names = (ActivitySlot.objects.filter(state=A.WAITING).order_by().values_list("activity", flat=True).distinct())
    return sum(grant_waiting(name, now) for name in sorted(names))


def _counts(slots: Any, keys: set[str]) -> Counter:
    return Counter(dict(slots.filter(key__in=keys).values("key").annotate(n=Count("pk"))
                        .values_list("key", "n").order_by()))


def _grant(activity: str, limits: ActivityLimits, now: datetime, *, exclude_run: Any = None,
           if_waiting: bool = False) -> tuple[set[int], datetime | None]:
    """Grant waiting slots of ``activity`` in start order while the limits allow (the lock is held); returns the
    granted slots and, if a rate limit held one back, when its window lets the next one in. ``if_waiting``: look
    for a waiting slot first (one indexed query where counting the limits takes two), for a caller that usually
    finds none, as a release does when nothing queues."""
    slots = ActivitySlot.objects.filter(activity=activity)
    if if_waiting and not slots.filter(state=A.WAITING).exists():
        return set(), None
    held = slots.filter(state=A.HELD)
    window = None if limits.rate is None else slots.filter(
        state__in=[A.HELD, A.RELEASED], granted_at__gt=now - timedelta(seconds=limits.rate.period))
    free = 10_000
    if limits.concurrency is not None and not limits.keyed:
        free = limits.concurrency - held.count()
    if limits.rate is not None and not limits.keyed:
        assert window is not None
        free = min(free, limits.rate.count - window.count())
    waiting = list(slots.filter(state=A.WAITING).order_by("requested_at", "id")
                   .values_list("pk", "key", "run_id")[: max(0, free) * 4 + 200])
    if not waiting:
        return set(), None
    keys = {key for _, key, _ in waiting if key is not None}
    key_held = _counts(held, keys) if limits.keyed and limits.concurrency is not None else Counter()
    key_window = _counts(window, keys) if limits.keyed and window is not None else Counter()
    chosen: list[int] = []
    runs: list[Any] = []
    rate_blocked = False
    for pk, key, run_id in waiting:
        if len(chosen) >= free:
            rate_blocked = limits.rate is not None and not limits.keyed
            break
        if limits.keyed:
            if limits.concurrency is not None and key_held[key] >= limits.concurrency:
                continue
            if limits.rate is not None and key_window[key] >= limits.rate.count:
                rate_blocked = True
                continue
            key_held[key] += 1
            key_window[key] += 1
        chosen.append(pk)
        runs.append(run_id)
    if chosen:
        ActivitySlot.objects.filter(pk__in=chosen).update(state=A.HELD, granted_at=now)
        _wake([run_id for run_id in runs if run_id != exclude_run], now)
    retry_at = None
    if rate_blocked and window is not None and limits.rate is not None:
        oldest = window.aggregate(at=Min("granted_at"))["at"]
        retry_at = None if oldest is None else oldest + timedelta(seconds=limits.rate.period)
    return set(chosen), retry_at


def _wake(run_ids: list[Any], now: datetime) -> None:
    """Wake the runs whose slot was granted: a parked one becomes runnable; one its executor is parking finds its
    inbox moved and stays runnable (as a signal would)."""
    if not run_ids:
        return
    Workflow.objects.filter(pk__in=run_ids).update(
        inbox_seq=F("inbox_seq") + 1,
        runnable_at=Case(When(status=RunStatus.WAITING, then=Value(now)), default=F("runnable_at")))
    for run_id in run_ids:
        wakeups.runnable(run_id, now, now)


def forget_run(run_id: Any, *, waiting_only: bool = False) -> None:
    """Drop the slots of run ``run_id`` (it ended; or, ``waiting_only``, its cancel was requested); the
    activities whose held slots it freed get a grant pass after the commit."""
    slots = ActivitySlot.objects.filter(run_id=run_id)
    if waiting_only:
        slots = slots.filter(state=A.WAITING)
    freed = sorted(set(slots.filter(state=A.HELD).values_list("activity", flat=True)))
    slots.delete()
    for name in freed:
        transaction.on_commit(partial(_grant_logged, name), using=router.db_for_write(ActivitySlot))


def _grant_logged(activity: str) -> None:
    try:
        grant_waiting(activity, clock.now())
    except Exception:
        logger.exception("granting slots of activity %r failed; the next maintenance pass retries", activity)


def purge_released(now: datetime) -> int:
    deleted, _ = ActivitySlot.objects.filter(
        Q(state=A.RELEASED) & (Q(granted_at__lt=now - KEEP_RELEASED) | Q(granted_at=None))).delete()
    return deleted
