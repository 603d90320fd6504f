"""Work in flight (design 9.5): the activity attempts of a run that have not settled, for
``handle.pending_activities()``, the admin's run page, the API and ``weft_runs show``.

Four kinds, from what the engine already keeps: an attempt executing (published by its executor once it has run
for a second, runtime.in_flight), an async attempt waiting for its completion, a step waiting out a retry backoff,
and an attempt waiting for a slot of a limited activity. Each carries its last heartbeat (time and details) where
there is one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django_weft.common import clock
from django_weft.common.codec import decode
from django_weft.conf import weft_settings
from django_weft.models import (
    ActivityHeartbeat,
    ActivitySlot,
    ActivitySlotState,
    AsyncActivity,
    AsyncStatus,
    AttemptInFlight,
    Executor,
    StepControl,
    StepKind,
    StepStatus,
    Timer,
    TimerPurpose,
    Workflow,
    WorkflowStep,
)
from django_weft.runtime.activities import definitions_by_name

RUNNING = "running"
WAITING_FOR_COMPLETION = "waiting_for_completion"
WAITING_FOR_RETRY = "waiting_for_retry"
WAITING_FOR_SLOT = "waiting_for_slot"
SLOT_GRANTED = "slot_granted"  # a limited activity's slot was granted: the attempt begins when its run resumes
RETRIES_PAUSED = "retries_paused"  # waiting to retry, and an operator paused its retries
# An executor process whose heartbeat row is older than this many WEFT_HEARTBEAT_SECONDS is reported silent.
SILENT_BEATS = 2


@dataclass(frozen=True)
class PendingActivity:
    """One activity attempt of a run that has not settled."""

    seq: int
    activity: str
    attempt: int  # the attempt running or waiting (for a retry: the one that will begin)
    state: str  # running, waiting_for_completion, waiting_for_retry, retries_paused, waiting_for_slot, slot_granted
    started_at: datetime | None  # when this attempt began (a retry: when the failed one began)
    executor: str = ""
    timeout_at: datetime | None = None
    next_retry_at: datetime | None = None
    last_error: dict | None = None
    last_heartbeat_at: datetime | None = None
    heartbeat_details: Any = None
    # Running attempts: when their executor process last renewed its heartbeat row, and whether that is over two
    # beats ago (killed or stalled: the run is taken over once its lease runs out). None: no row to tell.
    executor_last_seen: datetime | None = None
    executor_silent: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pending_activities(run: Workflow) -> list[PendingActivity]:
    """The run's activity attempts in flight, by step. A finished run has none."""
    if run.is_finished:
        return []
    timers = {t.seq: t for t in Timer.objects.filter(run=run, fired_at__isnull=True,
                                                    purpose__in=[TimerPurpose.RETRY_BACKOFF,
                                                                 TimerPurpose.ACTIVITY_TIMEOUT])}
    running = list(AttemptInFlight.objects.filter(run=run))
    waiting = list(AsyncActivity.objects.filter(run=run, status=AsyncStatus.PENDING))
    # Granted ones too: their attempts begin when the run resumes.
    slots = list(ActivitySlot.objects.filter(run=run, state__in=(ActivitySlotState.WAITING, ActivitySlotState.GRANTED)))
    candidates: set[int] = {int(seq) for seq in timers if seq is not None}
    candidates |= {r.seq for r in running} | {r.seq for r in waiting} | {r.seq for r in slots}
    if not candidates:
        return []  # the common case: a query per source, none of the journal
    steps = {row.seq: row for row in WorkflowStep.objects.filter(
        run=run, seq__in=candidates, kind__in=[StepKind.ACTIVITY, StepKind.TRANSACTION]).only(
        "seq", "name", "status", "attempt", "error", "started_at")}
    settled = {seq for seq, row in steps.items() if row.status != StepStatus.WAITING}
    beats = {b.seq: b for b in ActivityHeartbeat.objects.filter(run=run, seq__in=candidates)}
    paused = set(StepControl.objects.filter(run=run, retries_paused=True).values_list("seq", flat=True)
                 ) if run.has_step_controls else set()
    found: dict[int, PendingActivity] = {}
    for row in running:
        step = steps.get(row.seq)
        if row.seq in settled or (step is not None and step.attempt > row.attempt):
            continue  # it settled, or a later attempt replaced it, since it was published
        found[row.seq] = _heartbeat_deadline(_with_beat(PendingActivity(
            seq=row.seq, activity=row.activity, attempt=row.attempt, state=RUNNING, started_at=row.started_at,
            executor=row.executor, timeout_at=row.timeout_at), beats.get(row.seq)))
    for record in waiting:
        if record.seq in settled or record.seq in found:
            continue
        timer = timers.get(record.seq)
        found[record.seq] = _with_beat(PendingActivity(
            seq=record.seq, activity=record.activity, attempt=record.attempt, state=WAITING_FOR_COMPLETION,
            started_at=record.created_at,
            timeout_at=timer.fire_at if timer and timer.purpose == TimerPurpose.ACTIVITY_TIMEOUT else None,
        ), beats.get(record.seq))
    for seq, step in steps.items():
        timer = timers.get(seq)
        if seq in found or step.status != StepStatus.WAITING or timer is None or \
                timer.purpose != TimerPurpose.RETRY_BACKOFF:
            continue
        found[seq] = _with_beat(PendingActivity(
            seq=seq, activity=step.name, attempt=step.attempt + 1,
            state=RETRIES_PAUSED if seq in paused else WAITING_FOR_RETRY,
            started_at=step.started_at, next_retry_at=timer.fire_at, last_error=step.error), beats.get(seq))
    for slot in slots:
        if slot.seq in found or slot.seq in settled:
            continue
        step = steps.get(slot.seq)
        found[slot.seq] = PendingActivity(
            seq=slot.seq, activity=slot.activity, attempt=(step.attempt + 1) if step else 1,
            state=SLOT_GRANTED if slot.state == ActivitySlotState.GRANTED else WAITING_FOR_SLOT, started_at=None,
            last_error=step.error if step else None)
    return _with_executors([found[seq] for seq in sorted(found)])


def _process_of(executor: str) -> tuple[str, int] | None:
    """(host, pid) of an executor id "host:pid:thread" (services.maintenance.default_owner)."""
    host, _, pid = executor.rpartition(":")[0].rpartition(":")
    return (host, int(pid)) if host and pid.isdigit() else None


def _with_executors(items: list[PendingActivity]) -> list[PendingActivity]:
    """Running attempts with their executor process's last heartbeat (one query, only if one is running)."""
    processes = {item.executor: _process_of(item.executor) for item in items if item.state == RUNNING}
    known = {p for p in processes.values() if p is not None}
    if not known:
        return items
    rows = Executor.objects.filter(host__in={h for h, _ in known}, pid__in={p for _, p in known}).values_list(
        "host", "pid", "last_seen")
    seen = {(host, pid): last for host, pid, last in rows}
    silent_before = clock.now() - timedelta(seconds=SILENT_BEATS * weft_settings.HEARTBEAT_SECONDS)
    out = []
    for item in items:
        last = seen.get(processes.get(item.executor) or ("", -1))
        if item.state == RUNNING and last is not None:
            item = replace(item, executor_last_seen=last, executor_silent=last < silent_before)
        out.append(item)
    return out


def _heartbeat_deadline(item: PendingActivity) -> PendingActivity:
    """A running attempt of an activity with a ``heartbeat_timeout`` fails when it is silent that long: its
    ``timeout_at`` is the earlier of that moment (from its last beat of this attempt, or its start) and its own."""
    definition = definitions_by_name().get(item.activity)
    if definition is None or definition.heartbeat_timeout is None or item.started_at is None:
        return item
    since = max(item.started_at, item.last_heartbeat_at or item.started_at)
    silent_at = since + timedelta(seconds=definition.heartbeat_timeout)
    return item if item.timeout_at is not None and item.timeout_at <= silent_at else replace(item, timeout_at=silent_at)


def _with_beat(item: PendingActivity, beat: ActivityHeartbeat | None) -> PendingActivity:
    if beat is None or beat.attempt > item.attempt:
        return item
    details = None if beat.details is None else decode(beat.details)
    return PendingActivity(**{**asdict(item), "last_heartbeat_at": beat.beat_at, "heartbeat_details": details})
