"""Step controls over HTTP (design 9.5): ``POST runs/{workflow_id}/steps/{seq}/{control}`` and ``.../options``,
with the ``retry_workflow`` permission; a control that no longer applies answers 409 with the reason."""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import Field

from django_weft.api.auth import caller, require
from django_weft.api.schemas import ERRORS, Body, WorkflowId
from django_weft.models import Workflow
from django_weft.services import client, step_controls

router = Router(tags=["runs"])

Control = Literal["fire_timer_now", "reset_attempts", "pause_retries", "unpause_retries"]


class RetryIn(Body):
    max_attempts: int | None = Field(None, ge=1)
    initial_backoff: float | None = Field(None, ge=0)
    backoff_multiplier: float | None = Field(None, ge=1)
    max_backoff: float | None = Field(None, ge=0)


class OptionsIn(Body):
    retry: RetryIn | None = Field(None, description="Fields of the retry policy to replace (the others are kept "
                                                    "as the activity declares them).")
    timeout: float | None = Field(None, gt=0, description="Seconds per attempt.")
    schedule_to_close_timeout: float | None = Field(None, gt=0, description="Seconds for the whole activity.")


class ControlOut(Schema):
    done: str
    seq: int


@router.post("runs/{workflow_id}/steps/{seq}/options", response={200: ControlOut, **ERRORS},
             summary="Replace the retry policy or timeouts of the activity waiting at a step (from its next attempt)")
def options(request: HttpRequest, workflow_id: WorkflowId, seq: int, body: OptionsIn) -> dict[str, Any]:
    require(request, "retry_workflow")
    run = Workflow.objects.end_of_chain(client.get_handle(workflow_id).refresh())
    retry = None
    if body.retry is not None:
        given = {k: v for k, v in body.retry.model_dump().items() if v is not None}
        declared = step_controls.declared_retry(run, seq)
        retry = {**{name: getattr(declared, name) for name in step_controls.RETRY_FIELDS}, **given}
    step_controls.set_activity_options(run, seq, retry=retry, timeout=body.timeout,
                                       schedule_to_close_timeout=body.schedule_to_close_timeout,
                                       requested_by=caller(request))
    return {"done": "set_activity_options", "seq": seq}


@router.post("runs/{workflow_id}/steps/{seq}/{control}", response={200: ControlOut, **ERRORS},
             summary="Fire a step's timer or retry backoff now, reset its activity's attempts, pause or unpause its "
                     "retries")
def control(request: HttpRequest, workflow_id: WorkflowId, seq: int, control: Control) -> dict[str, Any]:
    require(request, "retry_workflow")
    run = Workflow.objects.end_of_chain(client.get_handle(workflow_id).refresh())
    step_controls.perform(run, control, seq, requested_by=caller(request))
    return {"done": control, "seq": seq}

