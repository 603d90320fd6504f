"""Workflows for tests/test_evolving_edges.py: where continue-as-new, patches and the replay check meet the
rest of the engine."""

from __future__ import annotations

import django_weft as weft
from django_weft.common import clock
from django_weft.store import transitions
from tests.testapp import evolving_workflows as ev

state = {"v": 1}

@weft.activity
def act(key: str) -> str:
    ev._mark(key)
    return key

@weft.workflow(name="evolve_edge.gap")
def gap(ctx, key):
    if state["v"] >= 2 and ctx.patched("p"):
        ctx.run(ev.added_step, f"{key}:new")
    a = ctx.start_activity(act, f"{key}:slow")
    b = ctx.start_activity(act, f"{key}:fast")
    ctx.gather(a, b)
    ctx.wait_for_signal("go")
    return "done"

@weft.workflow(name="evolve_edge.race_child")
def race_child(ctx):
    c = ctx.start_child("evolve.counter", {"total": 0, "every": 1}, workflow_id="rc-child")
    t = ctx.start_timer(60)
    index, _ = ctx.race(c, t)
    ctx.wait_for_signal("end")
    return index

@weft.activity
def request_my_cancel(run_id: str) -> None:
    # what the parent's close with parent_close_policy=request_cancel does while this child executes
    transitions.cancel_child(run_id, clock.now(), "parent closed", "request_cancel")

@weft.workflow(name="evolve_edge.continuing_child")
def continuing_child(ctx, n):
    if n == 0:
        ctx.run(request_my_cancel, str(ctx.run_id))
        ctx.continue_as_new(1)
    ctx.wait_for_signal("never")

@weft.workflow(name="evolve_edge.bad_read")
def bad_read(ctx):
    r = ctx.run(act, "x")
    if state["v"] >= 2:
        r = r["new_key"]   # new code reads the old recorded result differently
    ctx.wait_for_signal("go")
