"""The HTTP API's events (long poll) and streams (server-sent events), with the API's keys and permissions."""

from __future__ import annotations

import pytest

import django_weft as weft
from tests.api_helpers import error_of
from tests.test_events_streams import progress  # noqa: F401  (registers pub.progress)

pytestmark = pytest.mark.django_db


def sse(response) -> list[tuple[str, str, str]]:
    """(id, event, data) of each event of a text/event-stream response (comments and retry lines left out)."""
    text = b"".join(response.streaming_content).decode()
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
                      and ": " in line)
        if "event" in fields:
            found.append((fields.get("id", ""), fields["event"], fields["data"]))
    return found


def test_events_are_read_and_long_polled(api, weft_env):
    handle = weft.start("pub.progress", 2, workflow_id="pub/1")
    weft_env.drive()
    assert api.get("runs/pub%2F1/events/progress").json() == {"key": "progress", "value": {"done": 1, "of": 2}}
    assert error_of(api.get("runs/pub%2F1/events/finished", {"wait": 0.05})) == (408, "timeout")
    weft_env.advance_until_idle()
    assert handle.result() == "ok"
    assert api.get("runs/pub%2F1/events").json() == {"events": {"progress": {"done": 2, "of": 2}, "finished": True}}
    assert error_of(api.get("runs/pub%2F1/events/never")) == (404, "event_not_set")
    assert error_of(api.get("runs/pub%2F1/events/progress", {"wait": 31})) == (422, "invalid_request")


def test_a_stream_is_sent_as_server_sent_events_and_resumes_after_the_last_event_id(api, weft_env):
    handle = weft.start("pub.progress", 3, workflow_id="pub-2")
    weft_env.advance_until_idle()
    assert handle.result() == "ok"
    response = api.get("runs/pub-2/streams/log")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert sse(response) == [("0", "value", '"step 1"'), ("1", "value", '"step 2"'), ("2", "value", '"step 3"'),
                             ("", "end", '{"next": 3}')]
    resumed = api.get("runs/pub-2/streams/log", **{"Last-Event-ID": "1"})
    assert sse(resumed) == [("2", "value", '"step 3"'), ("", "end", '{"next": 3}')]
    assert sse(api.get("runs/pub-2/streams/log", {"start": 3})) == [("", "end", '{"next": 3}')]
    assert error_of(api.get("runs/pub-2/streams/log", **{"Last-Event-ID": "x"})) == (400, "bad_request")
    assert error_of(api.get("runs/nope/streams/log")) == (404, "workflow_not_found")


def test_reading_events_and_streams_needs_the_view_permission(key_with, weft_env):
    weft.start("pub.progress", 1, workflow_id="pub-3")
    weft_env.advance_until_idle()
    nobody = key_with()
    for path in ("runs/pub-3/events", "runs/pub-3/events/progress", "runs/pub-3/streams/log"):
        assert error_of(nobody.get(path)) == (403, "forbidden")
    viewer = key_with("view_workflow")
    assert viewer.get("runs/pub-3/events/progress").status_code == 200
    assert viewer.get("runs/pub-3/streams/log").status_code == 200


def test_the_routes_are_in_the_openapi_document(api):
    paths = api.client.get("/weft/api/openapi.json").json()["paths"]
    stream = paths["/weft/api/runs/{workflow_id}/streams/{key}"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    assert {"wait"} <= {p["name"] for p in paths["/weft/api/runs/{workflow_id}/events/{key}"]["get"]["parameters"]}
