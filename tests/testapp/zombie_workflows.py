"""Workflows for tests/test_processes_zombie.py: an executor process frozen (SIGSTOP) past its lease while
another process takes its run over, then resumed (SIGCONT) as a zombie that must commit nothing.

Every activity records its execution (an Execution row with the process's pid) and returns that pid, so
the run's result says which process's results the journal kept.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import django_weft as weft

from .workflows import mark


# Attempts lost with a frozen or killed process count (design 9.1): room for them.
@weft.activity(retry=weft.RetryPolicy(max_attempts=5))
def note(key: str) -> int:
    """Records that it ran, in this process; returns the pid."""
    mark(key)
    return os.getpid()


class GateTimeout(Exception):
    pass


@weft.activity(retry=weft.RetryPolicy(max_attempts=5, non_retryable=(GateTimeout,)))
def gate(spec: dict) -> int:
    """Marks ``key:start``, blocks until ``spec['path']`` exists, marks ``key:end``; returns the pid.

    Not retried after an error: a gate that is never opened fails the run (after ``max_wait`` seconds of its own
    time), so a broken test shows up as a failed run rather than as a pass.
    """
    mark(spec["key"] + ":start")
    deadline = time.monotonic() + spec.get("max_wait", 60)
    while not Path(spec["path"]).exists():
        if time.monotonic() > deadline:
            raise GateTimeout(f"{spec['path']} did not appear within {spec.get('max_wait', 60)}s")
        time.sleep(0.05)
    mark(spec["key"] + ":end")
    return os.getpid()


@weft.workflow(name="test.zombie.in_activity")
def frozen_in_activity(ctx: weft.Context, spec: dict) -> list[int]:
    """Step 1 records; step 2 blocks on a file (a test freezes the executor there); steps 3 and 4 record."""
    key = spec["key"]
    return [
        ctx.run(note, key + ":1"),
        ctx.run(gate, {"key": key + ":2", "path": spec["path"], "max_wait": spec.get("max_wait", 60)}),
        ctx.run(note, key + ":3"),
        ctx.run(note, key + ":4"),
    ]


@weft.workflow(name="test.zombie.between_steps")
def frozen_between_steps(ctx: weft.Context, spec: dict) -> list[int]:
    """In the process whose pid is ``spec['freeze_pid']``, the workflow code stops its own process (SIGSTOP,
    which freezes every thread, the lease heartbeat's too) right after step 1's activity returned: its
    side effect is done, its result is journaled in memory only (it commits before the next activity).
    Any other process runs straight through. The stop touches no durable call, so replays are unaffected.

    The signal is sent to this very thread: a process-directed SIGSTOP (``os.kill``) may be taken by
    another thread, and this one would run on (into the next step's commit) until the stop reached it.
    A thread-directed one is handled before the call returns, and still stops the whole process.
    """
    key = spec["key"]
    first = ctx.run(note, key + ":1")
    if os.getpid() == spec["freeze_pid"]:
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # returns after SIGCONT
    return [first, ctx.run(note, key + ":2"), ctx.run(note, key + ":3")]
