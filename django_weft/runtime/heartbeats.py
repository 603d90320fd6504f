"""Heartbeats from inside an activity: proof of life that keeps the run's lease, progress details kept for
the step's next attempt, and the channel through which the engine asks a running attempt to stop.

An outside system working on an async activity beats with its task token instead
(:func:`heartbeat_async`): that renews the parked attempt's ``heartbeat_timeout`` and stores its details the
same way, and answers whether the attempt was cancelled.

An :class:`AttemptControl` belongs to one attempt. The executor thread that waits for the attempt
cancels it (a lost race, a passed timeout, a lost run); the attempt learns it at its next
``weft.heartbeat()``, which raises :class:`~django_weft.ActivityCancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connections

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.common.tokens import parse_task_token
from django_weft.exceptions import ActivityCancelled
from django_weft.models import ActivityHeartbeat
from django_weft.runtime import in_flight
from django_weft.store import activity_answers, activity_heartbeats, leases, transitions

T = TypeVar("T")

logger = logging.getLogger("django_weft.heartbeats")

# Heartbeats are written (details stored, lease renewed) at most this often; the last details of an
# attempt are written when it ends, so throttling loses nothing an attempt reported before it ended.
WRITE_INTERVAL_SECONDS = 1.0


def outside_event_loop(fn: Callable[[], T]) -> T:
    """Call ``fn`` (which uses the ORM) from a thread without a running event loop: Django refuses
    synchronous queries inside one, and an ``async def`` activity calls ``weft.heartbeat()`` in one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    helper = threading.Thread(target=target, name="weft-heartbeat-write")
    helper.start()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class AttemptControl:
    """What the engine and one running activity attempt know about each other."""

    def __init__(self, claim: transitions.Claim | None, run_id: uuid.UUID, seq: int, attempt: int, *,
                 timeout: float | None, heartbeat_timeout: float | None, activity: str = "") -> None:
        self._claim = claim
        self._activity = activity
        self._run_id = run_id
        self._seq = seq
        self._attempt = attempt
        # Set when the attempt begins (it may queue for a free slot first): timeouts count from then.
        self.started: float | None = None
        self.last_beat = 0.0
        self.timeout = timeout
        self.deadline: float | None = None
        self.heartbeat_timeout = heartbeat_timeout
        # The attempt runs on an event loop in the thread of a caller's transaction: its ORM writes wait
        # until it ends (a thread of its own could not see the caller's rows).
        self.hold_writes = False
        # A flag, not an Event: nothing waits on it, and an Event (a Condition and its lock) costs more than the
        # rest of the attempt's bookkeeping. Set after stop_reason, so whoever sees it set reads the reason.
        self._stopped = False
        self.stop_reason = ""
        self._unwritten: tuple[bytes | None] | None = None  # details not written yet, if any
        self._last_write = -float("inf")
        self._lock = threading.Lock()
        # Begun inside ``ctx.cleanup()``: the run's cancel does not ask it to stop.
        self.shielded = False

    def begin(self) -> None:
        """The attempt starts now (it may have queued for a free slot): its timeouts count from here."""
        self.started = self.last_beat = time.monotonic()
        if self.timeout is not None:
            self.deadline = self.started + self.timeout
        in_flight.began(id(self), self._run_id, self._seq, self._attempt, activity=self._activity,
                        executor=self._claim.owner if self._claim is not None else "", timeout=self.timeout)

    # --- the engine's side ---

    def cancel(self, reason: str) -> None:
        """Ask the attempt to stop; its next heartbeat raises ActivityCancelled with ``reason``."""
        if not self._stopped:
            self.stop_reason = reason
            self._stopped = True

    @property
    def executor(self) -> str:
        """The executor running the attempt ("" outside one)."""
        return self._claim.owner if self._claim is not None else ""

    @property
    def cancelled(self) -> bool:
        return self._stopped

    def silent_too_long(self, now: float) -> bool:
        return (self.started is not None and self.heartbeat_timeout is not None
                and now - self.last_beat > self.heartbeat_timeout)

    def past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    # --- the attempt's side ---

    def beat(self, details: Any) -> None:
        data = None if details is None else encode(details, what="heartbeat details")
        # An attempt told to stop (a zombie after its timeout, a race's loser) stores nothing: its details
        # would overwrite those of the attempt that replaced it.
        self.raise_if_cancelled()
        now = time.monotonic()
        with self._lock:
            self.last_beat = now
            if details is not None:
                self._unwritten = (data,)
            due = not self.hold_writes and now - self._last_write >= WRITE_INTERVAL_SECONDS
        if due:
            self.write()
            self.raise_if_cancelled()

    def raise_if_cancelled(self) -> None:
        if self._claim is not None and self._claim.lost:
            self.cancel("the run was cancelled, timed out or taken away from this executor")
        if self._claim is not None and self._claim.cancel_requested and not self.shielded:
            self.cancel("the run's cancel was requested")
        if self.past_deadline(time.monotonic()):
            self.cancel("the attempt passed its timeout")
        if self._stopped:
            raise ActivityCancelled(f"activity step {self._seq} attempt {self._attempt}: {self.stop_reason}")

    def write(self) -> None:
        """Renew the run's lease and store the latest details (called by beats, and when the attempt ends)."""
        with self._lock:
            unwritten, self._unwritten = self._unwritten, None
            self._last_write = time.monotonic()
        try:
            outside_event_loop(lambda: self._write(unwritten))
        except DatabaseError:
            # A heartbeat must not fail the work it reports on (a lock timeout, a lost connection): the
            # lease keeper renews the lease too, and the next beat writes the details again.
            logger.warning("activity step %s attempt %s: writing a heartbeat failed; the next beat retries",
                           self._seq, self._attempt, exc_info=True)
            with self._lock:
                if self._unwritten is None:
                    self._unwritten = unwritten

    def _write(self, unwritten: tuple[bytes | None] | None) -> None:
        if self.cancelled:
            return
        now = clock.now()
        if self._claim is not None:
            leases.renew([self._claim], now)
            if self._claim.lost:
                return  # another executor owns the run now: its attempt's details are not ours to write
        if unwritten is None or unwritten[0] is None:
            return
        # A later attempt's details are never overwritten by an earlier one's.
        activity_heartbeats.save(self._run_id, self._seq, self._attempt, now, unwritten[0])

    def flush(self) -> None:
        """Write details the throttle held back; the attempt ended (returned, raised or was abandoned)."""
        in_flight.ended(id(self))
        if self._unwritten is not None:
            self.write()


def recorded_details(run_id: uuid.UUID, seq: int) -> Any:
    """The details the step's last heartbeat stored, or None."""
    data = outside_event_loop(lambda: ActivityHeartbeat.objects.filter(run_id=run_id, seq=seq)
                              .values_list("details", flat=True).first())
    return None if data is None else decode(data)


def heartbeat_async(token: str, details: Any = None) -> bool:
    """Beat for the async activity attempt ``token`` names, from the outside system working on it.

    Each beat renews the activity's ``heartbeat_timeout`` (an async activity that declares one times out,
    and is retried by its retry policy, when neither a beat nor its completion comes for that long) and,
    unless ``details`` is None, stores ``details`` for the step's next attempt, which reads them as
    ``weft.activity_info().heartbeat_details``, as it reads those of ``weft.heartbeat(details)``.

    Returns True when the attempt was cancelled: the run's cancel reached it (a run wakes for its cancel at
    once; an attempt begun inside ``ctx.cleanup()`` is not cancelled by it) or the run has closed; stop the
    work then, its result is no longer wanted. False: go on.

    Raises InvalidTaskToken for a forged or unknown token, TaskTokenAlreadyUsed when the attempt already
    completed, failed or timed out, and PayloadTooLarge / PayloadNotSerializable / PayloadTooDeep for details
    that cannot be stored (nothing is written then).
    """
    parts = parse_task_token(token)
    data = None if details is None else encode(details, what="heartbeat details")
    return activity_answers.beat_async(parts, clock.now(), data)
