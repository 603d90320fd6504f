"""Workflows that handle their cancel (design 9.2): a saga compensates inside ``ctx.cleanup()``; the process
tests cancel them in every state while executors are killed."""

from __future__ import annotations

import time
from datetime import timedelta

import django_weft as weft

from .workflows import mark


@weft.activity(name="cancel.do", heartbeat_timeout=5, retry=weft.RetryPolicy(max_attempts=None, max_backoff=1))
def do(key: str, seconds: float) -> str:
    """A step that takes ``seconds``, beating; it stops when asked (a cancel) and marks what it did."""
    mark(f"{key}:begin")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        weft.heartbeat()
        time.sleep(0.05)
    mark(key)
    return key


@weft.activity(name="cancel.undo", retry=weft.RetryPolicy(max_attempts=None, max_backoff=1))
def undo(key: str) -> str:
    mark(f"undo {key}")
    return key


@weft.workflow(name="cancel.order", cleanup_timeout=timedelta(seconds=60))
def order(ctx: weft.Context, spec: dict) -> str:
    """Hold and charge (each a step that takes a while), sleep, then wait to be shipped; compensate on cancel."""
    key = spec["key"]
    saga = ctx.saga()
    try:
        ctx.run(do, f"{key}:hold", spec.get("step", 0.3))
        saga.add(undo, f"{key}:hold")
        ctx.run(do, f"{key}:charge", spec.get("step", 0.3))
        saga.add(undo, f"{key}:charge")
        ctx.sleep(spec.get("sleep", 0.5))
        ctx.wait_for_signal("shipped")
    except weft.CancelledError:
        with ctx.cleanup():
            saga.compensate()
            if spec.get("cleanup_sleep"):
                ctx.sleep(spec["cleanup_sleep"])  # past its cleanup_timeout: the run is terminated
                ctx.run(undo, f"{key}:never")
        raise
    return "shipped"


@weft.workflow(name="cancel.slow_cleanup", cleanup_timeout=timedelta(seconds=8))
def slow_cleanup(ctx: weft.Context, key: str) -> str:
    try:
        ctx.wait_for_signal("never")
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.run(undo, f"{key}:first")
            ctx.sleep(30)
            ctx.run(undo, f"{key}:never")
        raise
    return "unreachable"


@weft.activity(name="branches.work")
def work(key: str) -> str:
    time.sleep(0.1)
    mark(key)
    return key


def three_steps(ctx: weft.Context, branch: int) -> list:
    return [ctx.run(work, f"b{branch}:{step}") for step in range(3)]


@weft.workflow(name="branches.twenty")
def twenty(ctx: weft.Context) -> int:
    results = ctx.gather(*(ctx.start_branch(three_steps, i) for i in range(20)))
    return sum(len(steps) for steps in results)
