"""Wake idle loops when PostgreSQL announces a change (LISTEN/NOTIFY).

:class:`Doorbell` is what an idle loop waits on: a generation counter under a condition variable. A loop
reads the generation before it looks for work and, finding none, waits for it to change or for its poll
delay to pass; a ring between the look and the wait is therefore not lost.

:class:`Listener` is a thread with its own connection (not Django's thread-local one: it blocks) that
LISTENs on :data:`~django_weft.store.wakeups.CHANNEL` (a run became runnable: rings ``runs``, which idle
executors wait on) and :data:`~django_weft.store.wakeups.SCHEDULE_CHANNEL` (a schedule's next occurrence moved:
rings ``schedules``, which the maintenance loop waits on). When the connection fails it rings both
(something may have been missed), logs, and reconnects after a pause; meanwhile the loops poll at their
interval, as on SQLite.
"""

from __future__ import annotations

import logging
import threading

from django.db import connections

from django_weft.store.wakeups import CHANNEL, SCHEDULE_CHANNEL

logger = logging.getLogger("django_weft.listener")

RECONNECT_SECONDS = 2.0
STOP_CHECK_SECONDS = 0.5


class Doorbell:
    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def ring(self) -> None:
        with self._condition:
            self._generation += 1
            self._condition.notify_all()

    def wait(self, since: int, timeout: float) -> bool:
        """Wait until the bell rang after generation ``since`` or ``timeout`` passed; True if it rang."""
        with self._condition:
            return self._condition.wait_for(lambda: self._generation != since, timeout)


class Listener:
    def __init__(self, alias: str, stop_event: threading.Event) -> None:
        self.alias = alias
        self.runs = Doorbell()
        self.schedules = Doorbell()
        self.stop_event = stop_event
        self._bells = {CHANNEL: self.runs, SCHEDULE_CHANNEL: self.schedules}
        self._thread = threading.Thread(target=self._run, name="weft-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def ring_all(self) -> None:
        for bell in self._bells.values():
            bell.ring()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            wrapper = connections.create_connection(self.alias)
            try:
                wrapper.ensure_connection()
                raw = wrapper.connection
                raw.autocommit = True
                for channel in self._bells:
                    raw.execute(f"LISTEN {channel}")
                self.ring_all()  # changes made before LISTEN took effect
                while not self.stop_event.is_set():
                    for notice in raw.notifies(timeout=STOP_CHECK_SECONDS):
                        self._bells[notice.channel].ring()
            except Exception:
                if self.stop_event.is_set():
                    break
                logger.exception("LISTEN connection failed; polling until it is back in %ss", RECONNECT_SECONDS)
                self.ring_all()
                self.stop_event.wait(RECONNECT_SECONDS)
            finally:
                try:
                    wrapper.close()
                except Exception:
                    pass
