"""One nesting limit for every payload (common.codec.MAX_DEPTH): refused at every entrance of the Python API,
the admin's forms, the webhooks and the commands, with PayloadTooDeep (an InvalidArgument) and nothing written;
and what was stored deeper before the limit existed still renders in the admin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

import django_weft as weft
from django_weft.common.codec import MAX_DEPTH, decode, encode
from django_weft.models import ActivityHeartbeat, AsyncActivity, Schedule, Signal, Workflow, WorkflowUpdate
from django_weft.testing import WeftTestEnv

pytestmark = pytest.mark.django_db


def nested(depth: int, leaf: Any = "leaf") -> Any:
    """``leaf`` inside ``depth`` lists."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_json(depth: int) -> str:
    """JSON text of a list nested ``depth`` deep, whatever Python's JSON encoder could write."""
    return "[" * depth + '"leaf"' + "]" * depth


def msgpack_nested(depth: int) -> bytes:
    """The msgpack encoding of ``nested(depth, "x")``, as a payload stored before the limit existed holds it."""
    return b"\x91" * depth + b"\xa1x"


def nested_in(kind: str, depth: int) -> Any:
    """A value ``depth`` deep made of one kind of container (``mixed``: all of them, a frozenset as a dict key)."""
    value: Any = 1
    for level in range(depth):
        if kind == "list":
            value = [value]
        elif kind == "dict":
            value = {"k": value}
        elif kind == "tuple":
            value = (value,)
        elif kind == "frozenset":
            value = frozenset([value])
        else:
            value = [({frozenset([level]): value} if level % 2 else (value,))] if level < depth - 1 else [value]
    return value


executions: list[int] = []


@weft.activity(retry=weft.RetryPolicy(max_attempts=3))
def deep_value(depth: int) -> Any:
    executions.append(depth)
    return nested(depth)


@weft.workflow(name="nesting.activity")
def activity_result(ctx: weft.Context, depth: int) -> str:
    ctx.run(deep_value, depth)
    return "stored"


@weft.workflow(name="nesting.result")
def workflow_result(ctx: weft.Context, depth: int) -> Any:
    return nested(depth)


@pytest.mark.parametrize("kind", ["list", "dict", "tuple", "frozenset"])
def test_the_limit_is_exact_for_every_kind_of_container(kind):
    assert decode(encode(nested_in(kind, MAX_DEPTH))) == nested_in(kind, MAX_DEPTH)
    with pytest.raises(weft.PayloadTooDeep, match=f"nested more than {MAX_DEPTH} levels"):
        encode(nested_in(kind, MAX_DEPTH + 1))


def test_a_frozenset_key_counts_as_a_level():
    at_limit = nested(MAX_DEPTH - 2, leaf={frozenset([1]): "v"})  # the key's members sit MAX_DEPTH deep
    assert decode(encode(at_limit)) == at_limit
    with pytest.raises(weft.PayloadTooDeep):
        encode(nested(MAX_DEPTH - 2, leaf={frozenset([(1,)]): "v"}))


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 600, 5000])
def test_too_deep_is_an_invalid_argument_naming_the_limit(depth):
    with pytest.raises(weft.InvalidArgument, match=f"input of workflow 'test.approval' is nested more than "
                                                   f"{MAX_DEPTH} levels") as refused:
        weft.start("test.approval", nested(depth))
    assert isinstance(refused.value, weft.PayloadTooDeep) and isinstance(refused.value, weft.PayloadError)
    assert not Workflow.objects.exists()


def test_a_value_that_contains_itself_is_too_deep():
    looped: list = []
    looped.append(looped)
    with pytest.raises(weft.PayloadTooDeep):
        weft.start("test.approval", looped)


def test_every_entrance_of_the_python_api_refuses_it_and_writes_nothing(weft_env):
    too_deep = nested(MAX_DEPTH + 1)
    handle = weft.start("test.approval", "k", workflow_id="open")
    cart = weft.start("updates.cart", "u", workflow_id="cart")
    waiting = weft.start("test.async", "a")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=waiting.run_id).token
    schedule = weft.create_schedule("nightly", "test.approval", "k", every=60)
    refusals = [
        lambda: weft.signal("open", "approval", too_deep),
        lambda: handle.signal("approval", too_deep),
        lambda: weft.start_or_signal("test.collect", 1, signal="item", payload=too_deep, workflow_id="sos",
                                       signal_id="s1"),
        lambda: weft.start_or_signal("test.collect", too_deep, signal="item", workflow_id="sos", signal_id="s1"),
        lambda: cart.start_update("add_item", too_deep),
        lambda: weft.complete_async_activity(token, too_deep),
        lambda: weft.heartbeat_async(token, too_deep),
        lambda: weft.create_schedule("other", "test.approval", too_deep, every=60),
        lambda: schedule.update(input=too_deep),
        lambda: cart.query("items", too_deep),
    ]
    for refusal in refusals:
        with pytest.raises(weft.PayloadTooDeep):
            refusal()
    assert not Signal.objects.exists() and not WorkflowUpdate.objects.exists()
    assert set(Workflow.objects.values_list("workflow_id", flat=True)) == {"open", "cart", waiting.workflow_id}
    assert AsyncActivity.objects.get(token=token).status == "pending"
    assert not ActivityHeartbeat.objects.exists()
    assert list(Schedule.objects.values_list("schedule_id", flat=True)) == ["nightly"]
    assert decode(Schedule.objects.get().input) == "k"


def test_an_activity_result_too_deep_fails_the_step_without_retrying(weft_env):
    executions.clear()
    handle = weft.start("nesting.activity", MAX_DEPTH + 1)
    weft_env.advance_until_idle()
    run = handle.refresh()
    assert run.status == "failed" and f"nested more than {MAX_DEPTH} levels" in run.error["message"]
    assert executions == [MAX_DEPTH + 1]
    fine = weft.start("nesting.activity", MAX_DEPTH)
    weft_env.drive()
    assert fine.result(timeout=0) == "stored"


def test_a_workflow_result_too_deep_fails_the_run(weft_env):
    handle = weft.start("nesting.result", MAX_DEPTH + 1)
    weft_env.drive()
    run = handle.refresh()
    assert run.status == "failed" and f"nested more than {MAX_DEPTH} levels" in run.error["message"]
    assert run.result is None


def stored_deep(env: WeftTestEnv, depth: int, workflow_id: str = "deep") -> weft.WorkflowHandle:
    """A completed run whose input and result are nested ``depth`` deep, as stored before the limit existed."""
    handle = weft.start("test.steps", {"key": workflow_id, "count": 1}, workflow_id=workflow_id)
    env.drive()
    assert handle.status == "completed"
    Workflow.objects.filter(pk=handle.run_id).update(input=msgpack_nested(depth), result=msgpack_nested(depth))
    return handle


# --- the admin ------------------------------------------------------------------------------------------


def run_url(run_id: Any, action: str = "") -> str:
    if action:
        return reverse(f"admin:django_weft_workflow_{action}", args=[run_id])
    return reverse("admin:django_weft_workflow_change", args=[run_id])


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 900, 5000])
def test_the_admin_signal_form_refuses_it_naming_the_limit(staff_client, weft_env, depth):
    handle = weft.start("test.collect", 1)
    weft_env.drive()
    page = staff_client.post(run_url(handle.run_id, "signal"), {"name": "item", "payload": deep_json(depth)})
    assert page.status_code == 200
    assert f"at most {MAX_DEPTH} levels" in " ".join(page.context["form"].errors["payload"])
    assert not Signal.objects.exists()


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 600, 1000])
def test_the_admin_renders_payloads_stored_deeper_than_the_limit(staff_client, weft_env, depth):
    handle = stored_deep(weft_env, depth)
    page = staff_client.get(run_url(handle.run_id))
    assert page.status_code == 200
    assert f"nested deeper than {MAX_DEPTH} levels: not shown" in page.content.decode()
    assert staff_client.get(reverse("admin:django_weft_workflow_changelist")).status_code == 200


def test_the_admin_query_panel_refuses_arguments_too_deep(staff_client, weft_env):
    handle = weft.start("queries.cart", "ann")
    weft_env.drive()
    for args in (json.dumps([nested(MAX_DEPTH + 1)]), deep_json(4000)):
        page = staff_client.get(run_url(handle.run_id), {"weft_query": "has", "weft_args": args})
        assert page.status_code == 200
        asked = page.context["weft_talk"]["asked"]
        assert f"{MAX_DEPTH} levels" in asked["error"]


# --- the webhooks and the commands ----------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 5000])
@pytest.mark.parametrize(("view", "field"), [("complete", "result"), ("heartbeat", "details")])
def test_the_webhooks_answer_422_naming_the_limit(client, weft_env, depth, view, field):
    handle = weft.start("test.async", "hook")
    weft_env.drive()
    token = AsyncActivity.objects.get(run_id=handle.run_id).token
    body = f'{{"token": {json.dumps(token)}, "{field}": {deep_json(depth)}}}'
    response = client.post(reverse(f"django_weft:{view}"), body, content_type="application/json")
    assert response.status_code == 422 and f"{MAX_DEPTH} levels" in response.json()["error"]
    assert AsyncActivity.objects.get(token=token).status == "pending" and not ActivityHeartbeat.objects.exists()


def test_the_signal_command_refuses_it(weft_env):
    weft.start("test.approval", "k", workflow_id="cli")
    for text in (json.dumps(nested(MAX_DEPTH + 1)), deep_json(5000)):
        with pytest.raises(CommandError, match=f"{MAX_DEPTH} levels"):
            call_command("weft_signal", "cli", "approval", "--payload", text)
    assert not Signal.objects.exists()
