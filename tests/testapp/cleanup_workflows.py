"""Workflows whose ``finally:`` and ``except BaseException:`` blocks make durable calls (design 9.1): the cleanup
must run for real once, when the workflow really ends, never while the run parks, stops or is handed back."""

from __future__ import annotations

from datetime import timedelta

import django_weft as weft

from .workflows import mark, record, wait_for_file

# What ``ctx.is_parking`` said in each pass through a cleanup block, by workflow id (in-process tests only).
PARKING_SEEN: dict[str, list[bool]] = {}


@weft.activity
def hold_stock(key: str) -> str:
    mark(f"{key}:hold")
    return "held"


@weft.activity
def release_stock(key: str) -> str:
    mark(f"{key}:release")
    return "released"


@weft.activity
def terminate_own_run(workflow_id: str) -> None:
    weft.get_handle(workflow_id).terminate("the activity ends its own run")


def _note(ctx: weft.Context) -> None:
    PARKING_SEEN.setdefault(ctx.workflow_id, []).append(ctx.is_parking)


@weft.workflow(name="cleanup.finally")
def hold_then_release(ctx: weft.Context, key: str) -> object:
    """The issue's shape: hold, then sleep and wait for payment; release in ``finally``."""
    ctx.run(hold_stock, key)
    try:
        ctx.sleep(timedelta(seconds=3))
        return ctx.wait_for_signal("paid", timeout=timedelta(seconds=20))
    finally:
        _note(ctx)
        ctx.logger.info("releasing stock for %s", key)
        ctx.run(release_stock, key)


@weft.workflow(name="cleanup.except_base")
def release_on_any_exit(ctx: weft.Context, key: str) -> object:
    ctx.run(hold_stock, key)
    try:
        return ctx.wait_for_signal("paid")
    except BaseException:
        _note(ctx)
        ctx.run(release_stock, key)
        raise


@weft.workflow(name="cleanup.swallows")
def swallows_the_park(ctx: weft.Context, key: str) -> str:
    """Code that catches everything and returns: the park must win, the run is not completed early."""
    try:
        ctx.sleep(timedelta(seconds=5))
    except BaseException:
        return "swallowed"
    return ctx.run(record, f"{key}:after")


@weft.workflow(name="cleanup.raises_instead")
def raises_while_unwinding(ctx: weft.Context, key: str) -> str:
    """A cleanup block that raises another error while the run parks must not fail the run."""
    try:
        ctx.sleep(timedelta(seconds=5))
    finally:
        if ctx.is_parking:
            raise RuntimeError("cleanup saw a park")
    return ctx.run(record, f"{key}:after")


@weft.workflow(name="cleanup.history_limit")
def loops_past_the_history_limit(ctx: weft.Context, key: str) -> None:
    try:
        for i in range(100):
            ctx.run(record, f"{key}:{i}")
    finally:
        ctx.run(release_stock, key)


@weft.workflow(name="cleanup.continue_as_new")
def continues_once(ctx: weft.Context, spec: dict) -> int:
    try:
        if spec["round"] == 0:
            ctx.continue_as_new({**spec, "round": 1})
        return spec["round"]
    finally:
        _note(ctx)
        ctx.run(release_stock, spec["key"])


@weft.workflow(name="cleanup.lost_run")
def loses_its_run(ctx: weft.Context, key: str) -> None:
    """Its activity terminates the run: the executor loses it at the next commit."""
    try:
        ctx.run(terminate_own_run, ctx.workflow_id)
        ctx.run(record, f"{key}:after")
    finally:
        ctx.run(release_stock, key)


@weft.workflow(name="cleanup.branches")
def waits_for_branches(ctx: weft.Context, key: str) -> list:
    try:
        signal = ctx.start_wait_for_signal("go")
        timer = ctx.start_timer(timedelta(seconds=10))
        return ctx.gather(signal, timer)
    finally:
        _note(ctx)
        ctx.side_effect(lambda: mark(f"{key}:side_effect"))
        ctx.run(release_stock, key)


@weft.workflow(name="cleanup.worker_stop")
def releases_after_a_stop(ctx: weft.Context, spec: dict) -> str:
    """For the process test: SIGTERM while ``wait_for_file`` runs hands the run back at the next step."""
    key = spec["key"]
    try:
        released = ctx.run(wait_for_file, spec)
        ctx.run(record, f"{key}:after")
        return released
    finally:
        ctx.run(release_stock, key)
