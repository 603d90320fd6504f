"""Prometheus metrics (the "metrics" extra): imported by :func:`.events.configure` only when
prometheus_client is installed and WEFT_METRICS is not False.

Counters and histograms are per process: each process (web workers, weft_maintenance, Celery workers)
counts what it did, and Prometheus sums them over its scrape targets. The backlog gauges are read from the
database at scrape time (:class:`DatabaseGauges`), so any one process's endpoint reports them for the
whole deployment. With ``PROMETHEUS_MULTIPROC_DIR`` set (a web server with several worker processes),
:func:`render` merges the workers' counters the way prometheus_client's multiprocess mode does.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from functools import lru_cache
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.db import connections
from django.db.models import Count, Min, Q
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from django_weft.common import clock
from django_weft.common.queues import LIMIT_KEYS, NO_QUEUE, limits_from
from django_weft.common.queues import configured as configured_queues
from django_weft.conf import weft_settings
from django_weft.models import QueueState, RunStatus, Schedule, ScheduleStatus, Timer, Workflow
from django_weft.observability.access import bearer_token, is_metrics_token

logger = logging.getLogger("django_weft.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Steps and executions last from milliseconds (a value) to days (a durable sleep, a signal wait).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 6 * 3600,
                    86400, 7 * 86400, float("inf"))
ATTEMPT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, float("inf"))

REGISTRY = CollectorRegistry()

RUNS_STARTED = Counter("weft_runs_started", "Runs started (inserted), by workflow type.", ["workflow_type"],
                       registry=REGISTRY)
RUNS_FINISHED = Counter("weft_runs_finished", "Runs that reached a terminal status, by workflow type and status.",
                        ["workflow_type", "status"], registry=REGISTRY)
STEP_SECONDS = Histogram("weft_step_duration_seconds", "Journal steps from start to finish (as recorded), by kind.",
                         ["kind"], buckets=DURATION_BUCKETS, registry=REGISTRY)
ATTEMPT_SECONDS = Histogram("weft_activity_attempt_duration_seconds",
                            "Activity attempts, by activity and outcome (completed, failed, async).",
                            ["activity", "outcome"], buckets=ATTEMPT_BUCKETS, registry=REGISTRY)
EXECUTION_SECONDS = Histogram("weft_run_execution_duration_seconds",
                              "Executions of a run (claim to park or finish), by workflow type and outcome.",
                              ["workflow_type", "outcome"], buckets=ATTEMPT_BUCKETS, registry=REGISTRY)
TAKEOVERS = Counter("weft_lease_takeovers", "Runs taken over after their executor's lease expired.",
                    ["workflow_type"], registry=REGISTRY)
DEADLOCK_RETRIES = Counter("weft_deadlock_retries",
                           "Transitions run again after the database aborted them over locks, by transition and "
                           "reason (deadlock, lock_wait_timeout).", ["transition", "reason"], registry=REGISTRY)
BUSY = Gauge("weft_executor_threads_busy", "Executions of runs in progress in this process.",
             multiprocess_mode="livesum", registry=REGISTRY)

# --- what the hooks in .events call ---------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once: the hooks run several times per step."""
    return metric.labels(*labels)


def execution_began() -> None:
    BUSY.inc()


def execution_ended(workflow_type: str, outcome: str, seconds: float) -> None:
    BUSY.dec()
    _child(EXECUTION_SECONDS, workflow_type, outcome).observe(seconds)


def takeover(workflow_type: str) -> None:
    _child(TAKEOVERS, workflow_type).inc()


def lock_retry(transition: str, reason: str) -> None:
    _child(DEADLOCK_RETRIES, transition, reason).inc()


def attempt_ended(activity: str, outcome: str, seconds: float) -> None:
    _child(ATTEMPT_SECONDS, activity, outcome).observe(seconds)


def step_ended(kind: str, seconds: float) -> None:
    _child(STEP_SECONDS, kind).observe(max(0.0, seconds))


# Runs are counted where the run signals are sent: once, after the commit that started or ended them.
def run_started(workflow_type: str) -> None:
    _child(RUNS_STARTED, workflow_type).inc()


def run_finished(workflow_type: str, status: str) -> None:
    _child(RUNS_FINISHED, workflow_type, status).inc()


# --- read from the database at scrape time ----------------------------------------------------------------


class DatabaseGauges:
    """The backlog as the database has it now: four COUNT/MIN queries over the partial indexes that serve
    the claim (weft_runnable_idx), the due timers and the due schedules."""

    def collect(self) -> Iterator[Metric]:
        now = clock.now()
        runnable = Workflow.objects.runnable(now)
        oldest = runnable.aggregate(oldest=Min("runnable_at"))["oldest"]
        yield _gauge("weft_runnable_runs", "Runs runnable now (claimable: due, woken, or with an expired lease).",
                     runnable.count())
        yield _gauge("weft_runnable_oldest_age_seconds", "How long the oldest runnable run has waited (0: none).",
                     _age(now, oldest))
        yield _gauge("weft_timers_overdue", "Unfired timers whose time has passed.",
                     Timer.objects.filter(fired_at__isnull=True, fire_at__lte=now).count())
        due = Schedule.objects.filter(status=ScheduleStatus.ACTIVE, due_at__isnull=False, due_at__lte=now)
        yield _gauge("weft_schedule_lag_seconds", "How late the most overdue active schedule is (0: none).",
                     _age(now, due.aggregate(soonest=Min("due_at"))["soonest"]))
        yield from _queue_gauges(now)


def _queue_gauges(now: datetime) -> Iterator[Metric]:
    """Per queue (WEFT_QUEUES; "default" for queued runs of no queue): backlog, admitted, oldest wait, the runs a
    rate limit holds back, admissions ever."""
    queued = Q(status=RunStatus.QUEUED)
    rows = (Workflow.objects.filter(status__in=[RunStatus.QUEUED, *RunStatus.admitted_values()])
            .exclude(queue="", status__in=RunStatus.admitted_values()).values("queue").order_by()
            .annotate(backlog=Count("pk", filter=queued),
                      admitted=Count("pk", filter=~queued),
                      oldest=Min("admit_at", filter=queued & Q(admit_at__lte=now))))
    by_queue: dict[str, dict[str, Any]] = {row["queue"] or NO_QUEUE: dict(row) for row in rows}
    states = {state.name: state for state in QueueState.objects.all()}
    names = sorted(set(by_queue) | set(states) | set(configured_queues()))
    families = {
        "backlog": GaugeMetricFamily("weft_queue_backlog", "Queued runs, by queue.", labels=["queue"]),
        "admitted": GaugeMetricFamily("weft_queue_admitted", "Admitted runs still open, by queue.", labels=["queue"]),
        "oldest": GaugeMetricFamily("weft_queue_oldest_wait_seconds",
                                    "How long the longest-waiting ready queued run has waited (0: none).",
                                    labels=["queue"]),
        "rate_limited": GaugeMetricFamily("weft_queue_rate_limited",
                                          "Ready runs the last admission pass held back for a rate limit.",
                                          labels=["queue"]),
    }
    admissions = CounterMetricFamily("weft_queue_admissions", "Runs admitted, by queue.", labels=["queue"])
    limits = GaugeMetricFamily("weft_queue_limit", "A queue's limits in force (the rates in admissions per second).",
                               labels=["queue", "limit"])
    for name in names:
        row = by_queue.get(name, {})
        families["backlog"].add_metric([name], row.get("backlog", 0))
        families["admitted"].add_metric([name], row.get("admitted", 0))
        families["oldest"].add_metric([name], _age(now, row.get("oldest")))
        state = states.get(name)
        families["rate_limited"].add_metric([name], state.rate_limited if state else 0)
        admissions.add_metric([name], state.admitted_total if state else 0)
        values = {**(configured_queues().get(name) or {}), **(state.overrides if state else {})}
        in_force = limits_from({k: v for k, v in values.items() if k in LIMIT_KEYS})
        for limit in LIMIT_KEYS:
            value = getattr(in_force, limit)
            if value is not None:
                limits.add_metric([name, limit], value if isinstance(value, int) else value.count / value.period)
    yield from families.values()
    yield admissions
    yield limits


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _age(now: datetime, moment: datetime | None) -> float:
    return max(0.0, (now - moment).total_seconds()) if moment is not None else 0.0


REGISTRY.register(DatabaseGauges())


def render(*, close_connections: bool = False) -> bytes:
    """The metrics in Prometheus' text format: this process's (in multiprocess mode, every worker's)
    counters and histograms, and the database gauges. ``close_connections``: the metrics server's thread,
    which must not keep a connection open between scrapes."""
    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        registry.register(DatabaseGauges())
    try:
        return generate_latest(registry)
    finally:
        if close_connections:
            connections.close_all()


# A scraper sends its request at once; a connection silent for this long is dropped (socketserver's timeout).
CLIENT_TIMEOUT = 10.0


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # one line per scrape would flood the log
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per connection: a client that connects and sends nothing holds up only its own thread,
    until CLIENT_TIMEOUT, not every scrape after it."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr for a client that timed out or went away.
        logger.debug("metrics request from %s failed", client_address, exc_info=True)


def _app(environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
    if weft_settings.METRICS_TOKEN:  # as for weft/metrics/: with a token set, a scrape must send it
        if not is_metrics_token(bearer_token(str(environ.get("HTTP_AUTHORIZATION", "")))):
            body = b"Authorization: Bearer <WEFT_METRICS_TOKEN> needed\n"
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
                                                ("WWW-Authenticate", 'Bearer realm="django_weft metrics"')])
            return [body]
    try:
        body, status = render(close_connections=True), "200 OK"
    except Exception:
        logger.exception("collecting metrics failed")
        body, status = b"collecting metrics failed; see the process's log\n", "503 Service Unavailable"
    start_response(status, [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
    return [body]


def serve(port: int, addr: str = "127.0.0.1") -> WSGIServer:
    """Serve :func:`render` at any path from daemon threads (``weft_maintenance --metrics-port``), on this
    host only unless ``addr`` says otherwise; port 0 picks a free one (``server.server_port``).
    ``server.shutdown()`` stops it."""
    server = make_server(addr, port, _app, server_class=_Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="weft-metrics", daemon=True).start()
    return server
