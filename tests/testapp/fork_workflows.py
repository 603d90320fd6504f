"""Workflows for tests/test_fork_terminate.py and tests/test_spent_keys.py: forks and terminations."""

from __future__ import annotations

import os
import time
from pathlib import Path

import django_weft as weft

from .workflows import mark, record

# The "bug" of step 4 of fork.pipeline: a test fixes it by setting fixed, as a deploy would.
BUG = {"fixed": False}


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def buggy(key: str) -> str:
    mark(key)
    if not BUG["fixed"]:
        raise RuntimeError(f"the bug in {key}")
    return f"fixed {key}"


@weft.workflow(name="fork.pipeline")
def pipeline(ctx: weft.Context, key: str) -> list:
    """Steps 1-3 record, step 4 is buggy until fixed, step 5 records."""
    done = [ctx.run(record, f"{key}:{i}") for i in (1, 2, 3)]
    done.append(ctx.run(buggy, f"{key}:4"))
    done.append(ctx.run(record, f"{key}:5"))
    return done


@weft.workflow(name="fork.signalled")
def signalled(ctx: weft.Context, key: str) -> list:
    """Step 1 waits for "go", step 2 is buggy until fixed."""
    go = ctx.wait_for_signal("go")
    return [go, ctx.run(buggy, f"{key}:2")]


@weft.workflow(name="fork.unsettled_branch")
def unsettled_branch(ctx: weft.Context, key: str) -> None:
    """Step 1 is a signal branch never waited for; step 2 fails: the run fails with no row at step 1."""
    ctx.start_wait_for_signal("never")
    ctx.run(buggy, f"{key}:2")


@weft.activity
def terminate_own_run(key: str) -> str:
    """Terminates the run that is executing it, as an operator would mid-step."""
    mark(key)
    weft.terminate(key, reason="operator terminated mid-step")
    return "finished after terminate"


@weft.workflow(name="fork.terminated_mid_step")
def terminated_mid_step(ctx: weft.Context, key: str) -> str:
    ctx.run(record, key + ":first")
    ctx.run(terminate_own_run, key)
    ctx.run(record, key + ":never")
    return "unreachable"


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def hold_until_file(spec: dict) -> str:
    """Marks that it started, then waits (at most ``max_wait`` seconds) until ``spec['path']`` exists."""
    mark(spec["key"] + ":start")
    deadline = time.monotonic() + spec.get("max_wait", 60)
    while not Path(spec["path"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    mark(spec["key"] + ":end")
    return str(os.getpid())


@weft.workflow(name="fork.held")
def held(ctx: weft.Context, spec: dict) -> str:
    """An activity a test holds (a real executor process is in it while the test terminates the run), then more
    steps that must never be recorded."""
    ctx.run(record, spec["key"] + ":before")
    ctx.run(hold_until_file, spec)
    ctx.run(record, spec["key"] + ":after")
    ctx.sleep(1)
    return "unreachable"
