"""A backend for Django's tasks framework (``django.tasks`` on Django 6, the ``django-tasks`` package on 5.2)::

    TASKS = {"default": {"BACKEND": "django_weft.tasks_backend.WeftBackend",
                         "QUEUES": ["default", "emails"],
                         "OPTIONS": {"retry": {"max_attempts": 5, "initial_backoff": 2}}}}

Every ``@task`` enqueued runs durably as a one-activity run of type ``task:<module path>`` (services.task_runs):
retried by its policy, run again when its executor dies, its result kept with the run, visible and cancellable in
the admin, the HTTP API and ``weft_runs``. OPTIONS: ``retry`` (a ``weft.RetryPolicy`` or a dict of its fields;
default: an exception fails the task, a lost attempt runs again), ``timeout`` (seconds per attempt),
``queue_map`` (task queue -> queue of WEFT_QUEUES; by default a queue of the same name, and none for
``default``), ``enqueue_on_commit`` (start the run after the caller's transaction commits instead of inside it).
A task may carry its own ``retry`` and ``timeout``: :func:`task_options` under its ``@task``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django_weft.common import tasks_api as api
from django_weft.common.durations import to_seconds
from django_weft.runtime.activities import RetryPolicy

__all__ = ["WeftBackend", "task_options"]


F = TypeVar("F", bound=Callable[..., Any])


def task_options(*, retry: RetryPolicy | dict | None = None, timeout: float | None = None) -> Callable[[F], F]:
    """One task's own retry policy and per-attempt timeout (seconds), over its backend's OPTIONS; under ``@task``::

        @task()
        @task_options(retry=weft.RetryPolicy(max_attempts=5), timeout=30)
        def send_receipt(order_id): ...

    (Django's ``@task`` takes no options of a backend's own, so they are the function's.)"""
    from django_weft.services import task_runs

    policy = None if retry is None else task_runs.retry_policy(retry)
    seconds = None if timeout is None else to_seconds(timeout, "timeout", allow_zero=False)

    def attach(func: F) -> F:
        func.__weft_task_options__ = {"retry": policy, "timeout": seconds}  # type: ignore[attr-defined]
        return func

    return attach


class WeftBackend(api.BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        from django_weft.services import task_runs

        return task_runs.enqueue(self, task, args, kwargs)

    def get_result(self, result_id: str) -> Any:
        from django_weft.services import task_runs

        return task_runs.get_result(result_id)
