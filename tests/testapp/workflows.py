"""Workflows and activities the test suite drives."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import django_weft as weft

from .models import Execution


def mark(key: str) -> None:
    Execution.objects.create(key=key, pid=os.getpid())


def executions(key: str) -> int:
    return Execution.objects.filter(key=key).count()


@weft.activity
def record(key: str) -> str:
    mark(key)
    return key.upper()


class Flaky(Exception):
    pass


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=1, backoff_multiplier=2))
def flaky(spec: dict) -> str:
    """Fails the first ``spec['failures']`` times it runs for ``spec['key']``."""
    mark(spec["key"])
    if executions(spec["key"]) <= spec["failures"]:
        raise Flaky(f"failure {executions(spec['key'])} of {spec['key']}")
    return "ok"


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, non_retryable=(ValueError,)))
def refuses(key: str) -> None:
    mark(key)
    raise ValueError(f"bad value for {key}")


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=5), timeout=0.3)
def too_slow(key: str) -> str:
    mark(key)
    time.sleep(2)
    return "late"


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def unencodable(key: str) -> object:
    return object()


# Attempts lost with a killed process count (design 9.1): room for the takeovers the crash tests cause.
@weft.activity(retry=weft.RetryPolicy(max_attempts=5))
def wait_for_file(spec: dict) -> str:
    """Marks that it started, then blocks until ``spec['path']`` exists (a test kills us meanwhile)."""
    mark(spec["key"] + ":start")
    deadline = time.monotonic() + spec.get("max_wait", 60)
    while not Path(spec["path"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    mark(spec["key"] + ":end")
    return "released"


@weft.workflow(name="test.steps")
def steps(ctx: weft.Context, spec: dict) -> list[str]:
    """``spec['count']`` recorded activities; ``spec['sleep']`` seconds of durable sleep in the middle."""
    results = []
    for i in range(spec["count"]):
        results.append(ctx.run(record, f"{spec['key']}:{i}"))
        if spec.get("sleep") and i == spec["count"] // 2 - 1:
            ctx.sleep(timedelta(seconds=spec["sleep"]))
    return results


@weft.workflow(name="test.retry")
def retrying(ctx: weft.Context, spec: dict) -> str:
    return ctx.run(flaky, spec)


@weft.workflow(name="test.non_retryable")
def non_retryable(ctx: weft.Context, key: str) -> str:
    try:
        ctx.run(refuses, key)
    except weft.ActivityError as exc:
        return f"compensated: {exc.error_type}"
    return "unreachable"


@weft.workflow(name="test.uncaught")
def uncaught(ctx: weft.Context, key: str) -> None:
    ctx.run(refuses, key)


@weft.workflow(name="test.timeout")
def timing_out(ctx: weft.Context, key: str) -> str:
    return ctx.run(too_slow, key)


@weft.workflow(name="test.unencodable")
def unencodable_result(ctx: weft.Context, key: str) -> object:
    return ctx.run(unencodable, key)


def _count_side_effect() -> int:
    mark("side")
    return executions("side")


@weft.workflow(name="test.values")
def values(ctx: weft.Context) -> dict:
    first = {"now": ctx.now(), "uuid": ctx.uuid4(), "random": ctx.random(),
             "side": ctx.side_effect(_count_side_effect)}
    ctx.sleep(10)
    return first


@weft.workflow(name="test.crash")
def crash(ctx: weft.Context, spec: dict) -> str:
    ctx.run(record, spec["key"] + ":before")
    released = ctx.run(wait_for_file, spec)
    ctx.run(record, spec["key"] + ":after")
    return released


@weft.workflow(name="test.long_sleep")
def long_sleep(ctx: weft.Context) -> str:
    ctx.sleep(timedelta(days=2))
    return "woke"


DYNAMIC = {"shape": "a"}


@weft.workflow(name="test.changing")
def changing(ctx: weft.Context, key: str) -> str:
    """Its first step depends on a module global, so a test can 'deploy' different code mid-run."""
    if DYNAMIC["shape"] == "a":
        ctx.run(record, key)
    else:
        ctx.sleep(1)
    ctx.sleep(60)
    return "done"


@weft.activity
def cancel_own_run(key: str) -> str:
    """Cancels the run that is executing it, as an operator would from the admin mid-step."""
    mark(key)
    weft.cancel(key, reason="operator cancelled mid-step")
    return "finished after cancel"


@weft.activity
def terminate_own_run(key: str) -> str:
    """Terminates the run that is executing it, as an operator would from the admin mid-step."""
    mark(key)
    weft.terminate(key, reason="operator terminated mid-step")
    return "finished after terminate"


@weft.workflow(name="test.terminated_mid_step")
def terminated_mid_step(ctx: weft.Context, key: str) -> str:
    ctx.run(record, key + ":first")
    ctx.run(terminate_own_run, key)
    ctx.run(record, key + ":never")
    return "unreachable"


@weft.workflow(name="test.cancelled_mid_step")
def cancelled_mid_step(ctx: weft.Context, key: str) -> str:
    ctx.run(record, key + ":first")
    ctx.run(cancel_own_run, key)
    ctx.run(record, key + ":never")
    return "unreachable"


@weft.activity
def slow(spec: dict) -> str:
    mark(spec["key"])
    time.sleep(spec["seconds"])
    return "slept"


@weft.workflow(name="test.slow")
def slow_workflow(ctx: weft.Context, spec: dict) -> str:
    return ctx.run(slow, spec)


# --- signals -------------------------------------------------------------------------------------------


@weft.workflow(name="test.approval")
def approval(ctx: weft.Context, key: str) -> object:
    ctx.run(record, key + ":before")
    try:
        decision = ctx.wait_for_signal("approval", timeout=timedelta(days=1))
    except weft.WaitTimeout:
        decision = "timed out"
    ctx.run(record, key + ":after")
    return decision


@weft.workflow(name="test.collect")
def collect(ctx: weft.Context, count: int) -> list:
    return [ctx.wait_for_signal("item") for _ in range(count)]


@weft.workflow(name="test.either")
def either(ctx: weft.Context) -> list:
    return [ctx.wait_for_signal(["a", "b"]), ctx.wait_for_signal(["a", "b"])]


# --- async activities ------------------------------------------------------------------------------------


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=10))
def ask_human(key: str) -> None:
    info = weft.activity_info()
    mark(f"{key}:asked:{info.attempt}")
    weft.complete_async()


@weft.activity(retry=weft.RetryPolicy(max_attempts=3), schedule_to_close_timeout=timedelta(hours=1))
def ask_with_deadline(key: str) -> None:
    mark(f"{key}:asked")
    weft.complete_async()


@weft.workflow(name="test.async")
def async_workflow(ctx: weft.Context, key: str) -> object:
    answer = ctx.run(ask_human, key)
    ctx.run(record, key + ":after")
    return answer


@weft.workflow(name="test.async_deadline")
def async_deadline(ctx: weft.Context, key: str) -> object:
    try:
        return ctx.run(ask_with_deadline, key)
    except weft.ActivityError as exc:
        return f"gave up: {exc}"


# --- child workflows ------------------------------------------------------------------------------------


@weft.workflow(name="test.child")
def child(ctx: weft.Context, spec: dict) -> str:
    mark(f"{spec['key']}:child")
    if spec.get("sleep"):
        ctx.sleep(spec["sleep"])
    if spec.get("fail"):
        raise ValueError(f"child {spec['key']} failed")
    return f"child {spec['key']} done"


@weft.workflow(name="test.parent")
def parent(ctx: weft.Context, spec: dict) -> object:
    try:
        result = ctx.run_child("test.child", spec, parent_close_policy=spec.get("policy", "terminate"))
    except weft.ChildWorkflowFailed as exc:
        result = f"child failed: {exc.status}"
    ctx.run(record, spec["key"] + ":parent-after")
    return result


@weft.workflow(name="test.fire_and_forget")
def fire_and_forget(ctx: weft.Context, spec: dict) -> str:
    handle = ctx.start_child("test.child", spec, parent_close_policy=spec["policy"])
    ctx.sleep(spec.get("parent_sleep", 3600))
    return handle.workflow_id


@weft.activity
def cancel_workflow(workflow_id: str) -> None:
    weft.cancel(workflow_id, reason="cancelled from inside a child step")


@weft.workflow(name="test.child_cancels_parent")
def child_cancels_parent(ctx: weft.Context, spec: dict) -> str:
    ctx.run(cancel_workflow, spec["parent"])
    ctx.run(record, spec["key"] + ":after-cancel")
    ctx.sleep(60)
    ctx.run(record, spec["key"] + ":never")
    return "unreachable"


@weft.workflow(name="test.parent_of_busy_child")
def parent_of_busy_child(ctx: weft.Context, key: str) -> object:
    return ctx.run_child("test.child_cancels_parent", {"parent": ctx.workflow_id, "key": key},
                         parent_close_policy="request_cancel")


@weft.activity
def answered_at_once(key: str) -> None:
    """The outside system answers before complete_async() returns (e.g. a synchronous webhook)."""
    weft.complete_async_activity(weft.activity_info().task_token, f"{key} answered early")
    weft.complete_async()


@weft.workflow(name="test.async_early")
def async_early(ctx: weft.Context, key: str) -> object:
    return ctx.run(answered_at_once, key)


from . import (  # noqa: E402,F401
    attempt_workflows,
    attribute_workflows,
    branch_process_workflows,
    branch_workflows,
    cancel_workflows,
    cleanup_workflows,
    evolving_edge_workflows,
    evolving_workflows,
    exactly_once_workflows,
    fork_workflows,
    hardening_workflows,
    query_workflows,
    queue_workflows,
    schedule_workflows,
    soak_workflows,
    update_process_workflows,
    update_workflows,
    zombie_workflows,
)
