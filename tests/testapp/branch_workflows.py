"""Workflows for the parallel-branch, heartbeat and async def tests (tests/test_branches.py)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from datetime import timedelta

from django.db import connections

import django_weft as weft

from .models import Execution


def _mark(key: str) -> int:
    Execution.objects.create(key=key, pid=os.getpid())
    return Execution.objects.filter(key=key).count()


def _mark_and_close(key: str) -> int:
    """_mark from a thread of the event loop's executor, which keeps no connection open afterwards."""
    try:
        return _mark(key)
    finally:
        connections.close_all()


# Activities that meet at a barrier can only finish if they run at the same time.
barriers: dict[str, threading.Barrier] = {}


@weft.activity
def meet(key: str, parties: int) -> str:
    barrier = barriers.setdefault(key, threading.Barrier(parties))
    barrier.wait(timeout=10)  # raises BrokenBarrierError if the others do not run meanwhile
    _mark(f"{key}:met")
    return f"{key}:{weft.activity_info().seq}"


@weft.workflow(name="branches.fan_out")
def fan_out(ctx: weft.Context, spec: dict) -> list:
    pendings = [ctx.start_activity(meet, spec["key"], spec["n"]) for _ in range(spec["n"])]
    return ctx.gather(*pendings)


class Refused(Exception):
    pass


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def succeed_or_fail(key: str, fail: bool) -> str:
    _mark(key)
    if fail:
        raise Refused(f"{key} refused")
    return key


@weft.workflow(name="branches.gather_failure")
def gather_failure(ctx: weft.Context, spec: dict) -> object:
    pendings = [ctx.start_activity(succeed_or_fail, key, fail) for key, fail in spec["branches"]]
    if spec.get("return_exceptions"):
        outcomes = ctx.gather(*pendings, return_exceptions=True)
        return [f"error:{type(o).__name__}" if isinstance(o, BaseException) else o for o in outcomes]
    try:
        return ctx.gather(*pendings)
    except weft.ActivityError as exc:
        return {"raised": str(exc), "done": [p.done for p in pendings]}


@weft.workflow(name="branches.approval")
def approval(ctx: weft.Context, days: float) -> object:
    index, value = ctx.race(ctx.start_wait_for_signal("approval"), ctx.start_timer(timedelta(days=days)))
    ctx.run(record_winner, f"{ctx.workflow_id}:{index}")
    if index == 1:
        late = ctx.wait_for_signal("approval")  # the signal wait that lost consumed nothing
        return {"winner": "timer", "late": late}
    return {"winner": "signal", "value": value}


@weft.activity
def record_winner(key: str) -> None:
    _mark(key)


@weft.activity
def quick(key: str) -> str:
    _mark(key)
    return key


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def stubborn(key: str) -> str:
    """Beats until it is told to stop; records that it was told."""
    _mark(f"{key}:started")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            weft.heartbeat()
        except weft.ActivityCancelled as exc:
            _mark(f"{key}:cancelled:{exc}")
            raise
        time.sleep(0.02)
    return "never told to stop"


@weft.workflow(name="branches.activity_race")
def activity_race(ctx: weft.Context, key: str) -> object:
    index, value = ctx.race(ctx.start_activity(stubborn, f"{key}:loser"), ctx.start_activity(quick, f"{key}:winner"))
    return [index, value]


@weft.workflow(name="branches.child_race")
def child_race(ctx: weft.Context, policy: str) -> object:
    child = ctx.start_child("branches.waits_forever", None, parent_close_policy=policy)
    index, _ = ctx.race(child, ctx.start_timer(60))
    return {"index": index, "child": child.workflow_id}


@weft.workflow(name="branches.waits_forever")
def waits_forever(ctx: weft.Context) -> object:
    return ctx.wait_for_signal("never")


@weft.workflow(name="branches.gather_child")
def gather_child(ctx: weft.Context, key: str) -> object:
    child = ctx.start_child("test.child", {"key": key, "value": 2})
    work = ctx.start_activity(quick, f"{key}:beside")
    return ctx.gather(child, work)


concurrency = {"now": 0, "max": 0}
concurrency_lock = threading.Lock()


@weft.activity
def counted(item: int) -> int:
    with concurrency_lock:
        concurrency["now"] += 1
        concurrency["max"] = max(concurrency["max"], concurrency["now"])
    time.sleep(0.05)
    with concurrency_lock:
        concurrency["now"] -= 1
    return item * 10


@weft.workflow(name="branches.map")
def map_items(ctx: weft.Context, spec: dict) -> list:
    return ctx.map(counted, range(spec["n"]), max_parallel=spec.get("max_parallel"))


@weft.workflow(name="branches.gather_counted")
def gather_counted(ctx: weft.Context, n: int) -> list:
    return ctx.gather(*[ctx.start_activity(counted, i) for i in range(n)])


class Crash(BaseException):
    """Stands in for the executor's process dying: nothing in the engine catches it."""


@weft.activity
def crash_once(key: str) -> str:
    if _mark(key) == 1:
        raise Crash(key)
    return key


@weft.workflow(name="branches.crash_mid_gather")
def crash_mid_gather(ctx: weft.Context, key: str) -> list:
    first = ctx.start_activity(quick, f"{key}:settled")
    second = ctx.start_activity(crash_once, f"{key}:crashes")
    return ctx.gather(first, second)


@weft.workflow(name="branches.activity_and_timer")
def activity_and_timer(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(quick, key), ctx.start_timer(30))


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=10))
def fails_first(key: str) -> str:
    if _mark(key) == 1:
        raise Refused(f"{key} first attempt")
    return f"{key}:ok:{weft.activity_info().attempt}:{weft.activity_info().idempotency_key}"


@weft.workflow(name="branches.retrying_branch")
def retrying_branch(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(fails_first, key), ctx.start_activity(quick, f"{key}:other"))


@weft.activity
def completes_later(key: str) -> None:
    _mark(f"{key}:asked")
    weft.complete_async()


@weft.workflow(name="branches.async_branch")
def async_branch(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(completes_later, key), ctx.start_activity(quick, f"{key}:other"))


# Flipped by a test to change the order the code starts its branches in.
order = {"swapped": False}


@weft.workflow(name="branches.order")
def branch_order(ctx: weft.Context, key: str) -> list:
    if order["swapped"]:
        timer = ctx.start_timer(10)
        return ctx.gather(ctx.start_activity(quick, f"{key}:a"), timer)
    return ctx.gather(ctx.start_activity(quick, f"{key}:a"), ctx.start_timer(10))


# --- async def activities --------------------------------------------------------------------------------

loops: dict[str, set[int]] = {}


@weft.activity
async def async_meet(key: str, parties: int) -> str:
    loops.setdefault(key, set()).add(id(asyncio.get_running_loop()))
    barrier = async_barriers.setdefault(key, asyncio.Barrier(parties))
    await asyncio.wait_for(barrier.wait(), timeout=10)
    return f"{key}:{weft.activity_info().seq}"


async_barriers: dict[str, asyncio.Barrier] = {}


@weft.workflow(name="branches.async_fan_out")
def async_fan_out(ctx: weft.Context, spec: dict) -> list:
    return ctx.gather(*[ctx.start_activity(async_meet, spec["key"], spec["n"]) for _ in range(spec["n"])])


@weft.activity
async def async_double(value: int) -> int:
    await asyncio.sleep(0)
    return value * 2


@weft.workflow(name="branches.async_run")
def async_run(ctx: weft.Context, value: int) -> list:
    return [ctx.run(async_double, value), ctx.map(async_double, [1, 2, 3])]


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=0), timeout=0.3)
async def async_slow_once(key: str) -> str:
    if await asyncio.to_thread(_mark_and_close, key) == 1:
        await asyncio.sleep(5)
    return f"{key}:attempt {weft.activity_info().attempt}"


@weft.workflow(name="branches.async_timeout")
def async_timeout(ctx: weft.Context, key: str) -> str:
    return ctx.run(async_slow_once, key)


# --- heartbeats --------------------------------------------------------------------------------------------


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=0))
def resumable(key: str) -> object:
    info = weft.activity_info()
    seen = info.heartbeat_details
    if info.attempt == 1:
        weft.heartbeat({"done": 3})
        raise Refused("stopped after 3")
    return {"resumed_from": seen, "key": info.idempotency_key}


@weft.workflow(name="branches.resumable")
def resumable_workflow(ctx: weft.Context, key: str) -> object:
    return ctx.run(resumable, key)


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=0), heartbeat_timeout=0.3)
def goes_silent(key: str) -> str:
    if _mark(key) == 1:
        time.sleep(1.5)  # no heartbeat: the attempt is failed long before this returns
        return "too late"
    weft.heartbeat()
    return f"attempt {weft.activity_info().attempt}"


@weft.workflow(name="branches.silent")
def silent(ctx: weft.Context, key: str) -> str:
    return ctx.run(goes_silent, key)


@weft.workflow(name="branches.silent_branch")
def silent_branch(ctx: weft.Context, key: str) -> list:
    return ctx.gather(ctx.start_activity(goes_silent, key))


@weft.activity(retry=weft.RetryPolicy(max_attempts=1), timeout=0.3)
def beats_past_timeout(key: str) -> str:
    return stubborn(key)


@weft.workflow(name="branches.beats_past_timeout")
def beats_past_timeout_workflow(ctx: weft.Context, key: str) -> object:
    try:
        return ctx.run(beats_past_timeout, key)
    except weft.ActivityError as exc:
        return exc.error_type


# Set by a test: the beating activity of branches.cancel_me has started.
started = threading.Event()


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def until_cancelled(key: str) -> str:
    started.set()
    return stubborn(key)


@weft.workflow(name="branches.cancel_me")
def cancel_me(ctx: weft.Context, key: str) -> object:
    return ctx.run(until_cancelled, key)


def wait_for_mark(prefix: str, timeout: float = 10) -> str:
    """The key of the first execution mark starting with ``prefix``, waiting for an activity's thread to
    write it (an abandoned attempt finishes on its own, after the run moved on)."""
    deadline = time.monotonic() + timeout
    while True:
        key = Execution.objects.filter(key__startswith=prefix).values_list("key", flat=True).first()
        if key is not None or time.monotonic() > deadline:
            assert key is not None, f"no execution mark starting with {prefix!r} within {timeout}s"
            return key
        time.sleep(0.02)


@weft.workflow(name="branches.bad_gather")
def bad_gather(ctx: weft.Context) -> object:
    try:
        ctx.gather()
    except weft.InvalidArgument as exc:
        empty = str(exc)
    try:
        ctx.race("not a branch")  # type: ignore[arg-type]
    except weft.InvalidArgument as exc:
        return [empty, str(exc)]
    return None


@weft.activity(retry=weft.RetryPolicy(max_attempts=3, initial_backoff=5))
def fails_then_crashes(key: str) -> str:
    """Attempt 1 fails; the first run of attempt 2 dies with the process; then it succeeds."""
    count = _mark(key)
    if count == 1:
        raise Refused(f"{key} attempt 1")
    if count == 2:
        raise Crash(key)
    return f"{key}:attempt {weft.activity_info().attempt}"


@weft.workflow(name="branches.crash_in_retry")
def crash_in_retry(ctx: weft.Context, spec: dict) -> object:
    if spec["branch"]:
        return ctx.start_activity(fails_then_crashes, spec["key"]).result()
    return ctx.run(fails_then_crashes, spec["key"])
