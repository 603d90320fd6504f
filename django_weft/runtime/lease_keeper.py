"""Keep the leases of the runs an executor holds alive while it works on them, and the process's own
heartbeat row (:class:`~django_weft.models.Executor`) with them."""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import uuid
import weakref
from datetime import datetime, timedelta
from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from types import TracebackType
from typing import Any

from django.db import close_old_connections, connections

from django_weft.common import clock
from django_weft.conf import weft_settings
from django_weft.models import Executor
from django_weft.store import leases, transitions

logger = logging.getLogger("django_weft.leases")

# A process's row counts as dead once it missed this many heartbeats (django_weft.services.liveness reads it).
MISSED_BEATS = 3


@cache
def weft_version() -> str:
    try:
        return package_version("django-weft")[:32]
    except PackageNotFoundError:
        return ""


class ExecutorRow:
    """This process's heartbeat row: one INSERT when it starts, one small UPDATE per heartbeat, one DELETE
    when it stops cleanly.

    The row says it is alive until ``expires_at`` (``MISSED_BEATS`` heartbeats ahead, or ``grace``), so a
    reader needs no knowledge of the writer's settings. A beat that finds its row gone (purged while this
    process was frozen, or a test flushed the table) inserts it again.
    """

    def __init__(self, kind: str, threads: int, *, grace: timedelta | None = None) -> None:
        self.kind = kind
        self.threads = threads
        self.grace = grace
        self.pk = uuid.uuid4()
        self.pid = os.getpid()
        self.started_at: datetime | None = None

    def _expiry(self, now: datetime) -> datetime:
        grace = self.grace or timedelta(seconds=MISSED_BEATS * weft_settings.HEARTBEAT_SECONDS)
        return now + grace

    def _insert(self, now: datetime) -> None:
        if self.started_at is None:
            self.started_at = now
        Executor.objects.create(pk=self.pk, kind=self.kind, host=socket.gethostname()[:255], pid=self.pid,
                                threads=self.threads, version=weft_version(), started_at=self.started_at,
                                last_seen=now, expires_at=self._expiry(now))

    def beat(self, now: datetime) -> None:
        """Insert the row (first beat) or refresh it."""
        if self.started_at is None:
            self._insert(now)
            return
        if not Executor.objects.filter(pk=self.pk).update(last_seen=now, expires_at=self._expiry(now)):
            self._insert(now)

    def remove(self) -> None:
        Executor.objects.filter(pk=self.pk).delete()

    def try_beat(self, now: datetime) -> bool:
        """:meth:`beat`, logging instead of raising: a heartbeat must never stop the work it reports on."""
        try:
            self.beat(now)
            return True
        except Exception:
            logger.exception("recording this executor's heartbeat failed; retrying at the next one")
            return False

    def try_remove(self) -> None:
        try:
            self.remove()
        except Exception:
            logger.exception("deleting this executor's heartbeat row failed; it expires on its own")


# The keepers of this process: a cancel requested here reaches a run it executes at once (from another process,
# at the next renewal).
_live_keepers: weakref.WeakSet[LeaseKeeper] = weakref.WeakSet()


def _cancel_requested_here(run_id: Any) -> None:
    for keeper in list(_live_keepers):
        keeper.mark_cancel_requested(run_id)


transitions.on_cancel_requested(_cancel_requested_here)


class LeaseKeeper:
    """A background thread that renews the leases of held runs every WEFT_HEARTBEAT_SECONDS, and refreshes
    the process's heartbeat row (``heartbeat``, if given) as often.

    A run whose renewal finds the fence moved is marked lost, so its executor stops before its next
    step instead of discovering it at commit time.
    """

    def __init__(self, heartbeat: ExecutorRow | None = None) -> None:
        self._held: set[transitions.Claim] = set()
        self._heartbeat = heartbeat
        self._lock = threading.Lock()
        self._done = threading.Event()
        # Renew with the creator's clock (run_maintenance(now=...) sets it in a context variable).
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._loop,), name="weft-heartbeat",
                                        daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        _live_keepers.add(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _live_keepers.discard(self)
        self._done.set()
        self._thread.join()

    def mark_cancel_requested(self, run_id: Any) -> None:
        with self._lock:
            for held in self._held:
                if held.run.pk == run_id:
                    held.cancel_requested = True

    def hold(self, claims: list[transitions.Claim]) -> None:
        with self._lock:
            self._held.update(claims)

    def drop(self, claim: transitions.Claim) -> None:
        with self._lock:
            self._held.discard(claim)

    def _loop(self) -> None:
        recycle = False  # the last beat or renewal failed: its connection may be broken
        try:
            while not self._done.wait(weft_settings.HEARTBEAT_SECONDS):
                with self._lock:
                    held = list(self._held)
                if not held and self._heartbeat is None:
                    connections.close_all()  # an idle keeper (weft.run's, between runs) holds no connection
                    continue
                now = clock.now()
                # Recycling checks the connection with a query of its own (CONN_HEALTH_CHECKS), so an idle
                # process does it only after a failure: its heartbeat stays one UPDATE per interval.
                if held or recycle:
                    close_old_connections()
                recycle = self._heartbeat is not None and not self._heartbeat.try_beat(now)
                if not held:
                    continue
                try:
                    leases.renew(held, now)
                except Exception:
                    recycle = True
                    logger.exception("renewing leases failed; retrying")
        finally:
            connections.close_all()
