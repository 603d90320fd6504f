"""manage.py weft_maintenance: execute workflow runs and keep timers, leases and retention moving."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_weft.common import clock
from django_weft.common.queues import NO_QUEUE, configured
from django_weft.conf import weft_settings
from django_weft.exceptions import ConfigurationError
from django_weft.models import Schedule, ScheduleStatus
from django_weft.observability import events
from django_weft.observability.access import is_loopback
from django_weft.services.maintenance import maintenance_pass, run_maintenance
from django_weft.services.schedules import sync_schedules
from django_weft.store import transitions
from django_weft.worker.celery_beat import install_beat
from django_weft.worker.loop import Worker


class Command(BaseCommand):
    help = (
        "Run django_weft: execute runnable workflow runs, fire timers and delayed starts, recover runs "
        "of dead executors, time out runs and apply retention. Safe to run in several processes."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true",
                            help="Run one pass (execute everything runnable now) and exit.")
        parser.add_argument("--workers", type=int, default=1, help="Executor threads (default 1).")
        parser.add_argument("--interval", type=float, default=None,
                            help="Seconds between polls when idle (default WEFT_POLL_INTERVAL).")
        parser.add_argument("--no-execute", action="store_true",
                            help="Maintenance only (timeouts, schedules, retention, Celery deliveries); "
                                 "execute no runs. For projects where Celery executes (WEFT_EXECUTOR).")
        parser.add_argument("--queues", default=None,
                            help="Execute only runs of these queues of WEFT_QUEUES (comma-separated; "
                                 f"'{NO_QUEUE}' names runs started without a queue). Default: every run.")
        parser.add_argument("--install-beat", action="store_true",
                            help="Create or update the django-celery-beat periodic task that runs the "
                                 "maintenance pass as the Celery task django_weft.services.maintenance, and exit.")
        parser.add_argument("--every", type=int, default=5,
                            help="With --install-beat: seconds between maintenance passes (default 5).")
        parser.add_argument("--metrics-port", type=int, default=None,
                            help="Serve Prometheus metrics over HTTP on this port (0: any free port, printed) "
                                 "while the loop runs; needs the 'metrics' extra (prometheus-client).")
        parser.add_argument("--metrics-addr", default="127.0.0.1",
                            help="With --metrics-port: the address to listen on (default 127.0.0.1, this host "
                                 "only; 0.0.0.0: every interface, then set WEFT_METRICS_TOKEN).")

    def handle(self, *args: Any, once: bool, workers: int, interval: float | None, no_execute: bool,
               install_beat: bool, every: int, metrics_port: int | None = None, metrics_addr: str = "127.0.0.1",
               queues: str | None = None, **options: Any) -> None:
        if install_beat:
            self.handle_install_beat(every)
            return
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if interval is not None and interval <= 0:
            raise CommandError("--interval must be positive")
        served = None if queues is None else self.served_queues(queues)
        if served is not None and once:
            raise CommandError("--queues selects what the loop executes; it does not combine with --once")
        if not no_execute:
            self.wake_held_runs()
        if once:
            if no_execute:
                now = clock.now()
                report = maintenance_pass(now, window=interval or weft_settings.POLL_INTERVAL)
            else:
                report = run_maintenance()
            self.stdout.write(f"weft_maintenance: {report}")
            return
        server = self.serve_metrics(metrics_port, metrics_addr) if metrics_port is not None else None
        self.sync_schedules()
        worker = Worker(threads=0 if no_execute else workers, interval=interval, queues=served)

        def on_signal(signum: int, frame: Any) -> None:
            # A second SIGTERM/SIGINT must end the process at once whatever the main thread is blocked in,
            # so it gets the operating system's default action rather than another Python handler.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            sys.stderr.write("weft_maintenance: finishing current steps (signal again to exit now)\n")
            sys.stderr.flush()
            worker.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        what = "maintenance only (--no-execute)" if no_execute else f"{workers} executor thread(s)"
        if served is not None and not no_execute:
            what += " for queues " + ", ".join(name or NO_QUEUE for name in served)
        wakeups = "LISTEN/NOTIFY wake-ups" if worker.listener is not None else f"polling every {worker.interval}s"
        self.stdout.write(f"weft_maintenance: running with {what}, {wakeups}; pid {os.getpid()}")
        self.stdout.flush()
        try:
            worker.run()
        finally:
            if server is not None:
                server.shutdown()
        self.stdout.write(f"weft_maintenance: stopped ({dict(worker.outcomes)})")

    def served_queues(self, value: str) -> list[str]:
        """--queues as the claim takes them ("" for runs of no queue); CommandError for an unknown name."""
        names = [name.strip() for name in value.split(",") if name.strip()]
        if not names:
            raise CommandError("--queues needs at least one queue name")
        known = set(configured())
        unknown = [name for name in names if name != NO_QUEUE and name not in known]
        if unknown:
            raise CommandError(f"--queues: {', '.join(map(repr, unknown))} not in WEFT_QUEUES (known: "
                               f"{', '.join(map(repr, sorted(known))) or 'none'}; '{NO_QUEUE}' is runs without "
                               "a queue)")
        return ["" if name == NO_QUEUE else name for name in names]

    def wake_held_runs(self) -> None:
        """This process may run newly deployed code: runs held because their code raised are tried again now."""
        try:
            woken = transitions.wake_held_runs(clock.now())
        except DatabaseError as exc:
            self.stderr.write(f"weft_maintenance: waking the runs held for their code's errors failed ({exc}); "
                              "their backoff wakes them")
            return
        if woken:
            self.stdout.write(f"weft_maintenance: woke {woken} run(s) held because their code raised "
                              "(on_error=\"hold\")")

    def serve_metrics(self, port: int, addr: str) -> Any:
        metrics = events.metrics()
        if metrics is None:
            raise CommandError("--metrics-port needs prometheus-client (pip install 'django-weft[metrics]') and "
                               "WEFT_METRICS not set to False")
        if not 0 <= port <= 65535:
            raise CommandError("--metrics-port must be between 0 and 65535")
        try:
            server = metrics.serve(port, addr)
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: cannot listen on {addr or '*'}:{port}: {exc}") from exc
        self.stdout.write(f"weft_maintenance: metrics at http://{addr}:{server.server_port}/metrics")
        self.stdout.flush()
        if not weft_settings.METRICS_TOKEN and not is_loopback(addr):
            self.stderr.write(f"weft_maintenance: the metrics on {addr or '*'}:{server.server_port} answer anyone "
                              "who can reach them; set WEFT_METRICS_TOKEN or restrict access to the port")
        return server

    def handle_install_beat(self, every: int) -> None:
        try:
            result = install_beat(every)
        except (ConfigurationError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        verb = "created" if result.created else "updated"
        self.stdout.write(f"weft_maintenance: {verb} the django-celery-beat periodic task 'django_weft "
                          f"maintenance' (task django_weft.services.maintenance every {every}s); run beat with "
                          "--scheduler django_celery_beat.schedulers:DatabaseScheduler")
        self.sync_schedules()  # beat runs no weft_maintenance that would sync them at start

    def sync_schedules(self) -> None:
        # Also with the setting empty while schedules it defined are active: removing the last one pauses it.
        if not weft_settings.SCHEDULES and not Schedule.objects.filter(
                from_settings=True, status=ScheduleStatus.ACTIVE).exists():
            return
        report = sync_schedules()
        self.stdout.write(f"weft_maintenance: WEFT_SCHEDULES synced (created {len(report.created)}, "
                          f"updated {len(report.updated)}, unchanged {len(report.unchanged)}, "
                          f"paused {len(report.paused)})")
