"""Workflows for the attempt-history tests (issue 29, item 3): an activity that is killed while it runs counts
as a lost attempt, and the one after it knows its number."""

from __future__ import annotations

import time
from pathlib import Path

import django_weft as weft

from .workflows import mark, record


def _wait_for_release(spec: dict, label: str) -> str:
    """Marks ``<label>:attempt:<n>`` when it begins, then blocks until ``spec['path']`` exists."""
    attempt = weft.activity_info().attempt
    mark(f"{label}:attempt:{attempt}")
    deadline = time.monotonic() + spec.get("max_wait", 60)
    while not Path(spec["path"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"{label} released at attempt {attempt}"


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff=0.1))
def held_step(spec: dict) -> str:
    return _wait_for_release(spec, spec["key"])


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def held_once(spec: dict) -> str:
    return _wait_for_release(spec, spec["key"])


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, initial_backoff=0.1))
def held_branch(spec: dict, index: int) -> str:
    return _wait_for_release(spec, f"{spec['key']}:{index}")


@weft.workflow(name="attempts.held")
def held(ctx: weft.Context, spec: dict) -> str:
    ctx.run(record, f"{spec['key']}:before")
    return ctx.run(held_step, spec)


@weft.workflow(name="attempts.held_once")
def held_once_workflow(ctx: weft.Context, spec: dict) -> object:
    try:
        return ctx.run(held_once, spec)
    except weft.ActivityError as exc:
        return {"error_type": exc.error_type, "attempts": exc.attempts}


@weft.workflow(name="attempts.held_branches")
def held_branches(ctx: weft.Context, spec: dict) -> list:
    return ctx.gather(*(ctx.start_activity(held_branch, spec, i) for i in range(spec["branches"])))
