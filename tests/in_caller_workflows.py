"""Workflows for tests/test_in_caller.py (weft.run): an activity that looks at its own run mid-step, and a
workflow whose own code raises."""

from __future__ import annotations

import threading
import time

from django.utils import timezone

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
                 "lease_owner": run.lease_owner, "runnable_at": run.runnable_at, "started_at": run.started_at,
                 "seen_at": timezone.now()})
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


# key -> the least time its run's lease had left (seconds) at any look while ``watch_lease`` ran.
LEASE_LEFT: dict[str, float] = {}
LEASE_RUNS: dict[str, object] = {}  # key -> its run's id


@weft.activity
def watch_lease(key: str, seconds: float) -> None:
    run_id = weft.activity_info().run_id
    LEASE_RUNS[key] = run_id
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        lease = Workflow.objects.filter(pk=run_id).values_list("runnable_at", flat=True).get()
        left = (lease - timezone.now()).total_seconds()
        LEASE_LEFT[key] = min(left, LEASE_LEFT.get(key, left))
        time.sleep(0.05)


@weft.workflow(name="in_caller.watched")
def watched(ctx: weft.Context, spec: dict) -> None:
    ctx.run(watch_lease, spec["key"], spec["seconds"])


@weft.activity
def wait_for_a_renewal(timeout: float) -> bool:
    """Until the lease keeper renewed this run's lease once (it then waits WEFT_HEARTBEAT_SECONDS as set now)."""
    rows = Workflow.objects.filter(pk=weft.activity_info().run_id).values_list("runnable_at", flat=True)
    first, until = rows.get(), time.monotonic() + timeout
    while time.monotonic() < until:
        if rows.get() != first:
            return True
        time.sleep(0.05)
    return False


@weft.workflow(name="in_caller.renewed")
def renewed(ctx: weft.Context, timeout: float) -> bool:
    return ctx.run(wait_for_a_renewal, timeout)
