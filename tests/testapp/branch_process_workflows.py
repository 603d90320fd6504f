"""Workflows for the parallel-branch process tests (tests/test_processes_branches.py): a run fanning out to
many activities, some quick and some blocked on a file, so that a test can SIGKILL its executor while the
quick ones have settled and the blocked ones are in flight.

Every execution of a branch records an Execution row (with the process's pid) as it begins, and the
branch returns its index and that pid, so the run's result says which process's result each branch kept.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import django_weft as weft

from .workflows import mark


class GateTimeout(Exception):
    pass


# Not retried after an error (GateTimeout fails the run, so a broken test shows up as a failed run); attempts lost
# with a killed process count (design 9.1), so there is room for those.
@weft.activity(name="branchproc.branch", retry=weft.RetryPolicy(max_attempts=5, non_retryable=(GateTimeout,)))
def branch(spec: dict) -> dict:
    """Marks ``key:index``; a blocked branch (``spec['gate']`` is a path) then waits until that file exists
    and marks ``key:index:end``. Returns ``{"index": ..., "pid": ...}``.

    A gate that is never opened fails the run (after ``max_wait`` seconds of its own time), so a broken test
    shows up as a failed run rather than as a pass.
    """
    key = f"{spec['key']}:{spec['index']}"
    mark(key)
    if spec["gate"] is not None:
        deadline = time.monotonic() + spec["max_wait"]
        while not Path(spec["gate"]).exists():
            if time.monotonic() > deadline:
                raise GateTimeout(f"{spec['gate']} did not appear within {spec['max_wait']}s")
            time.sleep(0.05)
        mark(key + ":end")
    return {"index": spec["index"], "pid": os.getpid()}


@weft.workflow(name="branchproc.fan_out")
def fan_out(ctx: weft.Context, spec: dict) -> list:
    """One branch per index in ``range(spec['n'])``, all started before any is waited for; the indices in
    ``spec['blocked']`` wait for the file ``spec['gate']``. Returns the branches' values in index order."""
    pendings = [
        ctx.start_activity(branch, {"key": spec["key"], "index": index, "max_wait": spec.get("max_wait", 60),
                                    "gate": spec["gate"] if index in spec["blocked"] else None})
        for index in range(spec["n"])
    ]
    return ctx.gather(*pendings)


@weft.activity(name="branchproc.beats_then_dies", retry=weft.RetryPolicy(max_attempts=2))
def beats_then_dies(key: str) -> object:
    """The first execution stores progress with a heartbeat, then its process dies (SIGKILL); the next
    execution, in another process, starts from the stored progress."""
    info = weft.activity_info()
    mark(key)
    if info.heartbeat_details is None:
        weft.heartbeat({"rows_done": 500})
        os.kill(os.getpid(), signal.SIGKILL)
    return {"resumed_from": info.heartbeat_details, "pid": os.getpid()}


@weft.workflow(name="branchproc.resume_after_kill")
def resume_after_kill(ctx: weft.Context, key: str) -> object:
    return ctx.start_activity(beats_then_dies, key).result()
