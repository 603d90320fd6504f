"""Tasks of Django's tasks framework, run by django_weft's backend (tests/test_tasks_backend.py). Imported from
``django.tasks`` on Django 6 and from the ``django-tasks`` package on 5.2, as a project would."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import django_weft as weft
from django_weft.tasks_backend import task_options

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

# How often each key's task ran (in the process that ran it): the retry and SIGKILL tests read it.
CALLS: dict[str, int] = {}


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def report_context(context, value):
    return {"attempt": context.attempt, "id": context.task_result.id, "value": value,
            "workers": len(context.task_result.worker_ids), "status": str(context.task_result.status)}


@task()
def fail(message: str) -> None:
    raise ValueError(message)


@task()
def returns_tuple() -> tuple:
    return (1, (2, 3), {"k": (4,)})


@task()
def returns_unserialisable() -> object:
    return object()


@task(backend="retrying")
def flaky(key: str, failures: int) -> int:
    """Fails its first ``failures`` attempts."""
    CALLS[key] = CALLS.get(key, 0) + 1
    if CALLS[key] <= failures:
        raise ConnectionError(f"attempt {CALLS[key]} of {key} failed")
    return CALLS[key]


@task(takes_context=True)
@task_options(retry=weft.RetryPolicy(max_attempts=2, initial_backoff=1))
def flaky_own_policy(context, key: str) -> int:
    """The task's own policy (a weft.RetryPolicy): fails its first attempt."""
    if context.attempt == 1:
        raise ConnectionError("first attempt")
    return context.attempt


@task()
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(priority=10, queue_name="open")
def urgent(value: str) -> str:
    return value


@task(queue_name="emails")
def send_email(address: str) -> str:
    return f"sent to {address}"


@task(backend="on_commit")
def after_commit(value: str) -> str:
    return value


@task()
def slow_append(path: str, value: str, seconds: float) -> str:
    """Appends ``value`` to the file at ``path`` when it starts, then takes ``seconds`` (the SIGKILL test kills its
    executor meanwhile), then appends "done"."""
    with Path(path).open("a") as out:
        out.write(f"{value}:{os.getpid()}\n")
    time.sleep(seconds)
    with Path(path).open("a") as out:
        out.write("done\n")
    return value
