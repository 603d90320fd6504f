"""Workflows of the flow-control tests (design 9.3): jobs on queues that record when each execution of their
work began and ended, so that a test can check the limits from what actually ran."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import django_weft as weft

from .models import Execution


@weft.activity(name="flowctl.work")
def work(spec: dict) -> str:
    """Marks its start and its end (keys ``begin:<label>`` and ``end:<label>``) around ``spec['seconds']``."""
    Execution.objects.create(key=f"begin:{spec['label']}", pid=os.getpid())
    time.sleep(spec.get("seconds", 0))
    Execution.objects.create(key=f"end:{spec['label']}", pid=os.getpid())
    return spec["label"]


@weft.workflow(name="flowctl.job")
def job(ctx: weft.Context, spec: dict) -> str:
    return ctx.run(work, spec)


@weft.workflow(name="flowctl.sleeper")
def sleeper(ctx: weft.Context, seconds: float) -> str:
    ctx.sleep(timedelta(seconds=seconds))
    return "slept"


@weft.workflow(name="flowctl.waiter")
def waiter(ctx: weft.Context, _: object = None) -> object:
    return ctx.wait_for_signal("go")


@weft.workflow(name="flowctl.emails", queue="emails")
def email(ctx: weft.Context, to: str) -> str:
    return f"sent to {to}"


@weft.workflow(name="flowctl.chain")
def chain(ctx: weft.Context, left: int) -> int:
    if left > 0:
        ctx.continue_as_new(left - 1)
    return ctx.wait_for_signal("done")


@weft.workflow(name="flowctl.parent")
def parent(ctx: weft.Context, count: int) -> list:
    children = [ctx.start_child(job, {"label": f"child-{i}"}, queue="emails") for i in range(count)]
    return [child.result() for child in children]


@weft.workflow(name="flowctl.cleans_up")
def cleans_up(ctx: weft.Context, _: object = None) -> str:
    try:
        return ctx.wait_for_signal("never")
    except weft.CancelledError:
        with ctx.cleanup():
            ctx.run(work, {"label": "cleanup"})
        raise


@weft.workflow(name="flowctl.fails_on_go")
def fails_on_go(ctx: weft.Context, _: object = None) -> None:
    ctx.wait_for_signal("go")
    raise weft.ApplicationError("told to fail", non_retryable=True)


# --- limited activities ------------------------------------------------------------------------------------


def _attempt(label: str, seconds: float) -> str:
    Execution.objects.create(key=f"begin:{label}", pid=os.getpid())
    time.sleep(seconds)
    Execution.objects.create(key=f"end:{label}", pid=os.getpid())
    return label


@weft.activity(name="flowctl.provider", concurrency=2)
def provider(label: str, seconds: float = 0) -> str:
    return _attempt(label, seconds)


@weft.activity(name="flowctl.per_account", concurrency=1, key=lambda account, *_: account)
def per_account(account: str, label: str, seconds: float = 0) -> str:
    return _attempt(f"{account}/{label}", seconds)


@weft.activity(name="flowctl.rated", rate="5/s")
def rated(i: int) -> str:
    from django_weft.common import clock

    return clock.now().isoformat()


@weft.workflow(name="flowctl.fan_out")
def fan_out(ctx: weft.Context, spec: dict) -> list:
    pendings = [ctx.start_activity(provider, f"{spec['prefix']}{i}", spec.get("seconds", 0))
                for i in range(spec["count"])]
    return ctx.gather(*pendings)


@weft.workflow(name="flowctl.accounts")
def accounts(ctx: weft.Context, spec: dict) -> list:
    pendings = [ctx.start_activity(per_account, account, f"{i}", spec.get("seconds", 0))
                for i, account in enumerate(spec["accounts"])]
    return ctx.gather(*pendings)


@weft.workflow(name="flowctl.calls")
def calls(ctx: weft.Context, spec: dict) -> list:
    return [ctx.run(provider, f"{spec['prefix']}{i}", spec.get("seconds", 0)) for i in range(spec["count"])]


@weft.workflow(name="flowctl.rated_calls")
def rated_calls(ctx: weft.Context, count: int) -> list:
    return [ctx.run(rated, i) for i in range(count)]


@weft.workflow(name="flowctl.leaves_a_branch")
def leaves_a_branch(ctx: weft.Context, _: object = None) -> object:
    """Starts an attempt of the rated activity and ends at a signal without waiting for it."""
    ctx.start_activity(rated, -1)
    return ctx.wait_for_signal("go")
