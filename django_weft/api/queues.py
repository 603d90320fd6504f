"""Routes of flow control: the queues (backlog, admitted, limits, oldest wait), their limits changed at run time,
and workflow types paused and resumed."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import Field

from django_weft.api.auth import require
from django_weft.api.schemas import ERRORS, Body, QueueLimitsIn, QueueName, QueueOut, TypeName
from django_weft.services import queues

router = Router(tags=["queues"])


class QueuePage(Schema):
    items: list[QueueOut]
    paused_types: list[str] = Field(description="Workflow types whose runs are not admitted (weft.pause_type).")


class PauseIn(Body):
    reason: str = Field("", max_length=2000)


class PausedOut(Schema):
    workflow_type: str
    paused: bool
    changed: bool = Field(description="False when it already was as asked.")


@router.get("queues", response={200: QueuePage, **ERRORS},
            summary="Every queue: backlog, admitted, limits, oldest wait")
def list_queues(request: HttpRequest) -> dict[str, Any]:
    require(request, "view_queuestate")
    return {"items": [info.as_dict() for info in queues.list_queues()], "paused_types": queues.paused_types()}


@router.get("queues/{name}", response={200: QueueOut, **ERRORS}, summary="One queue")
def get_queue(request: HttpRequest, name: QueueName) -> dict[str, Any]:
    require(request, "view_queuestate")
    return queues.queue_info(name).as_dict()


@router.put("queues/{name}/limits", response={200: QueueOut, **ERRORS},
            summary="Set a queue's limits at run time (the fields sent override WEFT_QUEUES; null: no such limit; "
                    "an empty body: the setting's again)")
def set_limits(request: HttpRequest, name: QueueName, body: QueueLimitsIn) -> dict[str, Any]:
    require(request, "change_queuestate")
    return queues.set_queue_limits(name, **body.model_dump(exclude_unset=True)).as_dict()


@router.post("types/{workflow_type}/pause", response={200: PausedOut, **ERRORS},
             summary="Stop admitting runs of a workflow type (its admitted runs go on)")
def pause(request: HttpRequest, workflow_type: TypeName, body: PauseIn) -> dict[str, Any]:
    require(request, "add_pausedtype")
    changed = queues.pause_type(workflow_type, body.reason)
    return {"workflow_type": workflow_type, "paused": True, "changed": changed}


@router.post("types/{workflow_type}/resume", response={200: PausedOut, **ERRORS},
             summary="Admit runs of a paused workflow type again")
def resume(request: HttpRequest, workflow_type: TypeName) -> dict[str, Any]:
    require(request, "delete_pausedtype")
    changed = queues.resume_type(workflow_type)
    return {"workflow_type": workflow_type, "paused": False, "changed": changed}
