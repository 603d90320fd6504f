"""The schedule tick: which occurrences of a schedule are due, and what each one does.

:func:`fire_due_schedules` is what the maintenance loop calls: it takes due schedules with
``select_for_update(skip_locked=True)``, so concurrent maintenance processes take disjoint schedules, and
applies each schedule's overlap policy (start, skip, buffer, cancel the open run) or counts occurrences a
late tick missed. Each started run records ``(schedule, scheduled_for)``, unique in the database, so an
occurrence starts at most one run however many processes tick. :func:`drain_buffer` starts a buffered
occurrence when the schedule's run closes. The operations people call (pause, trigger, backfill...) live
in :mod:`django_weft.services.schedules`, which uses :class:`ScheduleTicker` for the occurrences they start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import cast

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Field

from django_weft.common.codec import decode
from django_weft.common.occurrences import Cadence, count_between, jitter_offset, parse_zone
from django_weft.common.queues import configured as configured_queues
from django_weft.common.registry import get_workflow
from django_weft.common.storable import storable_text
from django_weft.conf import weft_settings
from django_weft.models import OccurrenceOutcome, OverlapPolicy, Schedule, ScheduleOccurrence, ScheduleStatus, Workflow
from django_weft.observability import events
from django_weft.signals import schedule_fired, schedule_missed_fire
from django_weft.store import transitions
from django_weft.store.starts import prepare_run

logger = logging.getLogger("django_weft.schedules")

# A tick less late than this (after jitter) is on time: its one occurrence starts, with or without backfill.
LATE_GRACE = timedelta(seconds=1)


def late_start_of(schedule: Schedule) -> timedelta:
    """How late the latest due occurrence of a schedule without backfill may still start: its catchup_window,
    or WEFT_SCHEDULE_LATE_START (never less than LATE_GRACE)."""
    window = schedule.catchup_window if schedule.catchup_window is not None else weft_settings.SCHEDULE_LATE_START
    return max(LATE_GRACE, window or timedelta(0))
# Occurrences one schedule processes (or counts as missed) per tick.
MAX_OCCURRENCES_PER_TICK = 256
# Occurrences buffer_all keeps while a run is open; later ones are dropped (and traced).
MAX_BUFFERED = 1000
# Due schedules one tick transaction locks: small enough that concurrent processes share the work.
PAGE_SIZE = 50


# --- a schedule's cadence ----------------------------------------------------------------------------


def cadence_of(schedule: Schedule) -> Cadence:
    return Cadence(cron=schedule.cron or None, every=schedule.every, zone=parse_zone(schedule.timezone),
                   anchor=schedule.anchor, start_at=schedule.start_at, end_at=schedule.end_at)


def set_next(schedule: Schedule, nominal: datetime | None) -> None:
    """Set the nominal next occurrence and its jittered due time."""
    schedule.next_fire_at = nominal
    if nominal is None:
        schedule.due_at = None
        return
    following = cadence_of(schedule).next_after(nominal) if schedule.jitter else None
    schedule.due_at = nominal + jitter_offset(schedule.schedule_id, nominal, schedule.jitter, following)


# --- one schedule's occurrences ----------------------------------------------------------------------


class ScheduleTicker:
    """Decisions about one locked schedule's occurrences inside the caller's transaction."""

    def __init__(self, schedule: Schedule, now: datetime, traces: list[ScheduleOccurrence] | None = None) -> None:
        self.schedule = schedule
        self.now = now
        self.started = 0
        # With a list, trace rows are collected for one bulk INSERT by the caller instead of saved one by one.
        self.traces = traces

    def _open_run(self) -> Workflow | None:
        if self.schedule.current_run_id is None:
            return None
        return Workflow.objects.open().filter(pk=self.schedule.current_run_id).only("pk", "status").first()

    def trace(self, moment: datetime, outcome: str, *, run: Workflow | None = None, count: int = 1,
              detail: str = "") -> None:
        row = ScheduleOccurrence(schedule=self.schedule, scheduled_for=moment, outcome=outcome, run=run,
                                 count=count, detail=detail, decided_at=self.now)
        if self.traces is None:
            row.save(force_insert=True)
        else:
            self.traces.append(row)

    def decide(self, moment: datetime, *, detail: str = "") -> Workflow | None:
        """Apply the overlap policy to occurrence ``moment``; start a run if it allows."""
        if self.traced_as_started(moment, detail=detail):
            # Before the policy: cancel_other would cancel the occurrence's own run, a buffer would hold it.
            return None
        schedule, policy = self.schedule, self.schedule.overlap
        open_run = None if policy == OverlapPolicy.ALLOW_ALL else self._open_run()
        if open_run is not None:
            if policy == OverlapPolicy.SKIP:
                self.trace(moment, OccurrenceOutcome.SKIPPED, run=open_run, detail=detail)
                return None
            if policy in (OverlapPolicy.BUFFER_ONE, OverlapPolicy.BUFFER_ALL):
                limit = 1 if policy == OverlapPolicy.BUFFER_ONE else MAX_BUFFERED
                if len(schedule.queued_occurrences) >= limit:
                    self.trace(moment, OccurrenceOutcome.BUFFER_FULL, run=open_run, detail=detail)
                else:
                    schedule.queued_occurrences = [*schedule.queued_occurrences, moment.isoformat()]
                    self.trace(moment, OccurrenceOutcome.BUFFERED, run=open_run, detail=detail)
                return None
            # cancel_other: the open run goes, this occurrence starts.
            transitions.cancel(open_run.pk, self.now, f"cancelled by schedule {schedule.schedule_id!r} "
                                                       f"(overlap cancel_other) for occurrence {moment.isoformat()}",
                               termination_reason=transitions.SCHEDULE_OVERLAP)
        return self.start(moment, detail=detail)

    def started_among(self, moments: list[datetime]) -> dict[datetime, Workflow]:
        """The runs some of ``moments`` have already (a trigger or a backfill came first). Only an occurrence
        no later than the latest one started can have one, so a tick on schedule asks the database nothing."""
        last = self.schedule.last_fire_at
        candidates = [moment for moment in moments if last is not None and moment <= last]
        if not candidates:
            return {}
        rows = Workflow.objects.filter(schedule=self.schedule, scheduled_for__in=candidates).only("pk", "scheduled_for")
        return {run.scheduled_for: run for run in rows if run.scheduled_for is not None}

    def traced_as_started(self, moment: datetime, *, detail: str = "") -> bool:
        """Whether occurrence ``moment`` has a run already; if so, that is traced."""
        earlier = self.started_among([moment]).get(moment)
        if earlier is not None:
            self.trace_started_already(moment, earlier, detail)
        return earlier is not None

    def trace_started_already(self, moment: datetime, earlier: Workflow | None, detail: str) -> None:
        self.trace(moment, OccurrenceOutcome.SKIPPED, run=earlier,
                   detail=f"{detail + ': ' if detail else ''}this occurrence already has a run")

    def start(self, moment: datetime, *, detail: str = "") -> Workflow | None:
        schedule = self.schedule
        definition = get_workflow(schedule.workflow_type)
        # A queue dropped from WEFT_QUEUES since: its runs start as the workflow's own would.
        queue = schedule.queue if schedule.queue in configured_queues() else None
        run = prepare_run(definition, decode(schedule.input),
                          workflow_id=f"{schedule.schedule_id}@{moment.isoformat()}"[:255], queue=queue,
                          priority=schedule.priority)
        run.schedule, run.scheduled_for = schedule, moment
        if self.traces is not None:
            # A page ticked together has no savepoint per run: a duplicate fails the page, which is then
            # ticked again one schedule at a time, this way below.
            transitions.insert_run(run, delayed_until=None)
        else:
            try:
                with transaction.atomic():
                    transitions.insert_run(run, delayed_until=None)
            except IntegrityError:
                # Started already, by a transaction that did not hold this schedule's lock: one run per
                # occurrence at most, and the decision is traced all the same.
                earlier = Workflow.objects.filter(schedule=schedule, scheduled_for=moment).only("pk").first()
                self.trace_started_already(moment, earlier, detail)
                return None
        schedule.current_run = run
        if schedule.last_fire_at is None or moment > schedule.last_fire_at:
            schedule.last_fire_at = moment
        self.trace(moment, OccurrenceOutcome.STARTED, run=run, detail=detail)
        transaction.on_commit(lambda: schedule_fired.send_robust(sender=Schedule, schedule=schedule, run=run,
                                                                 occurrence=moment))
        self.started += 1
        return run

    def count_missed(self, window: list[datetime], last: datetime, count: int, outcome: str,
                     describe: Callable[[int, datetime, datetime], str]) -> None:
        """Count ``count`` occurrences from ``window[0]`` to ``last`` as missed (``window`` lists those of them
        known one by one), except those that have a run already: they are traced as such, not missed."""
        started = self.started_among(window)
        for moment, run in started.items():
            self.trace_started_already(moment, run, "")
        missed = [moment for moment in window if moment not in started]
        count -= len(started)
        if count <= 0:
            return
        if last in started:
            last = missed[-1]
        # Only a capped window (``last`` is now) can have every listed occurrence started and more missed after.
        first = missed[0] if missed else (cadence_of(self.schedule).next_after(window[-1]) or last)
        self.missed(first, last, count, outcome, describe(count, first, last))

    def missed(self, first: datetime, last: datetime, count: int, outcome: str, detail: str) -> None:
        schedule = self.schedule
        schedule.missed_fire_count += count
        schedule.last_missed_fire_at = last
        self.trace(first, outcome, count=count, detail=detail)
        transaction.on_commit(lambda: schedule_missed_fire.send_robust(
            sender=Schedule, schedule=schedule, count=count, window_start=first, window_end=last))

    def tick(self) -> None:
        """Process everything due: start, buffer, skip, or count as missed; move next_fire_at on."""
        schedule, now = self.schedule, self.now
        cadence = cadence_of(schedule)
        late_start = late_start_of(schedule)
        due: list[datetime] = []
        moment = schedule.next_fire_at
        fire_at = schedule.due_at
        last_fire_at = fire_at  # when the latest due occurrence fell due (its jitter included)
        while moment is not None and fire_at is not None and fire_at <= now and len(due) < MAX_OCCURRENCES_PER_TICK:
            due.append(moment)
            last_fire_at = fire_at
            if len(due) == 1 and not schedule.backfill_missed and fire_at >= now - LATE_GRACE:
                moment = cadence.next_after(moment)  # on time: fire this one only
                break
            moment = cadence.next_after(moment)
            following = cadence.next_after(moment) if (moment is not None and schedule.jitter) else None
            fire_at = None if moment is None else moment + jitter_offset(
                schedule.schedule_id, moment, schedule.jitter, following)
        capped = len(due) == MAX_OCCURRENCES_PER_TICK and moment is not None and moment <= now
        if not due:
            pass
        elif not schedule.backfill_missed and (len(due) > 1 or (schedule.due_at or now) < now - LATE_GRACE):
            # A late tick (the process was down or busy): what fell due before the latest occurrence is missed;
            # the latest starts if it is late by less than late_start (as Celery beat runs a missed entry once).
            on_time = None
            count, last = len(due), due[-1]
            if capped:  # more than one tick processes: skip (and count) the rest of the window too
                on_time = None if schedule.jitter else _latest_on_time(cadence, now, late_start)
                count += count_between(cadence, due[-1], now) - (on_time is not None)
                moment = cadence.next_after(now)
                last = now
            elif last_fire_at is not None and last_fire_at >= now - late_start:
                on_time = due.pop()
                count, last = len(due), due[-1] if due else on_time
            if count:
                self.count_missed(due, last, count, OccurrenceOutcome.MISSED, lambda count, first, last: (
                    f"{count} occurrence(s) from {first.isoformat()} to {last.isoformat()} missed: the tick came "
                    f"at {now.isoformat()}"))
            if on_time is not None:
                self.decide(on_time)
        else:
            window_start = now - schedule.catchup_window if schedule.catchup_window else None
            too_old = [m for m in due if window_start is not None and m < window_start]
            if too_old:
                self.count_missed(too_old, too_old[-1], len(too_old), OccurrenceOutcome.OUTSIDE_CATCHUP,
                                  lambda count, first, last: (f"{count} occurrence(s) older than the catch-up "
                                                              f"window ({schedule.catchup_window}) not run"))
            for occurrence in due[len(too_old):]:
                self.decide(occurrence)
        set_next(schedule, moment)
        schedule.updated_at = now


def _latest_on_time(cadence: Cadence, now: datetime, late_start: timedelta) -> datetime | None:
    """The latest occurrence that fell due within ``late_start`` before ``now``, if any."""
    latest, moment = None, cadence.next_after(now - late_start - timedelta(microseconds=1))
    while moment is not None and moment <= now:
        latest, moment = moment, cadence.next_after(moment)
    return latest


# --- every due schedule ------------------------------------------------------------------------------


def fire_due_schedules(now: datetime) -> int:
    """One tick over every due schedule; returns how many runs it started.

    A page of due schedules is locked (SKIP LOCKED) and ticked in one transaction, first all together: one
    savepoint for the page, their trace rows in one INSERT and their own rows in one UPDATE. If anything
    in it fails, that savepoint is rolled back and the page is ticked again schedule by schedule, each in
    a savepoint of its own, so that an error pauses the schedule that caused it alone.
    """
    with ExitStack() as observed:
        return _fire_due_pages(now, observed)


def _fire_due_pages(now: datetime, observed: ExitStack) -> int:
    started, traced = 0, False
    while True:
        with transaction.atomic():
            page = list(due_schedules().filter(due_at__lte=now).select_for_update(skip_locked=True)[:PAGE_SIZE])
            if page and not traced:
                # A span for a tick that has work (most passes find none); the runs it starts remember it.
                observed.enter_context(events.schedule_tick())
                traced = True
            try:
                with transaction.atomic():
                    started_here = _tick_page(page, now)
            except Exception:
                # The rows in memory took the failed attempt's changes: tick fresh copies, one at a time.
                page = list(Schedule.objects.filter(pk__in=[s.pk for s in page]).order_by("due_at"))
                started_here = sum(_tick_one(schedule, now) for schedule in page)
            started += started_here
        if len(page) < PAGE_SIZE:
            return started


def due_schedules() -> models.QuerySet:
    """Active schedules with a next occurrence, soonest due first."""
    return Schedule.objects.filter(status=ScheduleStatus.ACTIVE, due_at__isnull=False).order_by("due_at")


def next_due_at() -> datetime | None:
    """When the soonest active schedule is due (it may be overdue), or None."""
    return due_schedules().values_list("due_at", flat=True).first()


# What a tick may change on a schedule's row.
TICKED_FIELDS = ["next_fire_at", "due_at", "current_run", "last_fire_at", "queued_occurrences", "missed_fire_count",
                 "last_missed_fire_at", "updated_at"]


def _tick_page(page: list[Schedule], now: datetime) -> int:
    traces: list[ScheduleOccurrence] = []
    started = 0
    for schedule in page:
        occurrences = ScheduleTicker(schedule, now, traces)
        occurrences.tick()
        started += occurrences.started
    ScheduleOccurrence.objects.bulk_create(traces)
    _save_ticked(page)
    return started


def _save_ticked(page: list[Schedule]) -> None:
    """The ticked schedules' TICKED_FIELDS in one executemany: each row its own values (Django's
    bulk_update builds a CASE per field and row, which cost more Python time than the tick itself)."""
    if not page:
        return
    connection = connections[router.db_for_write(Schedule)]
    meta = Schedule._meta
    fields = [cast(Field, meta.get_field(name)) for name in TICKED_FIELDS]
    assignments = ", ".join(f"{connection.ops.quote_name(str(f.column))} = %s" for f in fields)
    sql = (f"UPDATE {connection.ops.quote_name(meta.db_table)} SET {assignments} "
           f"WHERE {connection.ops.quote_name(str(meta.pk.column))} = %s")
    rows = [[f.get_db_prep_save(getattr(s, f.attname), connection) for f in fields] + [s.pk] for s in page]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _tick_one(schedule: Schedule, now: datetime) -> int:
    occurrences = ScheduleTicker(schedule, now)
    try:
        # A savepoint per schedule: an error pauses that schedule alone, with the reason in its note.
        with transaction.atomic():
            occurrences.tick()
            schedule.save()
    except Exception as exc:
        logger.exception("schedule %s: tick failed; pausing it", schedule.schedule_id)
        fresh = Schedule.objects.get(pk=schedule.pk)
        fresh.status = ScheduleStatus.PAUSED
        fresh.note = storable_text(f"paused after an error at {now.isoformat()}: {type(exc).__name__}: {exc}")[:2000]
        failed = fresh.next_fire_at or now  # the occurrence the tick was deciding (pausing clears next_fire_at)
        set_next(fresh, None)
        fresh.updated_at = now
        fresh.save()
        ScheduleOccurrence.objects.create(schedule=fresh, scheduled_for=failed, outcome=OccurrenceOutcome.ERROR,
                                          detail=fresh.note, decided_at=now)
        return 0
    return occurrences.started


# --- after the tick: the buffer drain, old history ---------------------------------------------------


def drain_buffer(run: Workflow, now: datetime) -> None:
    """``run`` (of a schedule) just closed, in this transaction: start the next buffered occurrence."""
    if run.schedule_id is None:
        return
    schedule = Schedule.objects.select_for_update().filter(pk=run.schedule_id).first()
    if (schedule is None or schedule.current_run_id != run.pk or not schedule.queued_occurrences
            or schedule.status != ScheduleStatus.ACTIVE):
        return
    first, *rest = schedule.queued_occurrences
    schedule.queued_occurrences = rest
    occurrences, moment = ScheduleTicker(schedule, now), datetime.fromisoformat(first)
    if not occurrences.traced_as_started(moment, detail="from the buffer"):
        occurrences.start(moment, detail="from the buffer")
    schedule.updated_at = now
    schedule.save()


def purge_history(now: datetime) -> int:
    keep = weft_settings.SCHEDULE_HISTORY
    if keep is None:
        return 0
    return ScheduleOccurrence.objects.filter(decided_at__lt=now - keep).delete()[0]
