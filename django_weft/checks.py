"""System checks: configuration that would make the engine unsafe or runs that cannot make progress."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError, connections, router

from .liveness import stalled_hint
from .registry import registered_versions, registered_workflow_names


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
    """Runs still open whose workflow type, or the version of it they started on, no process here can
    execute."""
    alias = _weft_alias()
    if not databases or alias not in databases:
        return []
    from django.db.models import Count

    from .models import Workflow

    try:
        groups = list(Workflow.objects.using(alias).open().values("workflow_type", "version")
                      .annotate(runs=Count("pk")).order_by("workflow_type", "version"))
    except DatabaseError:  # not migrated yet
        return []
    names = registered_workflow_names()
    missing_types: dict[str, int] = {}
    missing_versions: list[str] = []
    for group in groups:
        name, version, count = group["workflow_type"], group["version"], group["runs"]
        if name not in names:
            missing_types[name] = missing_types.get(name, 0) + count
        elif version not in registered_versions(name):
            registered = ", ".join(str(v) for v in registered_versions(name))
            missing_versions.append(f"{name} version {version} ({count} open run(s); registered: {registered})")
    warnings = []
    if missing_types:
        shown = ", ".join(f"{name} ({count} open run(s))" for name, count in sorted(missing_types.items()))
        warnings.append(Warning(
            f"open workflow runs reference workflow types that are not registered: {shown}.",
            hint="Keep the workflow code deployed until its runs finish, or cancel those runs. Executors "
                 "put such runs back and retry them every minute.",
            id="weft.W001",
        ))
    if missing_versions:
        warnings.append(Warning(
            f"open workflow runs need versions that are not registered: {'; '.join(missing_versions)}.",
            hint="A run always executes with the version it started on: keep registering that version "
                 "(@weft.workflow(name=..., version=N)) until its runs finish. They are held, not failed.",
            id="weft.W003",
        ))
    return warnings


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
