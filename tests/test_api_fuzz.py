"""Schemathesis against the API's own OpenAPI document, in process through the WSGI application (werkzeug, which
passes the path as sent on, as gunicorn does): every operation is called with generated requests (valid and
invalid) by a key holding every permission, and every response must be no 500, of a status the document
declares, and of the schema it declares for it.

Then each operation again, each request turned into one the API must refuse or route (design 9.1): a payload
nested deeper than the limit (422 payload_too_deep, or another refusal: never stored), a body field the document
does not name (422 invalid_request naming it), ids and names holding "/" (percent-encoded: they reach their
route, whose answer is JSON; never a "no such route").

Bounded: a few dozen examples per operation, no shrinking of what passes, the waits capped at a fraction of a
second (WEFT_API_MAX_WAIT_SECONDS)."""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import quote

import hypothesis
import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck
from hypothesis import strategies as st
from schemathesis import checks

import django_weft as weft
from django_weft.common.codec import MAX_DEPTH
from django_weft.models import AsyncActivity, Schedule, Signal, Workflow, WorkflowUpdate
from tests.api_helpers import EVERY_PERMISSION, make_key

app = get_wsgi_application()
schema = schemathesis.openapi.from_wsgi("/weft/api/openapi.json", app)

# No 500; only declared statuses, content types and headers; bodies of their declared schema; and a request
# the document calls invalid is refused.
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.response_schema_conformance,
          checks.content_type_conformance, checks.negative_data_rejection, checks.response_headers_conformance]


def test_the_openapi_document_is_valid_and_names_every_route():
    """Valid OpenAPI (schemathesis validates what it loads), every route in it, each declaring its errors."""
    schema.validate()
    paths = set(schema.raw_schema["paths"])
    assert {"/weft/api/runs", "/weft/api/runs/count", "/weft/api/bulk/{operation}", "/weft/api/complete",
            "/weft/api/heartbeat", "/weft/api/runs/{workflow_id}/updates/{name}/{update_id}"} <= paths
    for path, operations in schema.raw_schema["paths"].items():
        for method, operation in operations.items():
            declared = set(operation["responses"])
            assert {"401", "403", "422"} <= declared or path.endswith(("/complete", "/fail")), (method, path)


# Random ids and names mostly meet 404 and unknown_workflow; these, mixed in, reach real runs, schedules and
# handlers: ids with "/" and route words among them.
WORKFLOW_IDS = ["fz-open", "fz-cart", "fz-done", "fz-failed", "fz/open", "count"]
SCHEDULE_IDS = ["fz-nightly", "fz/nightly"]
NAMES = {"name": ["approval", "items", "add_item", "has", "pay/ment"], "operation": ["cancel", "signal", "purge"]}
WORKFLOWS = ["test.approval", "test.collect", "updates.cart"]
SCHEDULES = ("view_schedule", "add_schedule", "change_schedule")


@pytest.fixture
def bearer(transactional_db, settings, weft_env) -> dict[str, str]:
    # Each request is a real one through the WSGI handler, which closes the connection after it: no test
    # transaction can span them, hence transactional_db.
    settings.WEFT_API_MAX_WAIT_SECONDS = 0.05
    weft.start("test.approval", "o", workflow_id="fz-open")
    weft.start("test.approval", "o", workflow_id="fz/open")
    weft.start("test.approval", "o", workflow_id="count")
    weft.start("updates.cart", "c", workflow_id="fz-cart")
    weft.start("test.steps", {"key": "d", "count": 1}, workflow_id="fz-done")
    weft.start("test.uncaught", "f", workflow_id="fz-failed")
    for schedule_id in SCHEDULE_IDS:
        weft.create_schedule(schedule_id, "test.approval", "s", every=3600)
    weft_env.drive()
    return {"Authorization": f"Bearer {make_key(*EVERY_PERMISSION, *SCHEDULES, name='fuzz')}"}


def segment(text: str) -> str:
    """A known id as a client sends it in a path: percent-encoded, a route word with a letter encoded."""
    encoded = quote(text, safe="")
    return f"%{ord(encoded[0]):02X}{encoded[1:]}" if text == "count" else encoded


def is_positive(case: schemathesis.Case) -> bool:
    return case.meta is not None and case.meta.generation.mode == schemathesis.GenerationMode.POSITIVE


def steer(case: schemathesis.Case, data: st.DataObject) -> None:
    """Now and then, a known id, handler name or workflow name in place of a generated one; only in valid
    requests (an invalid one might become valid, and negative_data_rejection would then fail)."""
    if not is_positive(case):
        return
    for key in list(case.path_parameters or {}):
        known = {"workflow_id": WORKFLOW_IDS, "schedule_id": SCHEDULE_IDS}.get(key) or NAMES.get(key)
        if known and data.draw(st.booleans(), label=f"known {key}"):
            case.path_parameters[key] = segment(data.draw(st.sampled_from(known)))
    if isinstance(case.body, dict) and "workflow" in case.body and data.draw(st.booleans(), label="known workflow"):
        case.body["workflow"] = data.draw(st.sampled_from(WORKFLOWS))


@schema.given(data=st.data())
@schema.parametrize()
# derandomize: the same examples every run, so CI does not meet a new generated case at random. (A negative case
# with a JSON null in a query array, which a query string carries as the text "null", a valid string, came up once
# in three random runs and failed negative_data_rejection.)
@hypothesis.settings(max_examples=25, deadline=None, phases=[hypothesis.Phase.generate],
                     suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gives_a_500_or_a_response_the_document_does_not_declare(case, data, bearer):
    steer(case, data)
    case.call_and_validate(headers=bearer, checks=CHECKS)


# --- what the API must refuse or route --------------------------------------------------------------------

# The body fields that hold payloads (any JSON): a deep value goes there.
PAYLOAD_FIELDS = ("input", "payload", "result")
# What each kind of request below was generated how often (printed at the end of the module, for the record).
GENERATED: Counter[str] = Counter()


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def stored() -> tuple[int, ...]:
    """What a payload could have been stored in."""
    return (Workflow.objects.count(), Signal.objects.count(), WorkflowUpdate.objects.count(),
            Schedule.objects.count(), AsyncActivity.objects.exclude(status="pending").count())


def body_fields(case: schemathesis.Case) -> set[str] | None:
    """The fields the document names for the operation's body (None: it takes no body)."""
    operation = schema.raw_schema["paths"][case.path][case.method.lower()]
    content = (operation.get("requestBody") or {}).get("content", {}).get("application/json")
    if content is None:
        return None
    for option in content["schema"].get("anyOf", [content["schema"]]):
        if "$ref" in option:
            return set(schema.raw_schema["components"]["schemas"][option["$ref"].rsplit("/", 1)[1]]["properties"])
    return None


def kinds_for(case: schemathesis.Case) -> list[str]:
    fields = body_fields(case)
    kinds = ["slash"] if case.path_parameters else []
    if fields is not None:
        kinds.append("unknown field")
        if fields & {*PAYLOAD_FIELDS, "args"}:
            kinds.append("deep")
    return kinds


def make_deep(case: schemathesis.Case, data: st.DataObject) -> int:
    depth = data.draw(st.sampled_from([MAX_DEPTH + 1, MAX_DEPTH + 2, 64, 300]), label="depth")
    fields = body_fields(case) or set()
    body = case.body if isinstance(case.body, dict) else {}
    field = data.draw(st.sampled_from(sorted(fields & {*PAYLOAD_FIELDS, "args"})), label="deep field")
    body[field] = [nested(depth)] if field == "args" else nested(depth)
    case.body = body
    return depth


def add_unknown_field(case: schemathesis.Case, data: st.DataObject) -> str:
    known = body_fields(case) or set()
    name = data.draw(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True).filter(lambda n: n not in known),
                     label="unknown field")
    body = case.body if isinstance(case.body, dict) else {}
    body[name] = data.draw(st.sampled_from([1, "x", None, {"a": [1]}]), label="its value")
    case.body = body
    return name


def slash_ids(case: schemathesis.Case, data: st.DataObject) -> None:
    """Each path parameter holding a "/": a known id, or generated text around one, percent-encoded."""
    for key in case.path_parameters or {}:
        if key == "operation":
            continue  # bulk/{operation}: one of a few words
        known = {"workflow_id": WORKFLOW_IDS, "schedule_id": SCHEDULE_IDS}.get(key) or NAMES.get(key) or []
        letters = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
        text = st.builds(lambda a, b: f"{a}/{b}", letters, letters)
        slashed = [k for k in known if "/" in k]
        value = data.draw(st.sampled_from(slashed) | text if slashed else text, label=f"{key} with a slash")
        case.path_parameters[key] = quote(value, safe="")


@schema.given(data=st.data())
@schema.parametrize()
@hypothesis.settings(max_examples=15, deadline=None, phases=[hypothesis.Phase.generate],
                     suppress_health_check=list(HealthCheck), derandomize=True)
def test_deep_payloads_unknown_fields_and_ids_with_a_slash_are_refused_or_routed(case, data, bearer):
    kinds = kinds_for(case)
    if not is_positive(case) or not kinds:
        return
    steer(case, data)
    kind = data.draw(st.sampled_from(kinds), label="kind")
    GENERATED[f"{case.method} {case.path}: {kind}"] += 1
    if kind == "deep":
        before = stored()
        depth = make_deep(case, data)
    elif kind == "unknown field":
        unknown = add_unknown_field(case, data)
    else:
        slash_ids(case, data)
    response = case.call(headers=bearer)
    case.validate_response(response, checks=[checks.not_a_server_error, checks.status_code_conformance,
                                             checks.content_type_conformance, checks.response_schema_conformance])
    body = response.json()
    if kind == "deep":  # refused, for that or for an earlier reason (an unknown workflow, a missing run...)
        assert response.status_code >= 400, (depth, response.status_code, body)
        assert body.get("code") != "payload_too_deep" or f"{MAX_DEPTH} levels" in body["error"]
        assert stored() == before
    elif kind == "unknown field":
        assert response.status_code == 422 and body["code"] == "invalid_request", body
        assert f"{unknown}: unknown field" in body["error"], body
    elif isinstance(body, list):  # the events of a stream (text/event-stream): the route was reached and answered
        assert response.status_code == 200
    else:
        assert body.get("code") != "not_found", body  # the route was reached: its own 404 names what is missing


@pytest.fixture(scope="module", autouse=True)
def report_what_was_generated():
    yield
    if GENERATED:
        print("\nschemathesis, requests made to be refused or routed:")
        for what, count in sorted(GENERATED.items()):
            print(f"  {count:3d}  {what}")
