"""Workflows for tests/test_processes_updates.py: updates applied by real weft_maintenance processes."""

from __future__ import annotations

import os
import signal

import django_weft as weft

from .workflows import mark

KILL_IN_HANDLER = "WEFT_TEST_KILL_IN_HANDLER"
KILL_IN_ACTIVITY = "WEFT_TEST_KILL_IN_ACTIVITY"


@weft.workflow(name="updates.ledger")
def ledger(ctx: weft.Context, expected: int) -> list:
    """Each update appends its payload and replies with its place in the ledger."""
    entries: list = []

    def append(entry: str) -> int:
        entries.append(entry)
        return len(entries)

    ctx.set_update_handler("append", append)
    ctx.wait_condition(lambda: len(entries) >= expected)
    return entries


@weft.activity
def after_update(key: str) -> str:
    mark(key)
    if os.environ.get(KILL_IN_ACTIVITY):
        os.kill(os.getpid(), signal.SIGKILL)
    return "after"


@weft.workflow(name="updates.fragile")
def fragile(ctx: weft.Context, key: str) -> dict:
    """Its update handler, or the activity right after the update, kills the process that runs it (when that
    process has the environment variable set)."""
    items: list = []

    def add(item: str) -> int:
        if os.environ.get(KILL_IN_HANDLER):
            os.kill(os.getpid(), signal.SIGKILL)
        items.append(item)
        return len(items)

    ctx.set_update_handler("add", add)
    ctx.wait_condition(lambda: bool(items))
    return {"items": items, "after": ctx.run(after_update, key)}


@weft.activity
def pause(seconds: float) -> None:
    import time

    time.sleep(seconds)


@weft.workflow(name="updates.busy")
def busy(ctx: weft.Context, steps: int) -> list:
    """Never parks: a run of activities, taking updates between them."""
    seen: list = []
    ctx.set_update_handler("note", lambda value: seen.append(value) or len(seen))
    for _ in range(steps):
        ctx.run(pause, 0.1)
    return seen
