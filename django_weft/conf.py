"""Lazy access to WEFT_* settings.

A setting is read from ``django.conf.settings`` at its first use and kept until Django announces a change of
a WEFT_* setting (``setting_changed``: ``override_settings``, pytest-django's ``settings`` fixture), so
``override_settings`` works and the engine's hot path does not pay Django's settings lookup (an exception for
every setting left at its default) a dozen times a step. Code that assigns ``settings.WEFT_*`` directly calls
``weft_settings.reload()`` after it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Largest encoded payload (input, result, activity result) in bytes.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Payloads encrypted at rest (common.payload_crypto): {"keys": {key id: base64 of 32 bytes, ...}, "current": key
    # id}; None stores them as they are.
    "PAYLOAD_CODEC": None,
    # How long a claim on a run lasts without renewal; a dead executor's runs wait this long.
    "LEASE_SECONDS": 30.0,
    # How often a worker renews the leases of the runs it holds.
    "HEARTBEAT_SECONDS": 10.0,
    # How many runnable runs one claim transaction takes.
    "CLAIM_BATCH_SIZE": 10,
    # Loop poll interval when nothing is runnable.
    "POLL_INTERVAL": 1.0,
    # How long finished runs are kept, per terminal status; None keeps them forever.
    "RETENTION": {
        "completed": timedelta(days=7),
        "cancelled": timedelta(days=7),
        "failed": timedelta(days=30),
        "timed_out": timedelta(days=30),
        "continued": timedelta(days=7),
    },
    # Salt of the signed task tokens of async activities (Django's signing, keyed by SECRET_KEY).
    "TOKEN_SALT": "django_weft.task_token",
    # Largest request body the completion endpoints (django_weft.urls) and the HTTP API accept, in bytes.
    "MAX_REQUEST_BYTES": 2 * 1024 * 1024,
    # The longest an HTTP API request waits for a result or an update's reply, in seconds (the API's cap
    # of 30 still holds): lower it where proxies cut idle requests sooner.
    "API_MAX_WAIT_SECONDS": 30.0,
    # How late the latest occurrence of a schedule without backfill may still start (a schedule's own
    # catchup_window, when set, says instead): a deploy that restarts the only weft_maintenance at 03:00 must not
    # skip the nightly job. Older occurrences are counted as missed.
    "SCHEDULE_LATE_START": timedelta(hours=1),
    # How long the trace of schedule decisions (ScheduleOccurrence rows) is kept; None keeps it forever.
    "SCHEDULE_HISTORY": timedelta(days=30),
    # Schedules defined in code: {"nightly": {"workflow": "reports.nightly", "cron": "0 3 * * *", ...}}.
    "SCHEDULES": {},
    # Module searched in every installed app for workflows and activities.
    "AUTODISCOVER_MODULE": "workflows",
    # Who executes runs: "loop" (manage.py weft_maintenance) or "celery" (the task django_weft.drive,
    # sent after commit whenever a run becomes runnable; weft_maintenance or the django_weft.services.maintenance
    # task still has to run for timeouts, schedules, retention and lost deliveries).
    "EXECUTOR": "loop",
    # PostgreSQL: NOTIFY idle weft_maintenance loops when a run becomes runnable, so they start it at once
    # instead of at their next poll. Ignored on other databases.
    "NOTIFY": True,
    # PostgreSQL: step commits of several runs ready at the same moment (executor threads, weft.run() callers
    # of one process) go as one statement, each still fenced on its own run (django_weft.store.group_commit). Off by
    # default: it sends fewer commits but keeps one statement in flight per process, which was slower where the
    # database's CPU, not its commits, was the limit (README, Benchmarks).
    "GROUP_COMMIT": False,
    # PostgreSQL: prepare the engine's hot statements (a run's insert, a step commit) on each connection, whatever
    # Django's OPTIONS["prepare_threshold"]; a connection whose pooler refuses them stops (store.bound_cursor).
    "PREPARED_STATEMENTS": True,
    # Celery queue of the django_weft tasks (None: the project's default queue).
    "CELERY_QUEUE": None,
    # Celery: a run that becomes runnable within this many seconds (a short sleep, a retry backoff, a
    # delayed start) is sent with that ETA at once; later ones are sent by the maintenance pass before
    # they are due.
    "CELERY_ETA_HORIZON": 60.0,
    # Celery: a django_weft.drive task hands its run back (to another task) after the step that passes this
    # many seconds, so no task runs for long and a worker's warm shutdown is not held up by a long workflow.
    "CELERY_TASK_SECONDS": 30.0,
    # Celery: at most this many batch tasks per maintenance pass for runs that are due but were never
    # delivered (lost messages, crashed workers, long timers); each one claims WEFT_CLAIM_BATCH_SIZE runs.
    "CELERY_DISPATCH_LIMIT": 100,
    # Celery: the longest a send of a django_weft task may wait for the broker (connect, publish, confirm), in
    # seconds; one that fails or times out is left to the maintenance pass, and the process sends nothing for
    # as long again. A web request that starts a run waits at most about this long for a broker that hangs.
    "CELERY_SEND_TIMEOUT": 5.0,
    # Activity attempts of one run that execute at once (ctx.start_activity, ctx.gather, ctx.map); more wait
    # for a free slot.
    "MAX_PARALLEL_ACTIVITIES": 8,
    # How long the cleanup of a cancelled run may take (seconds from the cancel request; with ctx.cleanup() its
    # durable calls run again), after which the run is terminated. @weft.workflow(cleanup_timeout=...) per type.
    "CLEANUP_TIMEOUT": 300.0,
    # What an exception raised by a workflow's own code (a bug: not an activity's failure, not
    # weft.ApplicationError, not a cancel) does: "fail" the run, or "hold" it, retried with backoff (up to
    # WORKFLOW_HOLD_MAX_BACKOFF seconds) and after each deploy. @weft.workflow(on_error=...) per type.
    "WORKFLOW_ERRORS": "fail",
    "WORKFLOW_HOLD_MAX_BACKOFF": 600.0,
    # Journal rows one run may hold: the step that would pass it ends the run as timed_out
    # (termination_reason "history_limit"); use ctx.continue_as_new() long before.
    "MAX_HISTORY": 20_000,
    # Journal rows of replayed runs a process keeps the state of, so queries and update admissions on a run that
    # has not moved since answer without replaying its journal again (services.replay_cache); 0 keeps none.
    "REPLAY_CACHE_ROWS": 20_000,
    # Journal rows of the runs it parked an executor process keeps, so that a run's next wake in the same process
    # reads none from the database when no other executor held it in between (runtime.kept_journals); 0 keeps none.
    "EXECUTOR_CACHE_ROWS": 20_000,
    # Journal rows of the runs whose workflow code each executor thread keeps suspended where they parked, so a
    # run's next wake on that thread goes on from there without replaying (runtime.sticky_runs); 0 keeps none.
    "STICKY_ROWS": 20_000,
    # Takeovers of a run at the same step (its executors keep dying there) before it fails with
    # failure_category "system".
    "MAX_RECOVERY_ATTEMPTS": 10,
    # Queues that admit runs (weft.start(..., queue=)): name -> {"concurrency": N, "concurrency_per_key": M,
    # "rate": "100/m", "rate_per_key": "1/s"}; see django_weft.common.queues.
    "QUEUES": {},
    # The typed, indexed search attributes runs may carry: name -> "int", "keyword", "text", "decimal",
    # "datetime", "bool" or "keyword_list" (see django_weft.common.attributes).
    "SEARCH_ATTRIBUTES": {},
    # Prometheus metrics (the "metrics" extra): None turns them on when prometheus_client is installed, False
    # off. Read once, when Django starts (django_weft.observability.configure): the engine's hooks check a
    # module flag, so metrics that are off cost nothing.
    "METRICS": None,
    # OpenTelemetry spans and trace links (the "tracing" extra): None turns them on when opentelemetry-api is
    # installed, False off. Read once, when Django starts, like METRICS.
    "TRACING": None,
    # The metrics/ view (django_weft.urls) answers anyone: for a Prometheus that scrapes without logging in.
    # Otherwise it needs a staff user or METRICS_TOKEN.
    "METRICS_PUBLIC": False,
    # A secret a scraper sends as "Authorization: Bearer <token>" to read metrics/ (None: staff users only).
    "METRICS_TOKEN": None,
}

EXECUTORS = ("loop", "celery")


class WeftSettings:
    def __init__(self) -> None:
        self._read: dict[str, Any] = {}
        # Counts reloads: a value read while a reload happened (another thread's override_settings) is not kept.
        self._generation = 0

    def __getattr__(self, name: str) -> Any:
        try:
            return self._read[name]
        except KeyError:
            pass
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown django_weft setting WEFT_{name}")
        generation = self._generation
        value = getattr(settings, f"WEFT_{name}", DEFAULTS[name])
        if name == "RETENTION":
            merged = dict(DEFAULTS["RETENTION"])
            merged.update(value)
            return merged  # a copy each time: callers may change it
        if generation == self._generation:
            self._read[name] = value
        return value

    def reload(self) -> None:
        """Forget what was read: the next use of each setting reads it again."""
        self._generation += 1
        self._read.clear()


weft_settings = WeftSettings()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("WEFT_"):
        weft_settings.reload()


setting_changed.connect(_setting_changed, dispatch_uid="django_weft.conf")


def weft_task_backends() -> dict[str, dict]:
    """The entries of TASKS (Django's tasks framework) whose backend is django_weft's, by alias."""
    backends = getattr(settings, "TASKS", None)
    if not isinstance(backends, dict):
        return {}
    return {alias: config for alias, config in backends.items()
            if isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("django_weft.")}
