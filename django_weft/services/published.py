"""Reading what a run publishes (design 9.4): ``handle.get_event``, ``handle.events``, ``handle.read_stream``.

A run's events and streams follow its continue-as-new chain: the latest value of a key set by any run of the
chain, and a stream that reads on from one run into the run it continued as. Readers that wait are woken by the
executor's NOTIFY on PostgreSQL and poll elsewhere.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.db import router

from django_weft.common.codec import decode
from django_weft.exceptions import InvalidArgument, WorkflowNotFound
from django_weft.models import RunStatus, StreamEntry, Workflow, WorkflowEvent
from django_weft.services import result_waiters
from django_weft.services.notices import Listener
from django_weft.store.starts import check_id
from django_weft.store.wakeups import EVENTS_CHANNEL

# Polling: the first wait, doubling up to the last (with NOTIFY a reader looks again at least this often).
FIRST_POLL_SECONDS = 0.01
MAX_POLL_SECONDS = 0.5
LISTEN_SECONDS = 1.0
# Stream entries read per query.
PAGE = 500


class Chain:
    """The runs of one continue-as-new chain, from the first to the one it has reached (looked up again as the
    chain grows): their ids are what a reader listens for."""

    def __init__(self, run_id: uuid.UUID | str) -> None:
        run = Workflow.objects.filter(pk=run_id).only("run_id", "workflow_id", "status", "restarted_from_id").first()
        if run is None:
            raise WorkflowNotFound(f"run {run_id} does not exist")
        earlier = []
        while run.restarted_from_id is not None:  # back to the chain's first run
            previous = Workflow.objects.filter(pk=run.restarted_from_id, workflow_id=run.workflow_id,
                                               status=RunStatus.CONTINUED).only(
                "run_id", "workflow_id", "status", "restarted_from_id").first()
            if previous is None:
                break
            earlier.append(previous.pk)
            run = previous
        self._last = Workflow.objects.get(pk=run_id)
        self.ids: list[uuid.UUID] = [*reversed(earlier), self._last.pk]
        self.names = {str(pk) for pk in self.ids}

    @property
    def last(self) -> Workflow:
        return self._last

    def refresh(self) -> Workflow:
        """The chain's last run as it is now (following it on if it continued as new)."""
        run = Workflow.objects.get(pk=self._last.pk)
        while run.status == RunStatus.CONTINUED:
            following = (Workflow.objects.filter(restarted_from_id=run.pk, workflow_id=run.workflow_id)
                         .order_by("created_at").first())
            if following is None:
                break
            run = following
            self.ids.append(run.pk)
            self.names.add(str(run.pk))
        self._last = run
        return run

    def ended(self) -> bool:
        """The chain's last run finished without continuing as new: nothing more will be published."""
        return self._last.is_finished and self._last.status != RunStatus.CONTINUED


def _alias() -> str:
    return router.db_for_write(WorkflowEvent)


def latest_event(chain: Chain, key: str) -> WorkflowEvent | None:
    return (WorkflowEvent.objects.filter(run_id__in=chain.ids, key=key).order_by("-set_at", "-id").first())


def get_event(run_id: uuid.UUID | str, key: str, timeout: float | None = None) -> Any:
    """The latest value of event ``key``, waiting up to ``timeout`` seconds (None: until the chain ends) for it to
    be set; None if it is not set by then, or the run ended without setting it."""
    row = find_event(run_id, key, timeout)
    return None if row is None else decode(row.value)


def find_event(run_id: uuid.UUID | str, key: str, timeout: float | None = None) -> WorkflowEvent | None:
    """:func:`get_event`'s row (None: not set), so that a value of None and a key never set can be told apart."""
    check_id(key, "an event key")
    if timeout is not None and timeout < 0:
        raise InvalidArgument(f"timeout must be >= 0 seconds, got {timeout!r}")
    chain = Chain(run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    driver = result_waiters.driver_here()  # inside the test environment: it moves the run on instead of waiting
    with Listener(_alias(), EVENTS_CHANNEL, chain.names, listen=driver is None) as listener:
        delay = FIRST_POLL_SECONDS
        while True:
            chain.refresh()
            row = latest_event(chain, key)
            if row is not None or chain.ended():
                return row
            if driver is not None:
                driver()
                chain.refresh()
                return latest_event(chain, key)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            wait = min(delay, MAX_POLL_SECONDS) if listener.polls else LISTEN_SECONDS
            listener.wait(wait if remaining is None else min(wait, remaining))
            delay *= 2


def events(run_id: uuid.UUID | str) -> dict[str, Any]:
    """Every event key the chain of ``run_id`` set, with its latest value."""
    chain = Chain(run_id)
    chain.refresh()
    latest: dict[str, Any] = {}
    for row in WorkflowEvent.objects.filter(run_id__in=chain.ids).order_by("set_at", "id"):
        latest[row.key] = decode(row.value)
    return latest


def read_stream(run_id: uuid.UUID | str, key: str, start: int = 0, *,
                timeout: float | None = None) -> Iterator[Any]:
    """The values of stream ``key`` from the ``start``-th on (0: the first), in order, waiting for each, until the
    run closes the stream or its chain ends; TimeoutError if ``timeout`` seconds pass without a new value."""
    for _index, value in read_stream_entries(run_id, key, start, timeout=timeout):
        yield value


def read_stream_entries(run_id: uuid.UUID | str, key: str, start: int = 0, *,
                        timeout: float | None = None) -> Iterator[tuple[int, Any]]:
    """:func:`read_stream` with each value's index in the stream (what an SSE client resumes from)."""
    check_id(key, "a stream key")
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise InvalidArgument(f"start must be an int >= 0, got {start!r}")
    chain = Chain(run_id)
    return _entries(chain, key, start, timeout)


def _entries(chain: Chain, key: str, start: int, timeout: float | None) -> Iterator[tuple[int, Any]]:
    driver = result_waiters.driver_here()
    position, index, after = 0, 0, 0  # the chain's run being read, the next value's index, the last entry read
    with Listener(_alias(), EVENTS_CHANNEL, chain.names, listen=driver is None) as listener:
        delay = FIRST_POLL_SECONDS
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            chain.refresh()
            run_pk = chain.ids[position]
            page = list(StreamEntry.objects.filter(run_id=run_pk, key=key, id__gt=after).order_by("id")
                        .values_list("id", "closed", "value")[:PAGE])
            for entry_id, closed, value in page:
                after = entry_id
                if closed:
                    return
                if index >= start:
                    yield index, decode(value)
                    delay = FIRST_POLL_SECONDS
                    deadline = None if timeout is None else time.monotonic() + timeout
                index += 1
            if page:
                continue
            if position + 1 < len(chain.ids):  # this run continued as new: read on in the next one
                position, after = position + 1, 0
                continue
            if chain.ended():
                # Its last entries committed with its end, perhaps after the page above was read: one more look.
                if not StreamEntry.objects.filter(run_id=run_pk, key=key, id__gt=after).exists():
                    return
                continue
            if driver is not None:
                driver()  # the test environment moves the run on; if that wrote nothing, nothing will come
                chain.refresh()
                moved = chain.ended() or position + 1 < len(chain.ids)
                if not moved and not StreamEntry.objects.filter(run_id=run_pk, key=key, id__gt=after).exists():
                    raise TimeoutError(f"stream {key!r} of run {chain.last.run_id} has no more values yet: its run "
                                       f"waits ({chain.last.wait_reason or chain.last.status})")
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"stream {key!r} of run {chain.last.run_id}: no new value within {timeout:g}s")
            wait = min(delay, MAX_POLL_SECONDS) if listener.polls else LISTEN_SECONDS
            listener.wait(wait if remaining is None else min(wait, remaining))
            delay *= 2
