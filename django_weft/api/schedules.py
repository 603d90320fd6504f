"""Routes of schedules: create, list, get, update, pause, resume, trigger, backfill, cancel.

Each calls the operation of :mod:`~.services.schedules` (one transaction on the locked schedule row), so the API
validates, refuses and records exactly as Python callers and the admin do. Permissions are the Schedule model's,
as in the admin: ``view_schedule`` to read, ``add_schedule`` to create, ``change_schedule`` for everything that
changes one, cancel included (the admin cancels with the change permission too; nothing deletes a schedule, whose
runs and history keep pointing at it).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Status
from pydantic import Field

from django_weft.api import pages
from django_weft.api.auth import caller, require
from django_weft.api.errors import ApiError
from django_weft.api.pages import PageQuery
from django_weft.api.schedule_schemas import (
    BackfillIn,
    BackfillOut,
    PauseIn,
    ScheduleIn,
    ScheduleOut,
    SchedulePage,
    ScheduleUpdateIn,
    TriggerOut,
    schedule_out,
)
from django_weft.api.schemas import ERRORS, ScheduleId
from django_weft.common.storable import check_text, unstorable_reason
from django_weft.conf import weft_settings
from django_weft.models import Schedule, ScheduleStatus
from django_weft.services import schedules

router = Router(tags=["schedules"])

class ListQuery(PageQuery):
    status: list[ScheduleStatus] | None = Field(None, description="Repeat for several.")
    workflow: str | None = Field(None, max_length=200)


def _in_settings(schedule_id: str) -> bool:
    # As the admin decides: the next sync rewrites every schedule WEFT_SCHEDULES names (synced or not yet).
    definitions = weft_settings.SCHEDULES
    return isinstance(definitions, dict) and schedule_id in definitions


def _out(schedule: Schedule) -> dict[str, Any]:
    return schedule_out(schedule, in_settings=_in_settings(schedule.schedule_id))


@router.post("schedules", response={201: ScheduleOut, **ERRORS}, summary="Create a schedule")
def create(request: HttpRequest, body: ScheduleIn) -> Status[dict[str, Any]]:
    require(request, "add_schedule")
    schedule = schedules.create_schedule(
        body.schedule_id, body.workflow, body.input, cron=body.cron, every=body.every, timezone=body.timezone,
        overlap=body.overlap, backfill=body.backfill, catchup_window=body.catchup_window, jitter=body.jitter,
        start_at=body.start_at, end_at=body.end_at, queue=body.queue, priority=body.priority,
        pause_on_failure=body.pause_on_failure)
    return Status(201, _out(schedule))


@router.get("schedules", response={200: SchedulePage, **ERRORS}, summary="List schedules by id")
def list_schedules(request: HttpRequest, params: Query[ListQuery]) -> dict[str, Any]:
    require(request, "view_schedule")
    rows = Schedule.objects.order_by("schedule_id")
    if params.status:
        rows = rows.filter(status__in=params.status)
    if params.workflow:
        check_text(params.workflow, "workflow")  # PostgreSQL refuses NUL even in a WHERE (a 500)
        rows = rows.filter(workflow_type=params.workflow)
    if params.cursor:
        after = pages.decode(params.cursor, 1)[0]
        if unstorable_reason(after):
            raise ApiError(422, "invalid_cursor", "cursor is not one this API returned")
        rows = rows.filter(schedule_id__gt=after)
    found, after = pages.page(rows, params.limit, lambda schedule: (schedule.schedule_id,))
    return {"results": [_out(schedule) for schedule in found], "next": after}


@router.get("schedules/{schedule_id}", response={200: ScheduleOut, **ERRORS}, summary="A schedule")
def get(request: HttpRequest, schedule_id: ScheduleId) -> dict[str, Any]:
    require(request, "view_schedule")
    return _out(schedules.get_schedule(schedule_id))


@router.patch("schedules/{schedule_id}", response={200: ScheduleOut, **ERRORS}, summary="Update a schedule")
def update(request: HttpRequest, schedule_id: ScheduleId, body: ScheduleUpdateIn) -> dict[str, Any]:
    require(request, "change_schedule")
    schedule = schedules.get_schedule(schedule_id)
    if _in_settings(schedule_id):
        raise ApiError(409, "schedule_in_settings", f"schedule {schedule_id!r} is defined in WEFT_SCHEDULES; "
                       "change it there (a sync would undo an update made here)")
    # Only what the client sent: an option left out keeps its value, and null clears an optional one.
    schedules.update(schedule, **{name: getattr(body, name) for name in body.model_fields_set})
    return _out(schedule)


@router.post("schedules/{schedule_id}/pause", response={200: ScheduleOut, **ERRORS}, summary="Pause a schedule")
def pause(request: HttpRequest, schedule_id: ScheduleId, body: PauseIn | None = None) -> dict[str, Any]:
    require(request, "change_schedule")
    schedule = schedules.get_schedule(schedule_id)
    note = (body.note if body else "") or f"paused by {caller(request)} through the HTTP API"
    schedules.pause(schedule, note)
    return _out(schedule)


@router.post("schedules/{schedule_id}/resume", response={200: ScheduleOut, **ERRORS}, summary="Resume a schedule")
def resume(request: HttpRequest, schedule_id: ScheduleId) -> dict[str, Any]:
    require(request, "change_schedule")
    schedule = schedules.get_schedule(schedule_id)
    schedules.resume(schedule)
    return _out(schedule)


@router.post("schedules/{schedule_id}/trigger", response={200: TriggerOut, **ERRORS},
             summary="Fire once now, under the overlap policy")
def trigger(request: HttpRequest, schedule_id: ScheduleId) -> dict[str, Any]:
    require(request, "change_schedule")
    run = schedules.trigger(schedules.get_schedule(schedule_id))
    started = None if run is None else {"workflow_id": run.workflow_id, "run_id": run.run_id, "status": run.status}
    return {"schedule_id": schedule_id, "run": started}


@router.post("schedules/{schedule_id}/backfill", response={200: BackfillOut, **ERRORS},
             summary="Start a run for each occurrence in [start, end] that has none")
def backfill(request: HttpRequest, schedule_id: ScheduleId, body: BackfillIn) -> dict[str, Any]:
    require(request, "change_schedule")
    count = schedules.backfill(schedules.get_schedule(schedule_id), body.start, body.end)
    return {"schedule_id": schedule_id, "count": count}


@router.post("schedules/{schedule_id}/cancel", response={200: ScheduleOut, **ERRORS},
             summary="End a schedule for good (its record and history stay)")
def cancel(request: HttpRequest, schedule_id: ScheduleId) -> dict[str, Any]:
    require(request, "change_schedule")
    schedule = schedules.get_schedule(schedule_id)
    schedules.cancel(schedule)
    return _out(schedule)
