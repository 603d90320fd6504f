"""``POST complete``, ``POST fail`` and ``POST heartbeat``: the async-activity webhooks of ``django_weft.urls``
in the API, with its error format. The task token is the only credential (signed; single use for a
resolution), so no API key or session is asked for, and no CSRF token (``auth=None``). Both doors share
:func:`django_weft.views.resolve` and :func:`django_weft.views.beat`.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import Field

from django_weft.api.errors import ApiError
from django_weft.api.schemas import ERRORS, Body
from django_weft.views import Refused, beat, resolve

router = Router(tags=["async activities"])

TOKEN = Field(min_length=1, max_length=4096, description="The task token the activity was given.")


class CompleteIn(Body):
    token: str = TOKEN
    result: Any = None


class ErrorIn(Body):
    message: str = Field(min_length=1, max_length=4000)
    type: str | None = Field(None, min_length=1, max_length=4000, description="Default: AsyncActivityFailed.")


class FailIn(Body):
    token: str = TOKEN
    error: str | ErrorIn = Field(description='A message, or {"message": ..., "type": ...}.')


class HeartbeatIn(Body):
    token: str = TOKEN
    details: Any = Field(None, description="Progress for the step's next attempt (its heartbeat_details); "
                                           "null keeps what was stored.")


class DoneOut(Schema):
    ok: bool


class HeartbeatOut(Schema):
    cancelled: bool = Field(description="The attempt was cancelled (or its run closed): stop working on it.")


def _resolved(field: str, token: str, value: Any) -> dict[str, Any]:
    try:
        resolve(field, token, value)
    except Refused as refused:
        raise ApiError(refused.status, refused.code, str(refused)) from None
    return {"ok": True}


@router.post("complete", auth=None, response={200: DoneOut, **ERRORS}, summary="Complete an async activity")
def complete(request: HttpRequest, body: CompleteIn) -> dict[str, Any]:
    return _resolved("result", body.token, body.result)


@router.post("fail", auth=None, response={200: DoneOut, **ERRORS}, summary="Fail an async activity")
def fail(request: HttpRequest, body: FailIn) -> dict[str, Any]:
    error = body.error if isinstance(body.error, str) else body.error.model_dump(exclude_none=True)
    return _resolved("error", body.token, error)


@router.post("heartbeat", auth=None, response={200: HeartbeatOut, **ERRORS}, summary="Heartbeat an async activity",
             description="Renews the activity's heartbeat_timeout and stores its details; 409 once the attempt "
                         "completed, failed or timed out.")
def heartbeat(request: HttpRequest, body: HeartbeatIn) -> dict[str, Any]:
    try:
        cancelled = beat(body.token, body.details)
    except Refused as refused:
        raise ApiError(refused.status, refused.code, str(refused)) from None
    return {"cancelled": cancelled}
