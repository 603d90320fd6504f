"""Workflows for tests/test_search_attributes.py: ``ctx.set_search_attributes`` recorded, replayed, crashed
around, carried over by continue_as_new, refused in handlers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import django_weft as weft

from .hardening_workflows import Crash
from .workflows import executions, mark


@weft.activity
def step(key: str) -> str:
    mark(key)
    return key


@weft.activity
def crash_once(key: str) -> str:
    """Dies (the executor's process, as far as the engine knows) the first time it runs."""
    mark(key)
    if executions(key) == 1:
        raise Crash()
    return key


@weft.workflow(name="attrs.set")
def set_then_wait(ctx: weft.Context, values: list) -> str:
    """Sets each dict of ``values`` in turn (a step each), then waits for a signal."""
    for batch in values:
        ctx.set_search_attributes(**batch)
    ctx.set_query_handler("applied", lambda: len(values))  # registered once the sets are passed
    ctx.wait_for_signal("go")
    return "done"


@weft.workflow(name="attrs.then_crash")
def set_then_crash(ctx: weft.Context, key: str) -> str:
    ctx.set_search_attributes(region="eu", labels=["new"])
    ctx.run(crash_once, key)
    ctx.set_search_attributes(labels=["new", "paid"])
    return ctx.run(step, f"{key}:after")


@weft.workflow(name="attrs.refused")
def refused(ctx: weft.Context, values: dict) -> str:
    """Sets ``values``, which are wrong: the InvalidArgument is the code's to catch."""
    try:
        ctx.set_search_attributes(**values)
    except weft.InvalidArgument as exc:
        ctx.set_search_attributes(note="after the refusal")
        return str(exc)
    return "accepted"


DUE = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@weft.workflow(name="attrs.generations")
def generations(ctx: weft.Context, n: int) -> int:
    if n == 0:
        ctx.set_search_attributes(region="eu", amount="12.50", due=DUE)
    if n < 2:
        ctx.continue_as_new(n + 1)
    ctx.wait_for_signal("go")
    return n


@weft.workflow(name="attrs.in_handler")
def in_handler(ctx: weft.Context) -> str:
    def tag(region: str) -> None:
        ctx.set_search_attributes(region=region)

    ctx.set_update_handler("tag", tag)
    ctx.set_signal_handler("tag", tag)
    ctx.sleep(timedelta(hours=1))
    return "slept"


@weft.workflow(name="attrs.parent")
def parent(ctx: weft.Context) -> Any:
    return ctx.run_child("attrs.child", search_attributes={"plan": "child-plan", "customer_id": 5})


@weft.workflow(name="attrs.child")
def child(ctx: weft.Context) -> str:
    return "child"


@weft.workflow(name="attrs.waits")
def waits(ctx: weft.Context) -> Any:
    seen: list = []
    ctx.set_update_handler("add", lambda item: seen.append(item) or len(seen))
    ctx.wait_condition(lambda: len(seen) >= 2)
    return seen
