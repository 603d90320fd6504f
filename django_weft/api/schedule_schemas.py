"""Request and response bodies of the schedule routes. Durations (``every``, ``catchup_window``, ``jitter``)
are seconds; moments are ISO 8601 with an offset. The options are :func:`~.schedules.create_schedule`'s,
which validates them: a body that parses but says something impossible (a bad cron, an unknown zone) gets that
function's message with 422."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from django_weft.api.schemas import Body, payload
from django_weft.models import Schedule

Overlap = Literal["skip", "buffer_one", "buffer_all", "cancel_other", "allow_all"]
Seconds = float | None


class ScheduleOptions(Body):
    """What create and update share; on update, each option left out keeps its value. (An option spelt wrong is
    refused, Body, rather than ignored: on PATCH it would look applied.)"""

    input: Any = None
    cron: str | None = Field(None, max_length=255, description="Five fields, or six with seconds first.")
    every: Seconds = Field(None, description="An interval in seconds instead of cron (at least 1).")
    timezone: str | None = Field(None, max_length=64, description="IANA name; default settings.TIME_ZONE.")
    overlap: Overlap = Field("skip", description="What an occurrence does while the previous run is open.")
    backfill: bool = Field(False, description="Run occurrences a late tick missed instead of counting them.")
    catchup_window: Seconds = Field(None, description="With backfill: no missed occurrence older than this.")
    jitter: Seconds = Field(None, description="Delay each occurrence by a deterministic amount below this.")
    start_at: dt.datetime | None = None
    end_at: dt.datetime | None = None
    queue: str | None = Field(None, max_length=100, description="A queue of WEFT_QUEUES its runs start on.")
    priority: int = Field(0, ge=-(2**31 - 1), le=2**31 - 1, description="Their priority on it (lower first).")
    pause_on_failure: bool = Field(False, description="Pause the schedule when one of its runs fails or times out.")


class ScheduleIn(ScheduleOptions):
    schedule_id: str = Field(min_length=1, max_length=200)
    workflow: str = Field(min_length=1, max_length=200, description="The registered workflow name.")


class ScheduleUpdateIn(ScheduleOptions):
    """Only the options sent change; sending ``cron`` or ``every`` replaces the cadence (the other is cleared)."""


class PauseIn(Body):
    note: str = Field("", max_length=2000)


class BackfillIn(Body):
    start: dt.datetime
    end: dt.datetime


class ScheduleOut(Schema):
    schedule_id: str
    workflow: str
    input: Any = None
    cron: str | None
    every: Seconds
    timezone: str
    overlap: str
    backfill: bool
    catchup_window: Seconds
    jitter: Seconds
    start_at: dt.datetime | None
    end_at: dt.datetime | None
    queue: str | None
    priority: int
    pause_on_failure: bool
    status: str
    note: str
    next_fire_at: dt.datetime | None
    last_fire_at: dt.datetime | None
    missed_fire_count: int
    last_missed_fire_at: dt.datetime | None
    queued_runs: int
    current_run_id: uuid.UUID | None
    in_settings: bool = Field(description="Defined in WEFT_SCHEDULES: a sync rewrites it, so PATCH refuses it.")
    created_at: dt.datetime
    updated_at: dt.datetime


class SchedulePage(Schema):
    results: list[ScheduleOut]
    next: str | None = Field(description="The cursor of the next page (pass it as ?cursor=), null on the last.")


class StartedRun(Schema):
    workflow_id: str
    run_id: uuid.UUID
    status: str


class TriggerOut(Schema):
    schedule_id: str
    run: StartedRun | None = Field(description="The run the occurrence started; null when the overlap policy "
                                               "skipped or buffered it.")


class BackfillOut(Schema):
    schedule_id: str
    count: int = Field(description="Runs started: occurrences in the range that had none yet.")


def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def schedule_out(schedule: Schedule, *, in_settings: bool) -> dict[str, Any]:
    return {
        "schedule_id": schedule.schedule_id, "workflow": schedule.workflow_type,
        "input": payload(schedule.input),
        "cron": schedule.cron or None, "every": _seconds(schedule.every), "timezone": schedule.timezone,
        "overlap": schedule.overlap, "backfill": schedule.backfill_missed,
        "catchup_window": _seconds(schedule.catchup_window), "jitter": _seconds(schedule.jitter),
        "start_at": schedule.start_at, "end_at": schedule.end_at, "status": schedule.status, "note": schedule.note,
        "queue": schedule.queue or None, "priority": schedule.priority, "pause_on_failure": schedule.pause_on_failure,
        "next_fire_at": schedule.next_fire_at, "last_fire_at": schedule.last_fire_at,
        "missed_fire_count": schedule.missed_fire_count, "last_missed_fire_at": schedule.last_missed_fire_at,
        "queued_runs": schedule.queued_runs, "current_run_id": schedule.current_run_id,
        "in_settings": in_settings, "created_at": schedule.created_at, "updated_at": schedule.updated_at,
    }
