"""Keep the leases of the runs an executor holds alive while it works on them."""

from __future__ import annotations

import contextvars
import logging
import threading
from types import TracebackType

from django.db import close_old_connections, connections

from .. import clock, transitions
from ..conf import weft_settings

logger = logging.getLogger("django_weft.leases")


class LeaseKeeper:
    """A background thread that renews the leases of held runs every WEFT_HEARTBEAT_SECONDS.

    A run whose renewal finds the fence moved is marked lost, so its executor stops before its next
    step instead of discovering it at commit time.
    """

    def __init__(self) -> None:
        self._held: set[transitions.Claim] = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        # Renew with the creator's clock (run_maintenance(now=...) sets it in a context variable).
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._loop,), name="weft-heartbeat",
                                        daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def hold(self, claims: list[transitions.Claim]) -> None:
        with self._lock:
            self._held.update(claims)

    def drop(self, claim: transitions.Claim) -> None:
        with self._lock:
            self._held.discard(claim)

    def _loop(self) -> None:
        try:
            while not self._done.wait(weft_settings.HEARTBEAT_SECONDS):
                with self._lock:
                    held = list(self._held)
                if not held:
                    continue
                try:
                    close_old_connections()
                    transitions.renew(held, clock.now())
                except Exception:
                    logger.exception("renewing leases failed; retrying")
        finally:
            connections.close_all()
