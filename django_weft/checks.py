"""System checks: configuration that would make the engine unsafe or runs that cannot make progress."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError, connections, router

from django_weft.common.registry import is_registered, registered_versions, registered_workflow_names
from django_weft.services.liveness import stalled_hint


def _weft_alias() -> str:
    from django_weft.models import Workflow

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


# The isolation level django_weft's fenced transitions are written for on MySQL/MariaDB (weft.E005).
MYSQL_ISOLATION = "read committed"


@register(Tags.compatibility)
def check_mysql_isolation_setting(app_configs: Any = None, **kwargs: Any) -> list:
    """weft.E005 from the settings alone; an unset level is Django's default, READ COMMITTED."""
    alias = _weft_alias()
    settings_dict = connections[alias].settings_dict
    if settings_dict["ENGINE"] != "django.db.backends.mysql":
        return []
    level = (settings_dict.get("OPTIONS") or {}).get("isolation_level", MYSQL_ISOLATION)
    if level is None:  # the server's default: only a check on the database itself can tell (below)
        return []
    return _mysql_isolation_errors(alias, str(level).lower())


@register(Tags.database)
def check_mysql_server(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """On MySQL/MariaDB, when asked to check the database (``migrate``, ``check --database``): a server with
    SKIP LOCKED (weft.E004) and sessions in READ COMMITTED as this project opens them (weft.E005)."""
    alias = _weft_alias()
    if not databases or alias not in databases:
        return []
    connection = connections[alias]
    if connection.vendor != "mysql":
        return []
    try:
        connection.ensure_connection()
        skip_locked = connection.features.has_select_for_update_skip_locked
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@SESSION.transaction_isolation" if _has_transaction_isolation(connection)
                           else "SELECT @@SESSION.tx_isolation")
            level = str(cursor.fetchone()[0]).replace("-", " ").lower()
    except DatabaseError:  # unreachable: migrate will say so
        return []
    errors = []
    if not skip_locked:
        server = "MariaDB" if connection.mysql_is_mariadb else "MySQL"  # type: ignore[attr-defined]
        version = ".".join(str(part) for part in connection.mysql_version)  # type: ignore[attr-defined]
        errors.append(Error(
            f"django_weft needs SELECT ... FOR UPDATE SKIP LOCKED; database {alias!r} is {server} {version}, "
            "which has none.",
            hint="Use MariaDB 10.6 or later, or MySQL 8.0 or later: executors and maintenance processes claim "
                 "runs, timers and schedules with SKIP LOCKED, so that several never wait on one another.",
            id="weft.E004",
        ))
    return errors + _mysql_isolation_errors(alias, level)


def _has_transaction_isolation(connection: Any) -> bool:
    # MySQL 8 has only transaction_isolation; MariaDB has tx_isolation, and transaction_isolation from 11.1.
    return not connection.mysql_is_mariadb or connection.mysql_version >= (11, 1)


def _mysql_isolation_errors(alias: str, level: str) -> list:
    if level == MYSQL_ISOLATION:
        return []
    return [Error(
        f"django_weft needs READ COMMITTED transactions on MySQL/MariaDB; database {alias!r} uses "
        f"{level.upper()}.",
        hint=f'Set DATABASES["{alias}"]["OPTIONS"]["isolation_level"] = "read committed" (Django\'s default when '
             "the option is absent; None means the server's default, REPEATABLE READ unless configured). Under "
             "REPEATABLE READ or SERIALIZABLE the plain reads of a fenced transition see the snapshot of its "
             "first read, not the rows other processes committed since (its locking reads do), and range "
             "reads take gap locks, so claims, starts and signal deliveries wait on or deadlock over rows they "
             "never touch; READ UNCOMMITTED reads writes that may yet roll back.",
        id="weft.E005",
    )]


@register(Tags.database)
def check_unregistered_open_runs(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """Runs still open whose workflow type, or the version of it they started on, no process here can
    execute."""
    alias = _weft_alias()
    if not databases or alias not in databases:
        return []
    from django.db.models import Count

    from django_weft.models import Workflow

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
        if name not in names and not is_registered(name):
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
    """Runs due for a while and no live executor (see django_weft.services.liveness); only when asked to check the
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

    from django_weft.conf import EXECUTORS, weft_settings

    executor = weft_settings.EXECUTOR
    if executor not in EXECUTORS:
        return [Error(f"WEFT_EXECUTOR is {executor!r}; it must be one of {', '.join(map(repr, EXECUTORS))}.",
                      id="weft.E002")]
    if executor == "celery" and find_spec("celery") is None:
        return [Error("WEFT_EXECUTOR is 'celery' but Celery is not installed.",
                      hint="pip install 'django-weft[celery]' and define a Celery app for the project.",
                      id="weft.E003")]
    return []


@register(Tags.compatibility)
def check_workflow_errors(app_configs: Any = None, **kwargs: Any) -> list:
    from django_weft.common.registry import ON_ERROR_CHOICES
    from django_weft.conf import weft_settings

    errors = []
    if weft_settings.WORKFLOW_ERRORS not in ON_ERROR_CHOICES:
        errors.append(Error(f"WEFT_WORKFLOW_ERRORS is {weft_settings.WORKFLOW_ERRORS!r}; it must be one of "
                            f"{', '.join(map(repr, ON_ERROR_CHOICES))}.", id="weft.E006"))
    for name in ("CLEANUP_TIMEOUT", "WORKFLOW_HOLD_MAX_BACKOFF"):
        value = getattr(weft_settings, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 10**9:
            errors.append(Error(f"WEFT_{name} is {value!r}; it must be a positive number of seconds.",
                                id="weft.E007"))
    return errors


@register(Tags.compatibility)
def check_queues(app_configs: Any = None, **kwargs: Any) -> list:
    from django_weft.common.queues import configuration_errors

    return [Error(message, hint='e.g. WEFT_QUEUES = {"emails": {"concurrency": 20, "rate": "100/m"}}',
                  id="weft.E008") for message in configuration_errors()]


@register(Tags.compatibility)
def check_payload_codec(app_configs: Any = None, **kwargs: Any) -> list:
    from django_weft.common import payload_crypto
    from django_weft.conf import weft_settings
    from django_weft.exceptions import ConfigurationError

    try:
        payload_crypto.check(weft_settings.PAYLOAD_CODEC)
    except ConfigurationError as exc:
        return [Error(str(exc), id="weft.E009")]
    return []


@register(Tags.compatibility)
def check_tasks_backends(app_configs: Any = None, **kwargs: Any) -> list:
    """The TASKS entries whose backend is django_weft's (Django's tasks framework): their OPTIONS and QUEUES."""
    from django.core.exceptions import ImproperlyConfigured

    from django_weft.conf import weft_task_backends

    backends = weft_task_backends()
    if not backends:
        return []
    try:
        from django_weft.services import task_runs
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="weft.E010")]
    errors = []
    for alias, config in backends.items():
        queues = set(config.get("QUEUES") or [task_runs.api.DEFAULT_TASK_QUEUE_NAME])
        errors += [Error(f"TASKS[{alias!r}]: {problem}", id="weft.E010")
                   for problem in task_runs.option_problems(config.get("OPTIONS", {}), queues)]
    return errors
