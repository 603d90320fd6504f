"""The activity attempts this process runs now, published for operators once they have run for PUBLISH_AFTER
seconds (design 9.5). A thread of its own does the writing, about once a second while attempts run, so an attempt
that ends sooner costs nothing but two dictionary operations: no statement, no commit on the step's path. (Not the
lease keeper's thread: a row written here references its run, and a run row another transaction holds locked would
hold up the renewal of every other lease.)"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django_weft.common import clock
from django_weft.store import in_flight

logger = logging.getLogger("django_weft.leases")

PUBLISH_AFTER = 1.0
TICK_SECONDS = 1.0


@dataclass
class _Entry:
    key: tuple[Any, int, int]  # run id, seq, attempt
    activity: str
    executor: str
    began: float  # monotonic
    started_at: datetime
    timeout: float | None
    published: bool = field(default=False)


_running: dict[int, _Entry] = {}
_ended: list[tuple[Any, int, int]] = []  # published attempts that ended, to withdraw
_lock = threading.Lock()


_publisher: threading.Thread | None = None


def began(token: int, run_id: Any, seq: int, attempt: int, *, activity: str, executor: str,
          timeout: float | None) -> None:
    global _publisher
    entry = _Entry((run_id, seq, attempt), activity, executor, time.monotonic(), clock.now(), timeout)
    with _lock:
        _running[token] = entry
        if _publisher is None or not _publisher.is_alive():
            _publisher = threading.Thread(target=_publish_while_running, name="weft-in-flight", daemon=True)
            _publisher.start()


def _publish_while_running() -> None:
    """Tick while attempts run or wait to be withdrawn; end (closing its connection) once there are none."""
    global _publisher
    from django.db import connections

    try:
        while True:
            time.sleep(TICK_SECONDS)
            publish_due()
            with _lock:
                if not _running and not _ended:
                    _publisher = None
                    return
    finally:
        connections.close_all()


def ended(token: int) -> None:
    with _lock:
        entry = _running.pop(token, None)
        if entry is not None and entry.published:
            _ended.append(entry.key)


def publish_due() -> None:
    """Publish the attempts running for over PUBLISH_AFTER seconds, withdraw the published ones that ended. A failure
    is logged, and tried again at the next tick."""
    now_mono = time.monotonic()
    with _lock:
        due = [entry for entry in _running.values() if not entry.published and now_mono - entry.began >= PUBLISH_AFTER]
        gone, _ended[:] = list(_ended), []
        for entry in due:
            entry.published = True
    if not due and not gone:
        return
    try:
        if gone:
            in_flight.withdraw(gone)
        if due:
            in_flight.publish([in_flight.Published(
                run_id=e.key[0], seq=e.key[1], attempt=e.key[2], activity=e.activity, executor=e.executor,
                started_at=e.started_at,
                timeout_at=None if e.timeout is None else e.started_at + timedelta(seconds=e.timeout),
            ) for e in due], clock.now())
    except Exception:
        logger.exception("publishing the attempts in flight failed; trying again")
        with _lock:
            _ended.extend(gone)
            for entry in due:
                entry.published = False
