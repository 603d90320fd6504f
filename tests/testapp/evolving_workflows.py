"""Workflows whose code changes while runs are open (tests/test_evolving.py): which code is deployed is a
switch the tests flip, as a deploy would swap the module."""

from __future__ import annotations

import os
import signal

import django_weft as weft

from .models import Execution

# The deploy the process runs: 1 (the old code) or 2 (the new code).
deployed = {"version": 1}


def _mark(key: str) -> int:
    Execution.objects.create(key=key, pid=os.getpid())
    return Execution.objects.filter(key=key).count()


@weft.activity
def step(key: str) -> str:
    _mark(key)
    return key


@weft.activity
def added_step(key: str) -> str:
    """The step deploy 2 adds."""
    _mark(key)
    return key


@weft.workflow(name="evolve.patched")
def patched_order(ctx: weft.Context, key: str) -> list:
    """Deploy 2 adds step b, guarded by a patch."""
    done = [ctx.run(step, f"{key}:a")]
    ctx.wait_for_signal("first")
    if deployed["version"] >= 2 and ctx.patched("add-b"):
        done.append(ctx.run(added_step, f"{key}:b"))
    done.append(ctx.run(step, f"{key}:c"))
    ctx.wait_for_signal("second")
    return done


@weft.workflow(name="evolve.unguarded")
def unguarded_order(ctx: weft.Context, key: str) -> list:
    """Deploy 2 inserts step b without a patch: runs that passed that point cannot replay."""
    done = [ctx.run(step, f"{key}:a")]
    ctx.wait_for_signal("first")
    if deployed["version"] >= 2:
        done.append(ctx.run(added_step, f"{key}:b"))
    done.append(ctx.run(step, f"{key}:c"))
    ctx.wait_for_signal("second")
    return done


@weft.workflow(name="evolve.deprecated")
def deprecated_order(ctx: weft.Context, key: str) -> list:
    """After the patch is deprecated: the new code only, a marker consumed where a run has one."""
    done = [ctx.run(step, f"{key}:a")]
    ctx.wait_for_signal("first")
    ctx.deprecate_patch("add-b")
    done.append(ctx.run(added_step, f"{key}:b"))
    done.append(ctx.run(step, f"{key}:c"))
    ctx.wait_for_signal("second")
    return done


@weft.workflow(name="evolve.versioned", version=1)
def versioned_v1(ctx: weft.Context, key: str) -> str:
    ctx.wait_for_signal("go")
    return f"{key} by version 1"


@weft.workflow(name="evolve.versioned", version=2)
def versioned_v2(ctx: weft.Context, key: str) -> str:
    ctx.run(step, f"{key}:v2 only")
    ctx.wait_for_signal("go")
    return f"{key} by version 2"


@weft.workflow(name="evolve.counter")
def counter(ctx: weft.Context, state: dict) -> object:
    """Consumes "tick" signals forever, continuing as new every ``every`` of them; stops at "stop"."""
    total = state["total"]
    for _ in range(state["every"]):
        name, payload = ctx.wait_for_signal(["tick", "stop"])
        if name == "stop":
            return {"total": total, "generation": state.get("generation", 0)}
        total += payload
    ctx.continue_as_new({**state, "total": total, "generation": state.get("generation", 0) + 1})


@weft.workflow(name="evolve.long")
def long_history(ctx: weft.Context, steps: int) -> int:
    for _ in range(steps):
        ctx.now()
    return steps


@weft.activity(retry=weft.RetryPolicy(max_attempts=20))
def dies(key: str) -> None:
    """Kills its own process every time (a poison step: it exhausts memory, crashes the interpreter)."""
    _mark(key)
    os.kill(os.getpid(), signal.SIGKILL)


@weft.workflow(name="evolve.poison")
def poison(ctx: weft.Context, key: str) -> None:
    ctx.run(step, f"{key}:before")
    ctx.run(dies, key)


class Crash(BaseException):
    """Stands in for the executor's process dying, in-process."""


# Attempts lost with their executor count (design 9.1): enough of them that the recovery limit, not the retry
# policy, ends the run.
@weft.activity(retry=weft.RetryPolicy(max_attempts=20))
def crashes(key: str) -> None:
    _mark(key)
    raise Crash(key)


@weft.workflow(name="evolve.crashes")
def crashing(ctx: weft.Context, key: str) -> None:
    ctx.run(step, f"{key}:before")
    ctx.run(crashes, key)
