"""Routes that read what a run publishes (design 9.4): its events, as a long poll, and its streams, as server-sent
events (``text/event-stream``) that a client resumes with ``Last-Event-ID``.

Both wait without a transaction (they are exempt from ATOMIC_REQUESTS, see ``urls``) and follow the run's
continue-as-new chain. A stream's response ends when the run closes the stream or its chain ends (an ``end``
event), or after STREAM_SECONDS, when an EventSource reconnects by itself and a client resumes from the last id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Query, Router, Schema
from pydantic import Field

from django_weft.api.auth import require
from django_weft.api.errors import ApiError
from django_weft.api.schemas import ERRORS, ErrorOut, EventKey, StreamKey, WorkflowId, payload, payload_value
from django_weft.common import privacy
from django_weft.conf import weft_settings
from django_weft.services import client, published

router = Router(tags=["runs"])

MAX_WAIT = 30.0
# How long one stream response lasts at most; a keep-alive comment is sent when no value came for KEEPALIVE.
STREAM_SECONDS = 300.0
KEEPALIVE_SECONDS = 15.0


class EventWait(Schema):
    wait: float = Field(0.0, ge=0, le=MAX_WAIT, description=f"Seconds to wait for the key to be set (at most "
                                                           f"{MAX_WAIT:g}); 0 answers at once.")


class EventOut(Schema):
    key: str
    value: Any = None


class EventsOut(Schema):
    events: dict[str, Any]


class StreamQuery(Schema):
    start: int = Field(0, ge=0, description="The index of the first value to send (a Last-Event-ID header, the "
                                            "index of the last value received, resumes after it instead).")


def _seconds(wait: float) -> float:
    return max(0.0, min(wait, MAX_WAIT, float(weft_settings.API_MAX_WAIT_SECONDS)))


@router.get("runs/{workflow_id}/events", url_name="run_events", response={200: EventsOut, **ERRORS},
            summary="Every event the run (and its continue-as-new chain) set, with its latest value")
def list_events(request: HttpRequest, workflow_id: WorkflowId) -> dict[str, Any]:
    require(request, "view_workflow")
    values = client.get_handle(workflow_id).events()
    return {"events": {key: payload_value(value) for key, value in values.items()}}


@router.get("runs/{workflow_id}/events/{key}", url_name="run_event",
            response={200: EventOut, 408: ErrorOut, **ERRORS},
            summary="An event's latest value, waiting up to wait seconds for it to be set (408: not set yet; 404: "
                    "the run ended without setting it)")
def get_event(request: HttpRequest, workflow_id: WorkflowId, key: EventKey, params: Query[EventWait]) -> dict:
    require(request, "view_workflow")
    handle = client.get_handle(workflow_id)
    row = published.find_event(handle.run_id, key, _seconds(params.wait))
    if row is None:
        if published.Chain(handle.run_id).refresh().is_finished:
            raise ApiError(404, "event_not_set", f"run {handle.run_id} of {workflow_id!r} ended without setting "
                                                 f"event {key!r}")
        raise ApiError(408, "timeout", f"event {key!r} of {workflow_id!r} is not set yet")
    return {"key": key, "value": payload(row.value)}


STREAM_DOC = {
    "responses": {200: {"description": "Server-sent events: `event: value` with the value as JSON in `data` and its "
                                       "index as `id`; `event: end` when the stream is closed or the run ended.",
                        "content": {"text/event-stream": {"schema": {
                            "type": "object", "description": "One server-sent event.",
                            "properties": {"event": {"type": "string", "enum": ["value", "end"]},
                                           "data": {"type": "string", "description": "JSON"},
                                           "id": {"type": "string", "description": "The value's index"}}}}}}},
    "parameters": [{"in": "header", "name": "Last-Event-ID", "required": False, "schema": {"type": "string"},
                    "description": "The id of the last value received: the stream resumes after it."}],
}


@router.get("runs/{workflow_id}/streams/{key}", url_name="run_stream", response=ERRORS, openapi_extra=STREAM_DOC,
            summary="A stream's values as server-sent events, as the run writes them, until it closes the stream")
def read_stream(request: HttpRequest, workflow_id: WorkflowId, key: StreamKey,
                params: Query[StreamQuery]) -> StreamingHttpResponse:
    require(request, "view_workflow")
    start = params.start
    resumed = request.headers.get("Last-Event-ID", "").strip()
    if resumed:
        if not resumed.isdigit():
            raise ApiError(400, "bad_request", f"Last-Event-ID must be the index of a value, got {resumed[:40]!r}")
        start = int(resumed) + 1
    handle = client.get_handle(workflow_id)
    published.Chain(handle.run_id)  # 404 now, not inside the stream
    # The events are sent after this view returns: they carry what this caller may see with them.
    events = _events(handle.run_id, key, start, privacy.visible())
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response


def _events(run_id: Any, key: str, start: int, visible: bool) -> Iterator[str]:
    with privacy.payloads(visible):
        yield from _events_shown(run_id, key, start)


def _events_shown(run_id: Any, key: str, start: int) -> Iterator[str]:
    ends_at = time.monotonic() + STREAM_SECONDS
    yield f"retry: 1000\n: stream {key} from {start}\n\n"
    while time.monotonic() < ends_at:
        try:
            for index, value in published.read_stream_entries(run_id, key, start, timeout=KEEPALIVE_SECONDS):
                data = json.dumps(payload_value(value), separators=(",", ":"))
                yield f"id: {index}\nevent: value\ndata: {data}\n\n"
                start = index + 1
                if time.monotonic() >= ends_at:
                    return  # the client reconnects and resumes from the last id
        except TimeoutError:
            yield ": keep-alive\n\n"
            continue
        yield f'event: end\ndata: {{"next": {start}}}\n\n'
        return
