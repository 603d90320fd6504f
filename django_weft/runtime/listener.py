"""Wake idle executor threads when PostgreSQL announces a runnable run (LISTEN/NOTIFY).

:class:`Doorbell` is what idle executors wait on: a generation counter under a condition variable. An
executor reads the generation before it claims and, finding nothing, waits for it to change or for its
poll delay to pass; a ring between the claim and the wait is therefore not lost.

:class:`Listener` is a thread with its own connection (not Django's: it blocks) that LISTENs on
:data:`django_weft.wakeups.CHANNEL` and rings the bell for every notification. When the connection fails
it rings (something may have been missed), logs, and reconnects after a pause; meanwhile executors poll at
their interval, as on SQLite.
"""

from __future__ import annotations

import logging
import threading

from django.db import connections

from ..wakeups import CHANNEL

logger = logging.getLogger("django_weft.listener")

RECONNECT_SECONDS = 2.0
STOP_CHECK_SECONDS = 0.5


class Doorbell:
    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._generation = 0
        self.rings = 0

    @property
    def generation(self) -> int:
        return self._generation

    def ring(self) -> None:
        with self._condition:
            self._generation += 1
            self.rings += 1
            self._condition.notify_all()

    def wait(self, since: int, timeout: float) -> bool:
        """Wait until the bell rang after generation ``since`` or ``timeout`` passed; True if it rang."""
        with self._condition:
            return self._condition.wait_for(lambda: self._generation != since, timeout)


class Listener:
    def __init__(self, alias: str, bell: Doorbell, stop_event: threading.Event) -> None:
        self.alias = alias
        self.bell = bell
        self.stop_event = stop_event
        self.listening = threading.Event()  # set while a LISTEN connection is up (tests wait on it)
        self._thread = threading.Thread(target=self._run, name="weft-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            wrapper = connections.create_connection(self.alias)
            try:
                wrapper.ensure_connection()
                raw = wrapper.connection
                raw.autocommit = True
                raw.execute(f"LISTEN {CHANNEL}")
                self.listening.set()
                self.bell.ring()  # runs made runnable before LISTEN took effect
                while not self.stop_event.is_set():
                    for _ in raw.notifies(timeout=STOP_CHECK_SECONDS):
                        self.bell.ring()
            except Exception:
                self.listening.clear()
                if self.stop_event.is_set():
                    break
                logger.exception("LISTEN connection failed; polling until it is back in %ss", RECONNECT_SECONDS)
                self.bell.ring()
                self.stop_event.wait(RECONNECT_SECONDS)
            finally:
                self.listening.clear()
                try:
                    wrapper.close()
                except Exception:
                    pass
