"""The tasks ``weft_bench --tasks`` enqueues: the same no-op on django_weft's backend ("default") and on
django-tasks' own database backend ("db", where django-tasks-db is installed: testproject/settings.py)."""

from __future__ import annotations

from django.conf import settings

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks package
    from django_tasks import task


@task()
def noop(i: int) -> int:
    return i


if "db" in getattr(settings, "TASKS", {}):

    @task(backend="db")
    def db_noop(i: int) -> int:
        return i
