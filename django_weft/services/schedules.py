"""Schedules: the operations on them, which people call (the API, the admin, ``manage.py weft_schedules``).

Create, read, pause, resume, update, trigger, backfill and cancel a schedule, validate its options
(:class:`ScheduleSpec`), and make the database match ``WEFT_SCHEDULES``. Each operation is one
transaction on the locked schedule row. What happens when occurrences fall due (the tick and the overlap
policies) is :mod:`django_weft.services.schedule_tick`; its entry points are importable from here too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.durations import check_moment, to_seconds
from django_weft.common.occurrences import check_cron, count_between, parse_zone
from django_weft.common.queues import check_queue_name
from django_weft.common.registry import get_workflow
from django_weft.common.storable import check_text
from django_weft.conf import weft_settings
from django_weft.exceptions import (
    InvalidArgument,
    ScheduleAlreadyExists,
    ScheduleNotFound,
    TransitionNotAllowed,
    WeftError,
)
from django_weft.models import (
    OccurrenceOutcome,
    OverlapPolicy,
    RunStatus,
    Schedule,
    ScheduleOccurrence,
    ScheduleStatus,
    Workflow,
)
from django_weft.services.schedule_tick import (  # noqa: F401
    # the tick's entry points and limits stay importable from here (the maintenance loop, django_weft.testing)
    LATE_GRACE,
    MAX_BUFFERED,
    MAX_OCCURRENCES_PER_TICK,
    PAGE_SIZE,
    ScheduleTicker,
    cadence_of,
    drain_buffer,
    due_schedules,
    fire_due_schedules,
    next_due_at,
    purge_history,
    set_next,
)
from django_weft.store import transitions, wakeups
from django_weft.store.starts import check_id, check_priority

# Occurrences one backfill() call may start.
MAX_BACKFILL = 10_000


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
    queue: str = ""
    priority: int = 0
    pause_on_failure: bool = False

    @classmethod
    def check(cls, *, cron: Any, every: Any, timezone: Any, overlap: Any, backfill: Any, catchup_window: Any,
              jitter: Any, start_at: Any, end_at: Any, queue: Any = None, priority: Any = 0,
              pause_on_failure: Any = False) -> ScheduleSpec:
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
        if not isinstance(pause_on_failure, bool):
            raise InvalidArgument(f"pause_on_failure must be True or False, got {pause_on_failure!r}")
        if start_at is not None:
            start_at = check_moment(start_at, "start_at")
        if end_at is not None:
            end_at = check_moment(end_at, "end_at")
        if start_at is not None and end_at is not None and end_at <= start_at:
            raise InvalidArgument("end_at must be after start_at")

        if queue is not None and queue != "":
            check_queue_name(queue)
        check_priority(priority)

        def duration(value: Any, name: str) -> timedelta | None:
            return None if value is None else timedelta(seconds=to_seconds(value, name, allow_zero=False))

        return cls(cron=cron or "", every=interval, timezone=zone, overlap=overlap, backfill=backfill,
                   catchup_window=duration(catchup_window, "catchup_window"), jitter=duration(jitter, "jitter"),
                   start_at=start_at, end_at=end_at, queue=queue or "", priority=priority,
                   pause_on_failure=pause_on_failure)

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleSpec:
        return cls(cron=schedule.cron, every=schedule.every, timezone=schedule.timezone, overlap=schedule.overlap,
                   backfill=schedule.backfill_missed, catchup_window=schedule.catchup_window,
                   jitter=schedule.jitter, start_at=schedule.start_at, end_at=schedule.end_at,
                   queue=schedule.queue, priority=schedule.priority, pause_on_failure=schedule.pause_on_failure)

    def apply(self, schedule: Schedule) -> None:
        schedule.cron, schedule.every, schedule.timezone = self.cron, self.every, self.timezone
        schedule.overlap, schedule.backfill_missed = self.overlap, self.backfill
        schedule.catchup_window, schedule.jitter = self.catchup_window, self.jitter
        schedule.start_at, schedule.end_at = self.start_at, self.end_at
        schedule.queue, schedule.priority = self.queue, self.priority
        schedule.pause_on_failure = self.pause_on_failure



def next_occurrences(schedule: Schedule, count: int = 10, after: datetime | None = None) -> list[datetime]:
    """The next ``count`` nominal occurrences after ``after`` (default now), for previews."""
    cadence, moment = cadence_of(schedule), after or clock.now()
    found: list[datetime] = []
    while len(found) < count:
        following = cadence.next_after(moment)
        if following is None:
            break
        found.append(following)
        moment = following
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
    queue: str | None = None,
    priority: int = 0,
    pause_on_failure: bool = False,
) -> Schedule:
    """Create a schedule that starts runs of ``workflow`` on a cron or interval cadence.

    ``cron``: five fields, or six with seconds first, evaluated in ``timezone`` (an IANA name; default
    ``settings.TIME_ZONE``). ``every``: a timedelta (or seconds), anchored at ``start_at`` or now.
    ``overlap`` decides what an occurrence does while the previous run is open: ``skip``,
    ``buffer_one``, ``buffer_all``, ``cancel_other`` or ``allow_all``. ``backfill=True`` runs occurrences
    a late tick missed (up to 256 per tick, none older than ``catchup_window``) instead of counting them
    as missed. ``jitter`` delays each occurrence by a deterministic amount below it. ``queue`` and ``priority``:
    its runs start on that queue of WEFT_QUEUES (default: the workflow's own) with that priority.
    ``pause_on_failure=True`` pauses the schedule when one of its runs fails or times out (resume it once fixed).
    """
    _check_schedule_id(schedule_id)
    definition = get_workflow(workflow)
    spec = ScheduleSpec.check(cron=cron, every=every, timezone=timezone, overlap=overlap, backfill=backfill,
                              catchup_window=catchup_window, jitter=jitter, start_at=start_at, end_at=end_at,
                              queue=queue, priority=priority, pause_on_failure=pause_on_failure)
    data = encode(input, what=f"input of schedule {schedule_id!r}")
    now = clock.now()
    schedule = Schedule(schedule_id=schedule_id, workflow_type=definition.name, input=data,
                        anchor=spec.start_at or now, created_at=now, updated_at=now)
    spec.apply(schedule)
    set_next(schedule, cadence_of(schedule).next_after(now))
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
            wakeups.schedule_due(schedule.due_at, now)
    except IntegrityError:
        raise ScheduleAlreadyExists(f"a schedule with id {schedule_id!r} already exists; update it instead") from None
    return schedule


def _check_schedule_id(schedule_id: Any) -> None:
    check_id(schedule_id, "schedule_id", max_length=200)


def get_schedule(schedule_id: str) -> Schedule:
    _check_schedule_id(schedule_id)
    try:
        return Schedule.objects.get(schedule_id=schedule_id)
    except Schedule.DoesNotExist:
        raise ScheduleNotFound(f"no schedule with id {schedule_id!r}") from None


def _locked(schedule: Schedule) -> Schedule:
    return Schedule.objects.select_for_update().get(pk=schedule.pk)


def _refresh(target: Schedule, source: Schedule) -> None:
    for column in Schedule._meta.concrete_fields:
        setattr(target, column.attname, getattr(source, column.attname))


def _drop_queue(schedule: Schedule, now: datetime, why: str) -> list[ScheduleOccurrence]:
    dropped = [ScheduleOccurrence(schedule=schedule, scheduled_for=datetime.fromisoformat(iso),
                                  outcome=OccurrenceOutcome.PAUSED, detail=why, decided_at=now)
               for iso in schedule.queued_occurrences]
    schedule.queued_occurrences = []
    return dropped


def _drop_due(schedule: Schedule, now: datetime, why: str) -> list[ScheduleOccurrence]:
    """The trace of the occurrences that fell due and that no tick decided, which pausing or cancelling the
    schedule drops (they would vanish with next_fire_at otherwise)."""
    first = schedule.next_fire_at
    if first is None or schedule.due_at is None or schedule.due_at > now:
        return []
    # Counted up to a bound: a cron's occurrences are counted one by one, and months of them take minutes.
    count = count_between(cadence_of(schedule), first - timedelta(microseconds=1), now, cap=MAX_OCCURRENCES_PER_TICK)
    many = f"{count} or more" if count == MAX_OCCURRENCES_PER_TICK else str(count)
    return [ScheduleOccurrence(schedule=schedule, scheduled_for=first, outcome=OccurrenceOutcome.PAUSED, count=count,
                               detail=f"{many} occurrence(s) due from {first.isoformat()} to {now.isoformat()} not "
                                      f"started: {why}", decided_at=now)]


def pause(schedule: Schedule, note: str = "") -> None:
    """Stop firing until resume(); buffered occurrences, and those due that no tick decided yet, are dropped
    (and traced)."""
    if not isinstance(note, str) or len(note) > 2000:
        raise InvalidArgument("a pause note must be a string of at most 2000 characters")
    check_text(note, "the pause note")
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} is cancelled; it cannot be paused")
        locked.status, locked.note = ScheduleStatus.PAUSED, note or "paused"
        ScheduleOccurrence.objects.bulk_create([*_drop_due(locked, now, "schedule paused"),
                                                *_drop_queue(locked, now, "schedule paused")])
        set_next(locked, None)
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
            set_next(locked, cadence_of(locked).next_after(now))
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
        ScheduleOccurrence.objects.bulk_create([*_drop_due(locked, now, "schedule cancelled"),
                                                *_drop_queue(locked, now, "schedule cancelled")])
        set_next(locked, None)
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)


UPDATABLE = {"input", "cron", "every", "timezone", "overlap", "backfill", "catchup_window", "jitter", "start_at",
             "end_at", "queue", "priority", "pause_on_failure"}


# What decides when occurrences fall due: an edit of one of these moves the next occurrence.
TIMING = ("cron", "every", "timezone", "start_at", "end_at", "jitter")


def update(schedule: Schedule, **changes: Any) -> None:
    """Change a schedule in place. Giving ``cron`` or ``every`` replaces the cadence (the other is cleared);
    options left out keep their values.

    Occurrences that fell due before the edit and that no tick has decided yet are decided first, as a tick
    would decide them now (the catch-up policy, the ledger), with the edited options on the timing they fell
    due by. Then a change of timing (cadence, time zone, bounds, jitter) moves the next occurrence to the
    first one after now; any other change keeps it."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise InvalidArgument(f"cannot update {sorted(unknown)}; updatable: {sorted(UPDATABLE)}")
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        current = ScheduleSpec.of(locked)
        spec, data = _edited(locked, current, changes)
        retimed = _timing(spec) != _timing(current)
        if locked.status == ScheduleStatus.ACTIVE:
            _settle_due(locked, now, replace(spec, **_timing(current)), data, retimed=retimed)
        recadenced = (spec.cron, spec.every, spec.timezone, spec.start_at) != (
            current.cron, current.every, current.timezone, current.start_at)
        spec.apply(locked)
        locked.input = data
        if recadenced and locked.every is not None:
            locked.anchor = locked.start_at or now  # an interval re-anchors when its cadence changes
        if locked.status == ScheduleStatus.ACTIVE:
            if retimed:
                set_next(locked, cadence_of(locked).next_after(now))
            wakeups.schedule_due(locked.due_at, now)
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)


def _edited(schedule: Schedule, current: ScheduleSpec,
            changes: dict[str, Any]) -> tuple[ScheduleSpec, bytes | memoryview | None]:
    """The validated options and encoded input of ``schedule`` once ``changes`` apply."""
    values = {"cron": current.cron or None, "every": current.every, "timezone": current.timezone,
              "overlap": current.overlap, "backfill": current.backfill, "catchup_window": current.catchup_window,
              "jitter": current.jitter, "start_at": current.start_at, "end_at": current.end_at,
              "queue": current.queue, "priority": current.priority, "pause_on_failure": current.pause_on_failure}
    changes = dict(changes)
    if "cron" in changes or "every" in changes:
        values["cron"], values["every"] = changes.pop("cron", None), changes.pop("every", None)
    data = encode(changes.pop("input"), what=f"input of schedule {schedule.schedule_id!r}") \
        if "input" in changes else schedule.input
    values.update(changes)
    return ScheduleSpec.check(**values), data


def _timing(spec: ScheduleSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in TIMING}


def _settle_due(schedule: Schedule, now: datetime, options: ScheduleSpec, data: bytes | memoryview | None, *,
                retimed: bool) -> None:
    """Decide the occurrences of ``schedule`` that fell due before an edit, as a tick now would, with the
    edited ``options`` (input, overlap, backfill, catch-up window) on the timing they fell due by: an edit
    that recomputes the next occurrence from now would otherwise drop them unrecorded."""
    if schedule.due_at is None or schedule.due_at > now:
        return
    options.apply(schedule)
    schedule.input = data
    occurrences = ScheduleTicker(schedule, now)
    occurrences.tick()
    if retimed and schedule.next_fire_at is not None and schedule.next_fire_at <= now:
        _count_backlog_as_missed(occurrences, now)


def _count_backlog_as_missed(occurrences: ScheduleTicker, now: datetime) -> None:
    """A backfill runs at most MAX_OCCURRENCES_PER_TICK per tick; what the settling tick left of a longer
    backlog is counted as missed, since the old timing that would have brought it back is gone."""
    schedule = occurrences.schedule
    first = schedule.next_fire_at
    assert first is not None
    count = count_between(cadence_of(schedule), first - timedelta(microseconds=1), now)
    occurrences.missed(first, now, count, OccurrenceOutcome.MISSED,
                       f"{count} occurrence(s) from {first.isoformat()} to {now.isoformat()} not run: the "
                       f"schedule's timing changed while they were due (a tick runs at most "
                       f"{MAX_OCCURRENCES_PER_TICK})")


def trigger(schedule: Schedule) -> Workflow | None:
    """Fire now, as an extra occurrence under the schedule's overlap policy. Returns the started run,
    or None if the policy skipped or buffered it."""
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} is cancelled; it cannot be triggered")
        run = ScheduleTicker(locked, now).decide(now, detail="triggered")
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)
    return run


def backfill(schedule: Schedule, start: datetime, end: datetime) -> int:
    """Start one run for every occurrence in [start, end] that has none yet, regardless of the overlap
    policy (at most 10,000 per call). Returns how many runs it started."""
    start, end = check_moment(start, "backfill start"), check_moment(end, "backfill end")
    if end < start:
        raise InvalidArgument("backfill end must not be before start")
    now = clock.now()
    with transaction.atomic():
        locked = _locked(schedule)
        if locked.status == ScheduleStatus.CANCELLED:
            raise TransitionNotAllowed(f"schedule {locked.schedule_id!r} is cancelled; it cannot be backfilled")
        cadence = cadence_of(locked)
        wanted: list[datetime] = []
        moment = start - timedelta(microseconds=1)
        while len(wanted) <= MAX_BACKFILL:
            following = cadence.next_after(moment)
            if following is None or following > end:
                break
            wanted.append(following)
            moment = following
        if len(wanted) > MAX_BACKFILL:
            raise InvalidArgument(f"the range holds more than {MAX_BACKFILL} occurrences; backfill it in parts")
        existing = set(Workflow.objects.filter(schedule=locked, scheduled_for__in=wanted)
                       .values_list("scheduled_for", flat=True))
        occurrences = ScheduleTicker(locked, now)
        started = 0
        for moment in wanted:
            if moment not in existing:
                occurrences.start(moment, detail="backfill")
                started += 1
        locked.updated_at = now
        locked.save()
    _refresh(schedule, locked)
    return started


# --- schedules in code (WEFT_SCHEDULES) --------------------------------------------------------------

REMOVED_NOTE = "removed from WEFT_SCHEDULES"
SETTING_KEYS = {"workflow", "input", "cron", "every", "timezone", "overlap", "backfill", "catchup_window", "jitter",
                "start_at", "end_at", "queue", "priority", "pause_on_failure"}


# What an option left out of a WEFT_SCHEDULES entry means (create_schedule's defaults).
SETTING_DEFAULTS: dict[str, Any] = {"input": None, "timezone": None, "overlap": OverlapPolicy.SKIP, "backfill": False,
                                    "catchup_window": None, "jitter": None, "start_at": None, "end_at": None,
                                    "queue": None, "priority": 0, "pause_on_failure": False}


@dataclass
class SyncReport:
    created: list[str]
    updated: list[str]
    paused: list[str]
    unchanged: list[str] = field(default_factory=list)


def sync_schedules(definitions: dict[str, dict] | None = None) -> SyncReport:
    """Make the database match WEFT_SCHEDULES: create each schedule, update in place the ones that differ
    from their entry, leave the others alone, and pause (never delete) the ones that were defined there and
    no longer are. It runs at every start of weft_maintenance: a schedule left alone keeps its next
    occurrence, so one that fell due while no process ran is decided by its own catch-up policy."""
    from django_weft.exceptions import ConfigurationError

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
        try:
            outcome = _sync_one(schedule_id, options)
        except WeftError as exc:
            raise ConfigurationError(f"WEFT_SCHEDULES[{schedule_id!r}]: {exc}") from exc
        getattr(report, outcome).append(schedule_id)
    gone = Schedule.objects.filter(from_settings=True, status=ScheduleStatus.ACTIVE).exclude(
        schedule_id__in=list(definitions))
    for schedule in gone:
        pause(schedule, REMOVED_NOTE)
        report.paused.append(schedule.schedule_id)
    return report


def _sync_one(schedule_id: str, options: dict[str, Any]) -> str:
    """Create, update or leave alone one schedule of WEFT_SCHEDULES; returns which (a SyncReport field)."""
    fields = {**SETTING_DEFAULTS, **options}
    workflow_type = get_workflow(fields.pop("workflow")).name
    with transaction.atomic():
        if not Schedule.objects.filter(schedule_id=schedule_id).exists():
            try:
                created = create_schedule(schedule_id, workflow_type, **fields)
            except ScheduleAlreadyExists:
                pass  # another process starting at the same time created it: compare with its row below
            else:
                Schedule.objects.filter(pk=created.pk).update(from_settings=True)
                return "created"
        existing = Schedule.objects.select_for_update().get(schedule_id=schedule_id)
        if _defined_as(existing, workflow_type, fields):
            return "unchanged"
        Schedule.objects.filter(pk=existing.pk).update(workflow_type=workflow_type, from_settings=True)
        update(existing, **fields)  # reads the row again: what fell due is decided with the new workflow
        if existing.status == ScheduleStatus.PAUSED and existing.note == REMOVED_NOTE:
            resume(existing)
    return "updated"


def _defined_as(schedule: Schedule, workflow_type: str, fields: dict[str, Any]) -> bool:
    """Whether ``schedule`` already is what its WEFT_SCHEDULES entry (``fields``, defaults filled) defines."""
    spec = ScheduleSpec.check(cron=fields.get("cron"), every=fields.get("every"), timezone=fields["timezone"],
                              overlap=fields["overlap"], backfill=fields["backfill"],
                              catchup_window=fields["catchup_window"], jitter=fields["jitter"],
                              start_at=fields["start_at"], end_at=fields["end_at"], queue=fields["queue"],
                              priority=fields["priority"], pause_on_failure=fields["pause_on_failure"])
    removed = schedule.status == ScheduleStatus.PAUSED and schedule.note == REMOVED_NOTE
    return (schedule.from_settings and not removed and schedule.workflow_type == workflow_type
            and ScheduleSpec.of(schedule) == spec and _same_input(schedule, fields["input"]))


def _same_input(schedule: Schedule, wanted: Any) -> bool:
    stored = bytes(schedule.input) if schedule.input is not None else None
    data = encode(wanted, what=f"input of schedule {schedule.schedule_id!r}")
    # Equal values may encode differently (a set's order changes between processes): compare them decoded too.
    return stored == data or (stored is not None and decode(stored) == wanted)


# The model's convenience methods (``schedule.pause()``...) and the state writer's hook for runs a schedule
# started: bound here, so that lower layers never import this module.
def pause_after_failure(run: Workflow, now: datetime) -> None:
    """``run`` (of a schedule) just closed, in this transaction: a schedule with ``pause_on_failure`` pauses when it
    failed or timed out (before the next buffered occurrence would start)."""
    if run.schedule_id is None or run.status not in (RunStatus.FAILED, RunStatus.TIMED_OUT):
        return
    schedule = Schedule.objects.select_for_update().filter(pk=run.schedule_id).first()
    if schedule is None or not schedule.pause_on_failure or schedule.status != ScheduleStatus.ACTIVE:
        return
    schedule.status, schedule.note = ScheduleStatus.PAUSED, f"paused: run {run.pk} {run.status} (pause_on_failure)"
    ScheduleOccurrence.objects.bulk_create([*_drop_due(schedule, now, "schedule paused after a failed run"),
                                            *_drop_queue(schedule, now, "schedule paused after a failed run")])
    set_next(schedule, None)
    schedule.updated_at = now
    schedule.save()


Schedule.operations = sys.modules[__name__]
transitions.on_schedule_run_closed(pause_after_failure)  # first: a paused schedule starts no buffered occurrence
transitions.on_schedule_run_closed(drain_buffer)
