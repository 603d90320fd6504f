"""Django's tasks framework, wherever this project has it: ``django.tasks`` (Django 6.0 and later) or the
``django-tasks`` package that brings the same API to Django 5.2 (the ``tasks`` extra). The names differ between the
two only in the exception classes, which are exported here under Django's names."""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:  # the two frameworks' stubs differ: code here is typed against neither
    Task: Any
    TaskContext: Any
    TaskResult: Any
    TaskResultStatus: Any
    task_backends: Any
    BaseTaskBackend: Any
    DEFAULT_TASK_QUEUE_NAME: str
    TaskError: Any
    InvalidTask: Any
    TaskResultDoesNotExist: Any
    task_enqueued: Any
    task_finished: Any
    task_started: Any
    normalize_json: Any
    FRAMEWORK: str
elif find_spec("django.tasks") is not None:  # Django 6.0+
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_QUEUE_NAME, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:
    try:
        from django_tasks import (
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import DEFAULT_TASK_QUEUE_NAME, Task, TaskError
        from django_tasks.exceptions import (
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as missing:
        raise ImproperlyConfigured(
            "django_weft.tasks_backend needs Django's tasks framework: Django 6.0 or later, or on Django 5.2 the "
            "django-tasks package (pip install 'django-weft[tasks]')") from missing

    FRAMEWORK = "django_tasks"

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
