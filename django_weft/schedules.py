"""Schedules: create and operate them, and the tick that starts their runs.

The tick takes due schedules with ``select_for_update(skip_locked=True)``, so concurrent maintenance
processes take disjoint schedules; each started run records ``(schedule, scheduled_for)``, unique in the
database, so an occurrence starts at most one run however many processes tick.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, models, router, transaction

from . import clock, transitions, wakeups
from .client import prepare_run
from .codec import decode, encode
from .conf import weft_settings
from .durations import check_moment, to_seconds
from .exceptions import (
    InvalidArgument,
    ScheduleAlreadyExists,
    ScheduleNotFound,
    TransitionNotAllowed,
    WeftError,
)
from .models import (
    OccurrenceOutcome,
    OverlapPolicy,
    Schedule,
    ScheduleOccurrence,
    ScheduleStatus,
    Workflow,
)
from .occurrences import Cadence, check_cron, count_between, jitter_offset, parse_zone
from .registry import get_workflow
from .signals import schedule_fired, schedule_missed_fire
from .storable import check_text, storable_text

logger = logging.getLogger("django_weft.schedules")

# A tick more than this late (after jitter) counts its occurrences as missed unless backfill is on.
LATE_GRACE = timedelta(seconds=1)
# Occurrences one schedule processes (or counts as missed) per tick.
MAX_OCCURRENCES_PER_TICK = 256
# Occurrences buffer_all keeps while a run is open; later ones are dropped (and traced).
MAX_BUFFERED = 1000
# Occurrences one backfill() call may start.
MAX_BACKFILL = 10_000
# Due schedules one tick transaction locks: small enough that concurrent processes share the work.
PAGE_SIZE = 50


# --- validation --------------------------------------------------------------------------------------


@dataclass
class ScheduleSpec:
    """Validated options of a schedule; ``apply`` writes them onto a model instance."""

    cron: str
    every: timedelta | None
    timezone: str
    overlap: str
    backfill: bool
    catchup_window: timedelta | None
    jitter: timedelta | None
    start_at: datetime | None
    end_at: datetime | None

    @classmethod
    def check(cls, *, cron: Any, every: Any, timezone: Any, overlap: Any, backfill: Any, catchup_window: Any,
              jitter: Any, start_at: Any, end_at: Any) -> ScheduleSpec:
        if (cron is None) == (every is None):
            raise InvalidArgument("a schedule needs exactly one of cron and every")
        if cron is not None:
            check_cron(cron)
        interval = None
        if every is not None:
            interval = timedelta(seconds=to_seconds(every, "every", allow_zero=False))
            if interval < timedelta(seconds=1):
                raise InvalidArgument(f"every must be at least one second, got {every!r}")
        zone = timezone or settings.TIME_ZONE
        parse_zone(zone)
        if overlap not in OverlapPolicy.values:
            raise InvalidArgument(f"overlap must be one of {', '.join(OverlapPolicy.values)}, got {overlap!r}")
        if not isinstance(backfill, bool):
            raise InvalidArgument(f"backfill must be True or False, got {backfill!r}")
        for name, value in (("start_at", start_at), ("end_at", end_at)):
            if value is not None:
                check_moment(value, name)
        if start_at is not None and end_at is not None and end_at <= start_at:
            raise InvalidArgument("end_at must be after start_at")

        def duration(value: Any, name: str) -> timedelta | None:
            return None if value is None else timedelta(seconds=to_seconds(value, name, allow_zero=False))

        return cls(cron=cron or "", every=interval, timezone=zone, overlap=overlap, backfill=backfill,
                   catchup_window=duration(catchup_window, "catchup_window"), jitter=duration(jitter, "jitter"),
                   start_at=start_at, end_at=end_at)

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleSpec:
        return cls(cron=schedule.cron, every=schedule.every, timezone=schedule.timezone, overlap=schedule.overlap,
                   backfill=schedule.backfill_missed, catchup_window=schedule.catchup_window,
                   jitter=schedule.jitter, start_at=schedule.start_at, end_at=schedule.end_at)

    def apply(self, schedule: Schedule) -> None:
        schedule.cron, schedule.every, schedule.timezone = self.cron, self.every, self.timezone
        schedule.overlap, schedule.backfill_missed = self.overlap, self.backfill
        schedule.catchup_window, schedule.jitter = self.catchup_window, self.jitter
        schedule.start_at, schedule.end_at = self.start_at, self.end_at


def cadence_of(schedule: Schedule) -> Cadence:
    return Cadence(cron=schedule.cron or None, every=schedule.every, zone=parse_zone(schedule.timezone),
                   anchor=schedule.anchor, start_at=schedule.start_at, end_at=schedule.end_at)


def _set_next(schedule: Schedule, nominal: datetime | None) -> None:
    """Set the nominal next occurrence and its jittered due time."""
    schedule.next_fire_at = nominal
    if nominal is None:
        schedule.due_at = None
        return
    following = cadence_of(schedule).next_after(nominal) if schedule.jitter else None
    schedule.due_at = nominal + jitter_offset(schedule.schedule_id, nominal, schedule.jitter, following)


def next_occurrences(schedule: Schedule, count: int = 10, after: datetime | None = None) -> list[datetime]:
    """The next ``count`` nominal occurrences after ``after`` (default now), for previews."""
    cadence, found, moment = cadence_of(schedule), [], after or clock.now()
    while len(found) < count:
        moment = cadence.next_after(moment)
        if moment is None:
            break
        found.append(moment)
    return found


# --- the API -----------------------------------------------------------------------------------------


def create_schedule(
    schedule_id: str,
    workflow: Any,
    input: Any = None,
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    timezone: str | None = None,
    overlap: str = OverlapPolicy.SKIP,
    backfill: bool = False,
    catchup_window: float | timedelta | None = None,
    jitter: float | timedelta | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> Schedule:
    """Create a schedule that starts runs of ``workflow`` on a cron or interval cadence.

    ``cron``: five fields, or six with seconds first, evaluated in ``timezone`` (an IANA name; default
    ``settings.TIME_ZONE``). ``every``: a timedelta (or seconds), anchored at ``start_at`` or now.
    ``overlap`` decides what an occurrence does while the previous run is open: ``skip``,
    ``buffer_one``, ``buffer_all``, ``cancel_other`` or ``allow_all``. ``backfill=True`` runs occurrences
    a late tick missed (up to 256 per tick, none older than ``catchup_window``) instead of counting them
    as missed. ``jitter`` delays each occurrence by a deterministic amount below it.
    """
    _check_schedule_id(schedule_id)
    definition = get_workflow(workflow)
    spec = ScheduleSpec.check(cron=cron, every=every, timezone=timezone, overlap=overlap, backfill=backfill,
                              catchup_window=catchup_window, jitter=jitter, start_at=start_at, end_at=end_at)
    data = encode(input, what=f"input of schedule {schedule_id!r}")
    now = clock.now()
    schedule = Schedule(schedule_id=schedule_id, workflow_type=definition.name, input=data,
                        anchor=start_at or now, created_at=now, updated_at=now)
    spec.apply(schedule)
    _set_next(schedule, cadence_of(schedule).next_after(now))
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
            wakeups.schedule_due(schedule.due_at, now)
    except IntegrityError:
        raise ScheduleAlreadyExists(f"a schedule with id {schedule_id!r} already exists; update it instead") from None
    return schedule


def _check_schedule_id(schedule_id: Any) -> None:
    if not isinstance(schedule_id, str) or not schedule_id or len(schedule_id) > 200:
        raise InvalidArgument(f"schedule_id must be a non-empty string of at most 200 characters, got {schedule_id!r}")
    check_text(schedule_id, "schedule_id")


def get_schedule(schedule_id: str) -> Schedule:
    _check_schedule_id(schedule_id)
    try:
        return Schedule.objects.get(schedule_id=schedule_id)
    except Schedule.DoesNotExist:
        raise ScheduleNotFound(f"no schedule with id {schedule_id!r}") from None


def _locked(schedule: Schedule) -> Schedule:
    return Schedule.objects.select_for_update().get(pk=schedule.pk)


def _refresh(target: Schedule, source: Schedule) -> None:
    for field in Schedule._meta.concrete_fields:
        setattr(target, field.attname, getattr(source, field.attname))


def _drop_queue(schedule: Schedule, now: datetime, why: str) -> list[ScheduleOccurrence]:
    dropped = [ScheduleOccurrence(schedule=schedule, scheduled_for=datetime.fromisoformat(iso),
                                  outcome=OccurrenceOutcome.PAUSED, detail=why, decided_at=now)
               for iso in schedule.queued_occurrences]
    schedule.queued_occurrences = []
    return dropped


def pause(schedule: Schedule, note: str = "") -> None:
    """Stop firing until resume(); buffered occurrences are dropped (and traced)."""
    if not isinstance(note, str) or len(note) > 2000:
        raise InvalidArgument("a pause note must be a string of at most 2000 characters")
    check_text(note, "the pause note")
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} is cancelled; it cannot be paused")
        locked.status, locked.note = ScheduleStatus.PAUSED, note or "paused"
        ScheduleOccurrence.objects.bulk_create(_drop_queue(locked, now, "schedule paused"))
        _set_next(locked, None)
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)


def resume(schedule: Schedule) -> None:
    """Fire again from the next occurrence after now (the paused window is not caught up)."""
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} has been cancelled and cannot be resumed")
        if locked.status == ScheduleStatus.PAUSED:
            locked.status, locked.note = ScheduleStatus.ACTIVE, ""
            _set_next(locked, cadence_of(locked).next_after(now))
            locked.updated_at = now
            locked.save()
            wakeups.schedule_due(locked.due_at, now)
    _refresh(schedule, locked)


def cancel(schedule: Schedule) -> None:
    """End the schedule for good; its record and history stay."""
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        locked.status = ScheduleStatus.CANCELLED
        ScheduleOccurrence.objects.bulk_create(_drop_queue(locked, now, "schedule cancelled"))
        _set_next(locked, None)
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)


UPDATABLE = {"input", "cron", "every", "timezone", "overlap", "backfill", "catchup_window", "jitter", "start_at",
             "end_at"}


def update(schedule: Schedule, **changes: Any) -> None:
    """Change a schedule in place. Giving ``cron`` or ``every`` replaces the cadence (the other is cleared);
    options left out keep their values. The next occurrence is recomputed from now."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidArgument(f"cannot update {sorted(unknown)}; updatable: {sorted(UPDATABLE)}")
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        current = ScheduleSpec.of(locked)
        values = {"cron": current.cron or None, "every": current.every, "timezone": current.timezone,
                  "overlap": current.overlap, "backfill": current.backfill,
                  "catchup_window": current.catchup_window, "jitter": current.jitter,
                  "start_at": current.start_at, "end_at": current.end_at}
        if "cron" in changes or "every" in changes:
            values["cron"], values["every"] = changes.pop("cron", None), changes.pop("every", None)
        data = encode(changes.pop("input"), what=f"input of schedule {locked.schedule_id!r}") \
            if "input" in changes else locked.input
        values.update(changes)
        spec = ScheduleSpec.check(**values)
        cadence_changed = (spec.cron, spec.every, spec.timezone, spec.start_at) != (
            current.cron, current.every, current.timezone, current.start_at)
        spec.apply(locked)
        locked.input = data
        if cadence_changed and locked.every is not None:
            locked.anchor = locked.start_at or now  # an interval re-anchors when its cadence changes
        if locked.status == ScheduleStatus.ACTIVE:
            _set_next(locked, cadence_of(locked).next_after(now))
            wakeups.schedule_due(locked.due_at, now)
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)


def trigger(schedule: Schedule) -> Workflow | None:
    """Fire now, as an extra occurrence under the schedule's overlap policy. Returns the started run,
    or None if the policy skipped or buffered it."""
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} is cancelled; it cannot be triggered")
        run = _Occurrences(locked, now).decide(now, detail="triggered")
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)
    return run


def backfill(schedule: Schedule, start: datetime, end: datetime) -> int:
    """Start one run for every occurrence in [start, end] that has none yet, regardless of the overlap
    policy (at most 10,000 per call). Returns how many runs it started."""
    for name, value in (("start", start), ("end", end)):
        check_moment(value, f"backfill {name}")
    if end < start:
        raise InvalidArgument("backfill end must not be before start")
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} is cancelled; it cannot be backfilled")
        cadence = cadence_of(locked)
        wanted, moment = [], start - timedelta(microseconds=1)
        while len(wanted) <= MAX_BACKFILL:
            moment = cadence.next_after(moment)
            if moment is None or moment > end:
                break
            wanted.append(moment)
        if len(wanted) > MAX_BACKFILL:
            raise InvalidArgument(f"the range holds more than {MAX_BACKFILL} occurrences; backfill it in parts")
        existing = set(Workflow.objects.filter(schedule=locked, scheduled_for__in=wanted)
                       .values_list("scheduled_for", flat=True))
        occurrences = _Occurrences(locked, now)
        started = 0
        for moment in wanted:
            if moment not in existing:
                occurrences.start(moment, detail="backfill")
                started += 1
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)
    return started


# --- the tick ----------------------------------------------------------------------------------------


class _Occurrences:
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
                                                       f"(overlap cancel_other) for occurrence {moment.isoformat()}")
        return self.start(moment, detail=detail)

    def start(self, moment: datetime, *, detail: str = "") -> Workflow | None:
        schedule = self.schedule
        definition = get_workflow(schedule.workflow_type)
        run = prepare_run(definition, decode(schedule.input),
                          workflow_id=f"{schedule.schedule_id}@{moment.isoformat()}"[:255])
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
                # Started already (a trigger or backfill at the same instant): one run per occurrence at most.
                return None
        schedule.current_run = run
        if schedule.last_fire_at is None or moment > schedule.last_fire_at:
            schedule.last_fire_at = moment
        self.trace(moment, OccurrenceOutcome.STARTED, run=run, detail=detail)
        transaction.on_commit(lambda: schedule_fired.send_robust(sender=Schedule, schedule=schedule, run=run,
                                                                 occurrence=moment))
        self.started += 1
        return run

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
        elif not schedule.backfill_missed and (len(due) > 1 or schedule.due_at < now - LATE_GRACE):
            # A late tick: what fell due before the grace is missed, but the latest occurrence, if it fell
            # due within the grace, is on time and starts.
            on_time = None
            count, last = len(due), due[-1]
            if capped:  # more than one tick processes: skip (and count) the rest of the window too
                on_time = None if schedule.jitter else _latest_on_time(cadence, now)
                count += count_between(cadence, due[-1], now) - (on_time is not None)
                moment = cadence.next_after(now)
                last = now
            elif last_fire_at is not None and last_fire_at >= now - LATE_GRACE:
                on_time = due.pop()
                count, last = len(due), due[-1]
            self.missed(due[0], last, count, OccurrenceOutcome.MISSED,
                        f"{count} occurrence(s) from {due[0].isoformat()} to {last.isoformat()} missed: the tick "
                        f"came at {now.isoformat()}")
            if on_time is not None:
                self.decide(on_time)
        else:
            window_start = now - schedule.catchup_window if schedule.catchup_window else None
            too_old = [m for m in due if window_start is not None and m < window_start]
            if too_old:
                self.missed(too_old[0], too_old[-1], len(too_old), OccurrenceOutcome.OUTSIDE_CATCHUP,
                            f"{len(too_old)} occurrence(s) older than the catch-up window "
                            f"({schedule.catchup_window}) not run")
            for occurrence in due[len(too_old):]:
                self.decide(occurrence)
        _set_next(schedule, moment)
        schedule.updated_at = now


def _latest_on_time(cadence: Cadence, now: datetime) -> datetime | None:
    """The latest occurrence that fell due within LATE_GRACE before ``now``, if any."""
    latest, moment = None, cadence.next_after(now - LATE_GRACE - timedelta(microseconds=1))
    while moment is not None and moment <= now:
        latest, moment = moment, cadence.next_after(moment)
    return latest


def fire_due_schedules(now: datetime) -> int:
    """One tick over every due schedule; returns how many runs it started.

    A page of due schedules is locked (SKIP LOCKED) and ticked in one transaction, first all together: one
    savepoint for the page, their trace rows in one INSERT and their own rows in one UPDATE. If anything
    in it fails, that savepoint is rolled back and the page is ticked again schedule by schedule, each in
    a savepoint of its own, so that an error pauses the schedule that caused it alone.
    """
    started = 0
    while True:
        with transaction.atomic():
            page = list(due_schedules().filter(due_at__lte=now).select_for_update(skip_locked=True)[:PAGE_SIZE])
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
        occurrences = _Occurrences(schedule, now, traces)
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
    fields = [meta.get_field(name) for name in TICKED_FIELDS]
    assignments = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)
    sql = (f"UPDATE {connection.ops.quote_name(meta.db_table)} SET {assignments} "
           f"WHERE {connection.ops.quote_name(meta.pk.column)} = %s")
    rows = [[f.get_db_prep_save(getattr(s, f.attname), connection) for f in fields] + [s.pk] for s in page]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _tick_one(schedule: Schedule, now: datetime) -> int:
    occurrences = _Occurrences(schedule, now)
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
        _set_next(fresh, None)
        fresh.updated_at = now
        fresh.save()
        ScheduleOccurrence.objects.create(schedule=fresh, scheduled_for=fresh.next_fire_at or now,
                                          outcome=OccurrenceOutcome.ERROR, detail=fresh.note, decided_at=now)
        return 0
    return occurrences.started


def drain_buffer(run: Workflow, now: datetime) -> None:
    """``run`` (of a schedule) just closed, in this transaction: start the next buffered occurrence."""
    schedule = Schedule.objects.select_for_update().filter(pk=run.schedule_id).first()
    if (schedule is None or schedule.current_run_id != run.pk or not schedule.queued_occurrences
            or schedule.status != ScheduleStatus.ACTIVE):
        return
    first, *rest = schedule.queued_occurrences
    schedule.queued_occurrences = rest
    _Occurrences(schedule, now).start(datetime.fromisoformat(first), detail="from the buffer")
    schedule.updated_at = now
    schedule.save()


def purge_history(now: datetime) -> int:
    keep = weft_settings.SCHEDULE_HISTORY
    if keep is None:
        return 0
    return ScheduleOccurrence.objects.filter(decided_at__lt=now - keep).delete()[0]



# --- schedules in code (WEFT_SCHEDULES) --------------------------------------------------------------

REMOVED_NOTE = "removed from WEFT_SCHEDULES"
SETTING_KEYS = {"workflow", "input", "cron", "every", "timezone", "overlap", "backfill", "catchup_window", "jitter",
                "start_at", "end_at"}


@dataclass
class SyncReport:
    created: list[str]
    updated: list[str]
    paused: list[str]


def sync_schedules(definitions: dict[str, dict] | None = None) -> SyncReport:
    """Make the database match WEFT_SCHEDULES: create or update each schedule in place, and pause (never
    delete) the ones that were defined there and no longer are."""
    from .exceptions import ConfigurationError

    definitions = weft_settings.SCHEDULES if definitions is None else definitions
    if not isinstance(definitions, dict):
        raise ConfigurationError("WEFT_SCHEDULES must be a dict of schedule id -> options")
    report = SyncReport([], [], [])
    for schedule_id, options in definitions.items():
        if not isinstance(options, dict) or "workflow" not in options:
            raise ConfigurationError(f"WEFT_SCHEDULES[{schedule_id!r}] must be a dict with a 'workflow'")
        unknown = set(options) - SETTING_KEYS
        if unknown:
            raise ConfigurationError(f"WEFT_SCHEDULES[{schedule_id!r}] has unknown option(s) {sorted(unknown)}")
        fields = dict(options)
        workflow = fields.pop("workflow")
        try:
            existing = Schedule.objects.filter(schedule_id=schedule_id).first()
            if existing is None:
                with transaction.atomic():
                    created = create_schedule(schedule_id, workflow, **fields)
                    Schedule.objects.filter(pk=created.pk).update(from_settings=True)
                report.created.append(schedule_id)
                continue
            with transaction.atomic():
                fields.setdefault("input", None)
                for key in ("timezone", "overlap", "backfill", "catchup_window", "jitter", "start_at", "end_at"):
                    fields.setdefault(key, {"overlap": OverlapPolicy.SKIP, "backfill": False}.get(key))
                update(existing, **fields)
                Schedule.objects.filter(pk=existing.pk).update(
                    workflow_type=get_workflow(workflow).name, from_settings=True)
                if existing.status == ScheduleStatus.PAUSED and existing.note == REMOVED_NOTE:
                    resume(existing)
            report.updated.append(schedule_id)
        except WeftError as exc:
            raise ConfigurationError(f"WEFT_SCHEDULES[{schedule_id!r}]: {exc}") from exc
    gone = Schedule.objects.filter(from_settings=True, status=ScheduleStatus.ACTIVE).exclude(
        schedule_id__in=list(definitions))
    for schedule in gone:
        pause(schedule, REMOVED_NOTE)
        report.paused.append(schedule.schedule_id)
    return report


# The model's convenience methods (``schedule.pause()``...) and the state writer's hook for runs a schedule
# started: bound here, so that lower layers never import this module.
Schedule.operations = sys.modules[__name__]
transitions.on_schedule_run_closed(drain_buffer)
