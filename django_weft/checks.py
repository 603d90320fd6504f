"""System checks: configuration that would make the engine unsafe or runs that cannot make progress."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError, connections, router

from .liveness import stalled_hint
from .registry import registered_workflow_names


def _weft_alias() -> str:
    from .models import Workflow

    return router.db_for_write(Workflow)


@register(Tags.compatibility)
def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list:
    alias = _weft_alias()
    settings_dict = connections[alias].settings_dict
    if settings_dict["ENGINE"] != "django.db.backends.sqlite3":
        return []
    mode = (settings_dict.get("OPTIONS") or {}).get("transaction_mode")
    if mode in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [Error(
        f"django_weft needs SQLite transactions that take the write lock up front; database {alias!r} "
        f"uses transaction_mode={mode!r}.",
        hint=f'Set DATABASES["{alias}"]["OPTIONS"] = {{"transaction_mode": "IMMEDIATE", "init_command": '
             '"PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"} (keep any other options you have, '
             'such as "timeout"). Without IMMEDIATE, concurrent claims can fail with "database is locked" or '
             "read stale rows; WAL lets readers go on while a transaction writes.",
        id="weft.E001",
    )]


@register(Tags.database)
def check_unregistered_open_runs(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """Runs still open whose workflow type no process here can execute."""
    alias = _weft_alias()
    if not databases or alias not in databases:
        return []
    from .models import Workflow

    try:
        types = set(Workflow.objects.using(alias).open().values_list("workflow_type", flat=True).distinct())
    except DatabaseError:  # not migrated yet
        return []
    missing = sorted(types - registered_workflow_names())
    if not missing:
        return []
    return [Warning(
        f"open workflow runs reference workflow types that are not registered: {', '.join(missing)}.",
        hint="Keep the workflow code deployed until its runs finish, or cancel those runs. Executors "
             "put such runs back and retry them every minute.",
        id="weft.W001",
    )]


@register(Tags.database)
def check_stalled_runs(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """Runs due for a while and no live executor (see django_weft.liveness); only when asked to check the
    database (``migrate``, ``check --database``), and silent where it is not migrated or not reachable."""
    alias = _weft_alias()
    if not databases or alias not in databases:
        return []
    try:
        hint = stalled_hint()
    except DatabaseError:  # not migrated yet, or unreachable
        return []
    if not hint:
        return []
    return [Warning(
        hint,
        hint="Start `manage.py weft_maintenance` (or, with WEFT_EXECUTOR = 'celery', Celery workers and the "
             "maintenance task); the admin lists live executors under Workflows > Executors.",
        id="weft.W002",
    )]


@register(Tags.compatibility)
def check_executor(app_configs: Any = None, **kwargs: Any) -> list:
    from importlib.util import find_spec

    from .conf import EXECUTORS, weft_settings

    executor = weft_settings.EXECUTOR
    if executor not in EXECUTORS:
        return [Error(f"WEFT_EXECUTOR is {executor!r}; it must be one of {', '.join(map(repr, EXECUTORS))}.",
                      id="weft.E002")]
    if executor == "celery" and find_spec("celery") is None:
        return [Error("WEFT_EXECUTOR is 'celery' but Celery is not installed.",
                      hint="pip install 'django-weft[celery]' and define a Celery app for the project.",
                      id="weft.E003")]
    return []
