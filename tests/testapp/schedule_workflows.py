"""Workflows for tests/test_processes_schedules.py (imported at the end of workflows.py, so that
``weft_maintenance`` subprocesses register them too)."""

from __future__ import annotations

import django_weft as weft

from .workflows import record


@weft.workflow(name="test.scheduled_pid")
def scheduled_pid(ctx: weft.Context, _input: object = None) -> str:
    """One activity that records, keyed by this run's workflow id, the pid of the process executing it."""
    return ctx.run(record, ctx.workflow_id)
