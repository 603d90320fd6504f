"""The long-running loop behind ``manage.py weft_maintenance``.

N executor threads claim runnable runs and drive them; a LeaseKeeper renews the leases of the runs they
hold; the calling thread runs the periodic maintenance (execution timeouts, schedules, retention, and
with Celery executing, deliveries no task covers). On PostgreSQL (psycopg 3, WEFT_NOTIFY) a Listener wakes
idle executors as soon as a run becomes runnable, and the maintenance loop when a schedule changes.
The process's heartbeat row (models.Executor, refreshed by the LeaseKeeper's thread) says it is alive
from start to stop; the admin lists it and django_weft.services.liveness reads it. Stopping lets every executor
finish the step it is in, hands its remaining runs back, and returns. With no executor threads
(``--no-execute``) it is the maintenance loop alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from django.db import close_old_connections, connections, router

from django_weft.common import clock
from django_weft.conf import weft_settings
from django_weft.models import ExecutorKind, Workflow
from django_weft.runtime import executor
from django_weft.runtime.lease_keeper import ExecutorRow, LeaseKeeper
from django_weft.services.maintenance import default_owner, maintenance_pass
from django_weft.services.schedule_tick import next_due_at
from django_weft.store import transitions
from django_weft.store.wakeups import can_listen
from django_weft.worker.listener import Doorbell, Listener

logger = logging.getLogger("django_weft.worker")

ERROR_BACKOFF_SECONDS = 2.0
MIN_TICK_DELAY = 0.05
RETENTION_EVERY_SECONDS = 60.0


class Worker:
    def __init__(self, *, threads: int = 1, interval: float | None = None, queues: list[str] | None = None) -> None:
        if threads < 0:
            raise ValueError("executor threads cannot be negative")
        self.threads = threads
        # The queues whose runs its executors claim ("" for runs of no queue); None: every run.
        self.queues = queues
        self.interval = weft_settings.POLL_INTERVAL if interval is None else interval
        self.stop_event = threading.Event()
        self.outcomes: Counter = Counter()
        self.heartbeat = ExecutorRow(ExecutorKind.LOOP, threads)
        self._leases = LeaseKeeper(self.heartbeat)
        self.alias = alias = router.db_for_write(Workflow)
        self.listener: Listener | None = Listener(alias, self.stop_event) if can_listen(alias) else None
        # Without a listener nothing rings but stop(): the loops poll.
        self.run_bell = self.listener.runs if self.listener else Doorbell()
        self.schedule_bell = self.listener.schedules if self.listener else Doorbell()

    # --- control -------------------------------------------------------------------------------------

    def stop(self) -> None:
        self.stop_event.set()
        # The loops wait on their bells, not on stop_event.
        self.run_bell.ring()
        self.schedule_bell.ring()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def run(self) -> None:
        """Run until :meth:`stop` is called; returns once every thread has finished its current step."""
        workers = [
            threading.Thread(target=self._executor_loop, name=f"weft-executor-{i}", daemon=True)
            for i in range(self.threads)
        ]
        self.heartbeat.try_beat(clock.now())
        try:
            # The lease keeper outlives stop(): executors still finishing a step must keep their leases
            # (and the process its heartbeat row).
            with self._leases:
                if self.listener is not None:
                    self.listener.start()
                for thread in workers:
                    thread.start()
                try:
                    self._maintenance_loop()
                finally:
                    self.stop()
                    for thread in workers:
                        thread.join()
                    if self.listener is not None:
                        self.listener.join()
        finally:
            self.heartbeat.try_remove()
            connections.close_all()

    # --- loops ---------------------------------------------------------------------------------------

    def _maintenance_loop(self) -> None:
        last_purge: float | None = None
        while not self.stopping:
            rung = self.schedule_bell.generation  # a schedule changed from here on cuts the wait short
            try:
                close_old_connections()
                now = clock.now()
                stamp = now.timestamp()
                purge = last_purge is None or stamp - last_purge >= RETENTION_EVERY_SECONDS
                report = maintenance_pass(now, window=self.interval, purge=purge)
                if purge:
                    last_purge = stamp
                if report.timed_out or report.schedules_fired or report.purged or report.dispatched or report.admitted:
                    logger.info("maintenance: %s", report)
            except Exception:
                logger.exception("maintenance pass failed; retrying")
            self.schedule_bell.wait(rung, self._next_tick_delay())

    def _executor_loop(self) -> None:
        owner = default_owner()
        try:
            while not self.stopping:
                rung = self.run_bell.generation  # a ring from here on cuts the idle wait short
                try:
                    claims = transitions.claim(owner, clock.now(), weft_settings.CLAIM_BATCH_SIZE,
                                               queues=self.queues)
                except Exception:
                    logger.exception("claiming runs failed; retrying in %ss", ERROR_BACKOFF_SECONDS)
                    close_old_connections()
                    self.stop_event.wait(ERROR_BACKOFF_SECONDS)
                    continue
                if not claims:
                    # An idle thread recycles its connection (CONN_MAX_AGE); a busy one keeps it. One woken for
                    # work recycles it only when it is due (its age, an error): recycling makes the next
                    # statement check the connection first (CONN_HEALTH_CHECKS), a round trip between the
                    # wake-up and its claim.
                    if not self.run_bell.wait(rung, self._idle_delay()) or self._connection_due():
                        close_old_connections()
                    continue
                self._leases.hold(claims)
                self._drive_batch(claims)
        finally:
            connections.close_all()

    def _drive_batch(self, claims: list[transitions.Claim]) -> None:
        claimed_at = time.monotonic()

        def held_up() -> bool:
            return time.monotonic() - claimed_at > executor.BATCH_HOLD_SECONDS

        for index, held in enumerate(claims):
            # Runs still waiting in a batch that a slow run has held up go back to the pool, where idle
            # executors can take them. A run that goes on for longer than that while others of its batch
            # wait gives itself back after its current step: without LISTEN/NOTIFY one poll can find many
            # runs at once, and an endless run must not starve the rest of its batch.
            others_wait = index < len(claims) - 1

            def should_stop(others_wait: bool = others_wait) -> bool:
                return self.stopping or (others_wait and held_up())
            self._drive(held, hand_back=self.stopping or held_up(), should_stop=should_stop)

    def _drive(self, held: transitions.Claim, *, hand_back: bool, should_stop: Callable[[], bool]) -> None:
        try:
            if hand_back:
                outcome = executor.hand_back(held)
            else:
                outcome = executor.execute(held, should_stop)
            self.outcomes[outcome] += 1
        except Exception:
            # A database error mid-run: the lease runs out and another executor takes the run over.
            logger.exception("executing run %s failed; it is retried when its lease expires", held.run.pk)
        finally:
            self._leases.drop(held)

    def _connection_due(self) -> bool:
        """This thread's connection is one close_old_connections() would act on: too old, or it failed."""
        connection = connections[self.alias]
        expires = connection.close_at
        return connection.errors_occurred or (expires is not None and time.monotonic() >= expires)

    def _next_tick_delay(self) -> float:
        """Until the next schedule is due (ticks must be on time: late ones count as missed), at most
        the poll interval."""
        try:
            soonest = next_due_at()
        except Exception:
            return self.interval
        if soonest is None:
            return self.interval
        # Overdue rows may be locked by another process's tick: poll briefly instead of spinning.
        return max(MIN_TICK_DELAY, min(self.interval, (soonest - clock.now()).total_seconds()))

    def _idle_delay(self) -> float:
        try:
            soonest: datetime | None = (
                Workflow.objects.filter(runnable_at__isnull=False).order_by("runnable_at")
                .values_list("runnable_at", flat=True).first()
            )
        except Exception:
            return self.interval
        if soonest is None:
            return self.interval
        return max(0.0, min(self.interval, (soonest - clock.now()).total_seconds()))
