"""Slots of limited activities (``@weft.activity(concurrency=, rate=, key=)``): who may start an attempt now
(state writer).

An attempt of a limited activity asks for a slot before it begins (:func:`acquire`). Where nothing waits ahead of
it and the limits allow, its slot is ``held`` at once; otherwise its request is a ``waiting`` :class:`ActivitySlot`
row, and a grant pass makes waiting rows ``granted`` in start order (requested_at, then id) while the limits
allow: ``concurrency`` taken slots in all, ``concurrency`` of one key when the activity has a ``key``, and no more
than ``rate`` attempts begun (or granted, to begin when their runs resume) in any window of its period. Every
request and pass holds the activity's :class:`ActivityLimitState` row, so the executors of all processes take
turns. A waiting attempt holds no thread: its run parks, and the pass that grants its slot wakes it; its
timeouts start when it begins.

The attempt's slot is deleted when its body returns or raises (:func:`release`), and every slot of a run goes
with the run when it ends, so a SIGKILLed executor leaks nothing: its run is taken over and finds its slot held.
Each grant of an activity with a ``rate`` also writes an :class:`ActivityGrant` row, which its windows count
whatever became of the attempt or its run, purged an hour later.

A release takes no lock: it deletes the slot, then looks for a waiting one (a grant pass if there is). A
request that had to wait looks again, once committed, for a slot freed meanwhile; so a slot freed while a
request counted it held is granted by one of the two.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache, partial
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Case, Count, F, Field, Min, Model, QuerySet, Value, When

from django_weft.common import clock, queues
from django_weft.common.queues import ActivityLimits
from django_weft.models import (
    ActivityGrant,
    ActivityLimitState,
    ActivitySlot,
    ActivitySlotState,
    RunStatus,
    Workflow,
)
from django_weft.store import wakeups
from django_weft.store.lock_retries import retrying

logger = logging.getLogger("django_weft.activity_slots")

A = ActivitySlotState
# The states that take a slot of the activity's concurrency.
TAKEN = (A.GRANTED, A.HELD)
# Grants are kept this long for the rate windows (the longest period a rate takes is an hour).
KEEP_GRANTS = timedelta(hours=1)


def _lock(activity: str, now: datetime, declared: ActivityLimits | None = None) -> ActivityLimits:
    """Lock the activity's row (creating it the first time); its limits (``declared`` ones are stored first)."""
    states = ActivityLimitState.objects.select_for_update().filter(activity=activity)
    stored = _stored(states)
    if stored is None:
        try:
            with transaction.atomic():
                ActivityLimitState.objects.create(activity=activity, last_pass_at=now)
        except IntegrityError:  # created meanwhile by another process, whose insert we waited for
            pass
        stored = _stored(states)
        assert stored is not None
    if declared is not None:
        wanted = (declared.concurrency, "" if declared.rate is None else str(declared.rate), declared.keyed)
        if wanted != stored:
            states.update(concurrency=wanted[0], rate=wanted[1], keyed=wanted[2])
        return declared
    concurrency, rate, keyed = stored
    return ActivityLimits(concurrency=concurrency, rate=queues.parse_rate(rate or None, "rate"), keyed=keyed)


def _stored(states: QuerySet) -> tuple[int | None, str, bool] | None:
    """The limits of the locked row (no model instance: every request of a limited activity reads them)."""
    rows = list(states.order_by().values_list("concurrency", "rate", "keyed")[:1])
    return rows[0] if rows else None


@retrying("slot_acquire")  # decided under the activity's lock from what it reads: safe to run again
def acquire(activity: str, limits: ActivityLimits, key: str | None, run_id: Any, seq: int,
            now: datetime) -> tuple[bool, datetime | None]:
    """Ask for the slot of step ``seq`` of run ``run_id``: (True, None) once it is held (at once, or granted
    since); otherwise (False, when to ask again: the moment a rate window lets it in, or None to be woken by
    the grant)."""
    with transaction.atomic(using=router.db_for_write(ActivitySlot)):
        _lock(activity, now, limits)
        now = clock.now()  # once the lock is held: an attempt that begins now begins within moments
        line = _line(activity, limits, key, run_id, seq, now)
        if line.state == A.HELD:  # taken over after its executor died: the attempt goes on with it
            return True, None
        if line.state == A.GRANTED:
            assert line.pk is not None
            _begin(activity, limits, key, line.pk, now)
            return True, None
        if line.pk is None:
            fits = line.fits(limits)
            pk = ActivitySlot.objects.create(activity=activity, key=key, run_id=run_id, seq=seq, requested_at=now,
                                             state=A.HELD if fits else A.WAITING, granted_at=now if fits else None).pk
            if fits:
                _record_grant(activity, limits, key, now)
                return True, None
        else:
            pk = int(line.pk)
        granted, retry_at = _grant(activity, limits, now, exclude_run=run_id)
        if pk in granted:
            _begin(activity, limits, key, pk, now)
            return True, None
    if limits.concurrency is not None and _has_room(activity, limits, key) and _grant_and_begin(activity, key, pk,
                                                                                                run_id):
        return True, None  # a release that committed after this request counted its slot held freed one
    return False, retry_at


def _grant_and_begin(activity: str, key: str | None, pk: int, run_id: Any) -> bool:
    """A grant pass; if it granted slot ``pk`` (of run ``run_id``, which asks), that attempt begins in the same
    transaction (the passes count granted slots and begun attempts: never half of a move)."""
    with transaction.atomic(using=router.db_for_write(ActivitySlot)):
        now = clock.now()
        limits = _lock(activity, now)
        granted = pk in _grant(activity, limits, now, exclude_run=run_id, if_waiting=True)[0]
        if granted:
            _begin(activity, limits, key, pk, clock.now())
        return granted


def _begin(activity: str, limits: ActivityLimits, key: str | None, pk: int, now: datetime) -> None:
    """The attempt of granted slot ``pk`` begins now: the slot is held, and the moment is what rate windows count
    from now on (until now, the granted slot was)."""
    ActivitySlot.objects.filter(pk=pk).update(state=A.HELD, granted_at=now)
    _record_grant(activity, limits, key, now)


@dataclass(frozen=True)
class _Line:
    """What a request reads under the activity's lock: its own slot, if it asked before, and its line's."""

    pk: int | None
    state: str | None
    held: int
    granted: int  # granted, not begun: they take a slot now and a place in the window when they begin
    waiting: int
    window: int  # attempts begun in the rate's window

    def fits(self, limits: ActivityLimits) -> bool:
        """Whether a new request may hold its slot at once: nothing of its line waits ahead of it and the limits
        allow one more."""
        return not self.waiting and (limits.concurrency is None or self.held + self.granted < limits.concurrency) \
            and (limits.rate is None or self.window + self.granted < limits.rate.count)


def _line(activity: str, limits: ActivityLimits, key: str | None, run_id: Any, seq: int, now: datetime) -> _Line:
    """Read ``_Line`` in one statement (the lock is held: every figure is as the last holder committed it). Its
    SQL is written out: built by the ORM, its five subqueries cost more CPU than three queries."""
    connection = connections[router.db_for_write(ActivitySlot)]
    keyed, rated = limits.keyed and key is not None, limits.rate is not None
    run = ActivitySlot._meta.get_field("run").get_db_prep_value(run_id, connection)
    line = [activity, key] if keyed else [activity]
    params = [run, seq, run, seq, *line, A.HELD, *line, A.GRANTED, *line, A.WAITING]
    if rated:
        assert limits.rate is not None
        since = now - timedelta(seconds=limits.rate.period)
        params += [*line, ActivityGrant._meta.get_field("granted_at").get_db_prep_value(since, connection)]
    with connection.cursor() as cursor:
        cursor.execute(_line_sql(connection.vendor, keyed, rated), params)
        pk, state, held, granted, waiting, window = cursor.fetchone()
    return _Line(pk=pk, state=state, held=held, granted=granted, waiting=waiting, window=window)


@cache
def _line_sql(vendor: str, keyed: bool, rated: bool) -> str:
    quote = connections[router.db_for_write(ActivitySlot)].ops.quote_name
    slots, grants = quote(ActivitySlot._meta.db_table), quote(ActivityGrant._meta.db_table)

    def column(model: type[Model], name: str) -> str:
        field = model._meta.get_field(name)
        assert isinstance(field, Field)
        return quote(str(field.column))

    mine = f"FROM {slots} WHERE {column(ActivitySlot, 'run')} = %s AND {column(ActivitySlot, 'seq')} = %s"
    key = f" AND {column(ActivitySlot, 'key')} = %s" if keyed else ""
    line = f"FROM {slots} WHERE {column(ActivitySlot, 'activity')} = %s{key} AND {column(ActivitySlot, 'state')} = %s"
    window = "0"
    if rated:
        key = f" AND {column(ActivityGrant, 'key')} = %s" if keyed else ""
        window = (f"(SELECT COUNT(*) FROM {grants} WHERE {column(ActivityGrant, 'activity')} = %s{key} "
                  f"AND {column(ActivityGrant, 'granted_at')} > %s)")
    return (f"SELECT (SELECT {column(ActivitySlot, 'id')} {mine}), (SELECT {column(ActivitySlot, 'state')} {mine}), "
            f"(SELECT COUNT(*) {line}), (SELECT COUNT(*) {line}), (SELECT COUNT(*) {line}), {window}")


def _has_room(activity: str, limits: ActivityLimits, key: str | None) -> bool:
    held = ActivitySlot.objects.filter(activity=activity, state__in=TAKEN)
    if limits.keyed:
        held = held.filter(key=key)
    assert limits.concurrency is not None
    return held.count() < limits.concurrency


@retrying("slot_release")  # a delete, then a look: safe to run again
def release(activity: str, run_id: Any, seq: int, now: datetime) -> None:
    """The attempt of step ``seq`` ended: its slot is free; a grant pass if an attempt waits for one."""
    ActivitySlot.objects.filter(run_id=run_id, seq=seq).delete()
    if ActivitySlot.objects.filter(activity=activity, state=A.WAITING).exists():
        # Its own run's waiting branches find their grant when they ask next (SlotWait); waking it would only
        # make its next park a spurious wake-up.
        _grant_pass(activity, now, exclude_run=run_id)


@retrying("slot_grant")  # decided under the activity's lock from what it reads: safe to run again
def _grant_pass(activity: str, now: datetime, *, exclude_run: Any = None) -> set[int]:
    with transaction.atomic(using=router.db_for_write(ActivitySlot)):
        limits = _lock(activity, now)
        return _grant(activity, limits, now, exclude_run=exclude_run, if_waiting=True)[0]


def grant_waiting(activity: str, now: datetime) -> int:
    """A grant pass of ``activity`` (after a run freed its slots; the maintenance pass's, for rate windows)."""
    return len(_grant_pass(activity, now))


def grant_all(now: datetime) -> int:
    """Grant passes of every activity with waiting slots (the maintenance pass)."""
    names = (ActivitySlot.objects.filter(state=A.WAITING).order_by().values_list("activity", flat=True).distinct())
    return sum(grant_waiting(name, now) for name in sorted(names))


def _window(activity: str, limits: ActivityLimits, now: datetime, key: str | None = None) -> QuerySet:
    """The grants a rate counts now: those of the last period (of ``key`` alone for a keyed activity)."""
    assert limits.rate is not None
    grants = ActivityGrant.objects.filter(activity=activity, granted_at__gt=now - timedelta(seconds=limits.rate.period))
    return grants.filter(key=key) if limits.keyed and key is not None else grants


def _record_grant(activity: str, limits: ActivityLimits, key: str | None, now: datetime) -> None:
    """An attempt began now: the moment its rate's windows count (nothing to keep without a rate)."""
    if limits.rate is not None:
        ActivityGrant.objects.create(activity=activity, key=key, granted_at=now)


def _counts(rows: QuerySet, keys: set[str]) -> Counter:
    return Counter(dict(rows.filter(key__in=keys).values("key").annotate(n=Count("pk"))
                        .values_list("key", "n").order_by()))


def _grant(activity: str, limits: ActivityLimits, now: datetime, *, exclude_run: Any = None,
           if_waiting: bool = False) -> tuple[set[int], datetime | None]:
    """Grant waiting slots of ``activity`` in start order while the limits allow (the lock is held); returns the
    granted slots and, if a rate limit held one back, when its window lets the next one in. ``if_waiting``: look
    for a waiting slot first (one indexed query where counting the limits takes two), for a caller that usually
    finds none. A granted slot's attempt begins when its run resumes (``acquire`` finds it granted): it counts in
    the rate's window as granted until then, and from the moment it began after."""
    slots = ActivitySlot.objects.filter(activity=activity)
    if if_waiting and not slots.filter(state=A.WAITING).exists():
        return set(), None
    held = slots.filter(state__in=TAKEN)
    granted = slots.filter(state=A.GRANTED)
    window = None if limits.rate is None else _window(activity, limits, now)
    free = 10_000
    if limits.concurrency is not None and not limits.keyed:
        free = limits.concurrency - held.count()
    if limits.rate is not None and not limits.keyed:
        assert window is not None
        free = min(free, limits.rate.count - window.count() - granted.count())
    waiting = list(slots.filter(state=A.WAITING).order_by("requested_at", "id")
                   .values_list("pk", "key", "run_id")[: max(0, free) * 4 + 200])
    if not waiting:
        return set(), None
    keys = {key for _, key, _ in waiting if key is not None}
    key_held = _counts(held, keys) if limits.keyed and limits.concurrency is not None else Counter()
    key_window = _counts(window, keys) + _counts(granted, keys) if limits.keyed and window is not None \
        else Counter()
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
        ActivitySlot.objects.filter(pk__in=chosen).update(state=A.GRANTED, granted_at=now)
        _wake([run_id for run_id in runs if run_id != exclude_run], now)
    retry_at = None
    if rate_blocked and window is not None and limits.rate is not None:
        oldest = window.aggregate(at=Min("granted_at"))["at"]
        # Held back by granted attempts alone: they begin from now on, and leave the window a period after.
        retry_at = (now if oldest is None else oldest) + timedelta(seconds=limits.rate.period)
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


def run_has_slots(run_id: Any) -> bool:
    """Whether run ``run_id`` holds or waits for a slot."""
    return ActivitySlot.objects.filter(run_id=run_id).exists()


def forget_run(run_id: Any, *, waiting_only: bool = False) -> None:
    """Drop the slots of run ``run_id`` (it ended; or, ``waiting_only``, its cancel was requested or an operator
    suspended it: the attempts that have not begun leave the line, and ask again if it goes on); the activities
    whose slots it freed get a grant pass after the commit."""
    slots = ActivitySlot.objects.filter(run_id=run_id)
    if waiting_only:
        slots = slots.filter(state__in=(A.WAITING, A.GRANTED))
    freed = sorted(set(slots.filter(state__in=TAKEN).values_list("activity", flat=True)))
    slots.delete()
    for name in freed:
        transaction.on_commit(partial(_grant_logged, name), using=router.db_for_write(ActivitySlot))


def _grant_logged(activity: str) -> None:
    try:
        grant_waiting(activity, clock.now())
    except Exception:
        logger.exception("granting slots of activity %r failed; the next maintenance pass retries", activity)


def purge_grants(now: datetime) -> int:
    """Delete the grants no rate window counts any more (activity by activity: the index the windows use)."""
    cutoff = now - KEEP_GRANTS
    activities = ActivityLimitState.objects.exclude(rate="").values_list("activity", flat=True)
    return sum(ActivityGrant.objects.filter(activity=name, granted_at__lt=cutoff).delete()[0]
               for name in list(activities))
