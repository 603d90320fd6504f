"""Workflows for the hardening tests (tests/test_hardening.py, tests/test_processes_hardening.py)."""

from __future__ import annotations

import os
import signal

import django_weft as weft

from .models import Execution


def _mark(key: str) -> int:
    """Record one execution; returns how many there are now."""
    Execution.objects.create(key=key, pid=os.getpid())
    return Execution.objects.filter(key=key).count()


class Crash(BaseException):
    """Stands in for the executor's process dying: nothing in the engine catches it."""


class PoisonText(Exception):
    pass


# --- the token handed out, then the executor dies before the park commits -------------------------------

# Where a test finds the task token its async activity handed out (key -> token).
handed_out: dict[str, str] = {}


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=5))
def hand_out_then_crash(key: str, how: str) -> None:
    """Hands its token out; the first execution dies before complete_async() can park the run."""
    info = weft.activity_info()
    handed_out[key] = info.task_token
    Execution.objects.create(key=f"{key}:token:{info.task_token}", pid=os.getpid())
    if _mark(f"{key}:body") == 1:
        if how == "raise":
            raise Crash()
        os.kill(os.getpid(), signal.SIGKILL)
    weft.complete_async()


@weft.workflow(name="hardening.async_crash")
def async_crash(ctx: weft.Context, args: list) -> object:
    key, how = args
    answer = ctx.run(hand_out_then_crash, key, how)
    ctx.run(after, key)
    return answer


@weft.activity
def after(key: str) -> str:
    _mark(f"{key}:after")
    return "after"


# --- an async activity failed for good, then retried by an operator --------------------------------------


@weft.activity(retry=weft.RetryPolicy(max_attempts=1))
def ask_once(key: str) -> None:
    info = weft.activity_info()
    handed_out[f"{key}:{_mark(f'{key}:asked')}"] = info.task_token
    weft.complete_async()


@weft.workflow(name="hardening.async_once")
def async_once(ctx: weft.Context, key: str) -> object:
    return ctx.run(ask_once, key)


# --- a plain activity that reads its token -------------------------------------------------------------


@weft.activity
def plain_reads_token(key: str) -> str:
    handed_out[key] = weft.activity_info().task_token
    _mark(f"{key}:plain")
    return "plain result"


@weft.workflow(name="hardening.plain_token")
def plain_token(ctx: weft.Context, key: str) -> object:
    first = ctx.run(plain_reads_token, key)
    second = ctx.run(after, key)
    ctx.wait_for_signal("done")  # still open when the test uses the token
    return [first, second]


@weft.activity
def plain_completed_meanwhile(key: str) -> str:
    """Reads its token and, while it still runs, the token is used (first resolution wins)."""
    token = weft.activity_info().task_token
    weft.complete_async_activity(token, "from the token")
    return "from the body"


@weft.workflow(name="hardening.plain_completed_meanwhile")
def plain_meanwhile(ctx: weft.Context, key: str) -> object:
    return ctx.run(plain_completed_meanwhile, key)


# --- error text the database cannot store ----------------------------------------------------------------


@weft.activity(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=1))
def poison_activity(key: str) -> None:
    count = _mark(f"{key}:poison")
    raise PoisonText(f"attempt {count}: bad\x00byte and a lone \ud800 surrogate")


@weft.workflow(name="hardening.poison_activity")
def poison_in_activity(ctx: weft.Context, key: str) -> object:
    ctx.run(after, key)
    return ctx.run(poison_activity, key)


@weft.workflow(name="hardening.poison_workflow")
def poison_in_workflow(ctx: weft.Context, key: str) -> object:
    ctx.run(after, key)
    raise PoisonText("workflow code failed with \x00 and \udfff in its message")


@weft.workflow(name="hardening.bad_signal_name")
def bad_signal_name(ctx: weft.Context, key: str) -> object:
    ctx.run(after, key)
    return ctx.wait_for_signal("name with \x00 inside")


# --- delayed start -------------------------------------------------------------------------------------


@weft.workflow(name="hardening.delayed")
def delayed(ctx: weft.Context, key: str) -> object:
    return ctx.run(after, key)
