"""Workflows for tests/test_in_caller.py (weft.run): an activity that looks at its own run mid-step, and a
workflow whose own code raises."""

from __future__ import annotations

import threading
import time

import django_weft as weft
from django_weft.models import Workflow
from tests.testapp.workflows import mark, record

# What each execution of ``observe`` saw, in order: the thread it ran on and its run's row at that moment.
SEEN: list[dict] = []


@weft.activity
def observe(key: str) -> str:
    mark(key)
    info = weft.activity_info()
    run = Workflow.objects.get(pk=info.run_id)
    SEEN.append({"key": key, "thread": threading.get_ident(), "status": run.status, "fence": run.fence,
                 "lease_owner": run.lease_owner, "runnable_at": run.runnable_at, "started_at": run.started_at})
    return key


@weft.workflow(name="in_caller.observed")
def observed(ctx: weft.Context, key: str) -> list[str]:
    return [ctx.run(observe, f"{key}:{i}") for i in range(2)]


class Broken(Exception):
    pass


@weft.workflow(name="in_caller.raises")
def raises(ctx: weft.Context, key: str) -> None:
    ctx.run(record, key + ":before")
    raise Broken(f"the workflow code of {key} failed")


@weft.activity
def nap(seconds: float) -> None:
    time.sleep(seconds)


@weft.workflow(name="in_caller.lease")
def lease(ctx: weft.Context, pause: float) -> None:
    ctx.run(observe, "lease:a")
    ctx.run(observe, "lease:b")
    ctx.run(nap, pause)
    ctx.run(observe, "lease:c")
