"""Workflows for tests/test_soak.py (imported at the end of workflows.py, so that ``weft_maintenance``
subprocesses register them too).

Every activity step records one Execution row keyed ``<workflow id>:<step index>`` (one run per workflow id
in the soak test, so the key names a run and a step), with the pid of the process that executed it: the
test counts executions per key to find activities executed more than once.
"""

from __future__ import annotations

import os

import django_weft as weft

from .models import Execution


# Attempts lost with a killed process count (design 9.1): a step the soak's kills catch again and again must not
# run out of attempts before the soak ends.
@weft.activity(name="soak.step", retry=weft.RetryPolicy(max_attempts=20))
def soak_step(key: str) -> str:
    Execution.objects.create(key=key, pid=os.getpid())
    return key


@weft.workflow(name="soak.activities")
def activities(ctx: weft.Context, steps: int) -> list[str]:
    """``steps`` activities in a row."""
    return [ctx.run(soak_step, f"{ctx.workflow_id}:{i}") for i in range(steps)]


@weft.workflow(name="soak.sleeps")
def sleeps(ctx: weft.Context, seconds: list[float]) -> list[str]:
    """An activity, then for each of ``seconds`` a durable sleep followed by an activity."""
    done = [ctx.run(soak_step, f"{ctx.workflow_id}:0")]
    for i, duration in enumerate(seconds, start=1):
        ctx.sleep(duration)
        done.append(ctx.run(soak_step, f"{ctx.workflow_id}:{i}"))
    return done


@weft.workflow(name="soak.signals")
def signals(ctx: weft.Context, count: int) -> list:
    """An activity, ``count`` waits for signal "item", an activity; returns the payloads in the order
    consumed."""
    ctx.run(soak_step, f"{ctx.workflow_id}:0")
    payloads = [ctx.wait_for_signal("item") for _ in range(count)]
    ctx.run(soak_step, f"{ctx.workflow_id}:1")
    return payloads


@weft.workflow(name="soak.scheduled")
def scheduled(ctx: weft.Context, seconds: float) -> list[str]:
    """Started by the soak test's schedules: an activity, a durable sleep, an activity."""
    first = ctx.run(soak_step, f"{ctx.workflow_id}:0")
    ctx.sleep(seconds)
    return [first, ctx.run(soak_step, f"{ctx.workflow_id}:1")]
