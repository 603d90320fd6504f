"""Waiting for a NOTIFY from the executor while a caller waits for something a run writes (an update's reply, an
event, a stream's next value): LISTEN on PostgreSQL, polling elsewhere."""

from __future__ import annotations

import logging
import time
from collections.abc import Container
from typing import Any

from django.db import connections

from django_weft.store.wakeups import can_listen

logger = logging.getLogger("django_weft.notices")


class Listener:
    """LISTEN on ``channel`` while the caller waits; elsewhere, with WEFT_NOTIFY off, with autocommit off or inside a
    transaction (a LISTEN takes effect at a commit) or on psycopg2, ``wait`` just sleeps and the caller polls.

    It listens on the caller's own connection and stops listening when the wait ends: a connection of its own took
    longer to open than the rest of an update's round trip. A notification that arrives while the caller reads is
    kept by psycopg (3.2.4 and later) for the next ``notifies()``; were one missed, the caller looks again within
    a second. (A project's own LISTEN on the same connection would see its notifications taken by this wait.)"""

    def __init__(self, alias: str, channel: str, payloads: Container[str], *, listen: bool = True) -> None:
        self._alias, self._channel, self._payloads = alias, channel, payloads
        connection = connections[alias]
        self.polls = not (listen and can_listen(alias) and connection.get_autocommit()
                          and not connection.in_atomic_block)
        self._raw: Any = None

    def __enter__(self) -> Listener:
        if not self.polls:
            connection = connections[self._alias]
            connection.ensure_connection()
            with connection.wrap_database_errors:
                connection.connection.execute(f"LISTEN {self._channel}")  # before the first look: none missed
            self._raw = connection.connection
        return self

    def wait(self, seconds: float) -> None:
        """Until a notification of one of ``payloads`` arrives, or ``seconds`` pass."""
        if self._raw is None:
            time.sleep(max(0.0, seconds))
            return
        with connections[self._alias].wrap_database_errors:
            for notice in self._raw.notifies(timeout=max(0.0, seconds)):
                if notice.channel == self._channel and notice.payload in self._payloads:
                    return

    def __exit__(self, *exc: Any) -> None:
        if self._raw is None:
            return
        try:
            self._raw.execute(f"UNLISTEN {self._channel}")
        except BaseException as error:
            # It must not go on listening (every notification would pile up in it): closed (a pool drops it), and
            # Django opens a new one at the next query.
            self._raw.close()
            connections[self._alias].close()
            if not isinstance(error, Exception):
                raise
            logger.warning("UNLISTEN %s failed; the connection is closed", self._channel, exc_info=True)
