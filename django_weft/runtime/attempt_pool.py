"""Executing activity attempts: in the executor's thread, on a thread of their own, or on the run's event
loop (``async def`` activities), at most WEFT_MAX_PARALLEL_ACTIVITIES of one run at a time.

An attempt's body never touches the journal: it only produces an :class:`Outcome`, which the executor
thread records. That keeps every journal write on the thread that holds the run's fenced connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from django_weft.common.codec import encode
from django_weft.conf import weft_settings
from django_weft.exceptions import ActivityCancelled, ActivityTimeout
from django_weft.runtime.activities import ActivityInfo, CompleteAsync, current_activity, is_coroutine_body

logger = logging.getLogger("django_weft.executor")

# An execution that waits for an attempt it asked to stop says so this often.
WAIT_WARNING_SECONDS = 30.0


def in_callers_transaction() -> bool:
    """True when the run executes inside a transaction someone else opened (the executor opens none
    around user code): what an activity writes or reads then belongs to that transaction, which a thread
    on a connection of its own would not see (and on SQLite would wait for its write lock)."""
    return any(conn.in_atomic_block for conn in connections.all(initialized_only=True))


@dataclass
class Outcome:
    """How an attempt ended: a value (with its encoding), an exception, or ``weft.complete_async()``."""

    value: Any = None
    data: bytes | None = None
    error: BaseException | None = None
    completes_async: bool = False


@dataclass
class AttemptJob:
    info: ActivityInfo
    body: Callable[..., Any]
    args: tuple
    kwargs: dict
    timeout: float | None  # an async body is cancelled when it passes this
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    @property
    def what(self) -> str:
        return f"result of activity {self.info.activity!r}"

    @property
    def is_async(self) -> bool:
        return is_coroutine_body(self.body)


def _timed_out(job: AttemptJob) -> ActivityTimeout:
    return ActivityTimeout(f"activity {job.info.activity!r} attempt {job.info.attempt} ran longer than its "
                           f"{job.timeout:g}s timeout")


async def _run_coroutine(job: AttemptJob) -> Outcome:
    current_activity.set(job.info)  # the task runs in a context of its own
    if job.info.control is not None:
        job.info.control.begin()
    limit = asyncio.timeout(job.timeout)  # cancels the body when it passes its timeout
    try:
        async with limit:
            value = await job.body(*job.args, **job.kwargs)
        return _in_time(job, Outcome(value=value, data=encode(value, what=job.what)))
    except CompleteAsync:
        return _in_time(job, Outcome(completes_async=True))
    except TimeoutError as exc:
        return Outcome(error=_timed_out(job) if limit.expired() else exc)
    except Exception as exc:
        return _in_time(job, Outcome(error=exc))
    finally:
        if job.info.control is not None and not job.info.control.hold_writes:
            job.info.control.flush()


def _in_time(job: AttemptJob, outcome: Outcome) -> Outcome:
    """An attempt that ended past its timeout failed with ActivityTimeout, whatever it returned or raised (its
    heartbeat raises ActivityCancelled once the deadline passed): which error it fails with must not depend on
    whether the engine noticed the deadline before the body ended."""
    control = job.info.control
    if control is not None and control.past_deadline(time.monotonic()):
        return Outcome(error=_timed_out(job))
    return outcome


def _not_started(job: AttemptJob) -> Outcome | None:
    """The outcome of an attempt cancelled while it queued (a race's loser): its body never runs."""
    control = job.info.control
    if control is None or not control.cancelled:
        return None
    return Outcome(error=ActivityCancelled(f"activity {job.info.activity!r} attempt {job.info.attempt} was "
                                           f"cancelled before it started: {control.stop_reason}"))


def run_inline(job: AttemptJob) -> Outcome:
    """Run the attempt in this thread (an ``async def`` body on an event loop of its own). Exceptions that
    are not ``Exception`` (a KeyboardInterrupt, a crash standing in for one) propagate."""
    cancelled = _not_started(job)
    if cancelled is not None:
        return cancelled
    control = job.info.control
    if job.is_async:
        if control is None:
            return job.context.run(asyncio.run, _run_coroutine(job))
        # On an event loop in this thread, which may hold a caller's transaction that the ORM refuses to
        # be used from: what the attempt reads and writes through heartbeats is done here, around it.
        _ = job.info.heartbeat_details
        control.hold_writes = True
        try:
            return job.context.run(asyncio.run, _run_coroutine(job))
        finally:
            control.hold_writes = False
            control.flush()
    token = current_activity.set(job.info)
    if job.info.control is not None:
        job.info.control.begin()
    try:
        value = job.body(*job.args, **job.kwargs)
        if inspect.isawaitable(value):  # a plain function that returned a coroutine
            value = asyncio.run(_await(value))
        return _in_time(job, Outcome(value=value, data=encode(value, what=job.what)))
    except CompleteAsync:
        return _in_time(job, Outcome(completes_async=True))
    except Exception as exc:
        return _in_time(job, Outcome(error=exc))
    finally:
        current_activity.reset(token)
        if job.info.control is not None:
            job.info.control.flush()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The run's event loop, until the execution ends; then attempts still on it (abandoned ones) are
    cancelled for real and the loop is closed."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    finally:
        loop.close()
        connections.close_all()


class AttemptPool:
    """The attempts of one execution of a run: a thread each for plain functions, one shared event loop
    for ``async def`` ones, at most ``limit`` running at once (the rest queue in start order).

    With ``inline=True`` (the run executes inside a transaction the caller opened, which other threads
    could not see) every attempt runs at once in the submitting thread instead.
    """

    def __init__(self, *, inline: bool, limit: int | None = None) -> None:
        self._inline = inline
        self._limit = max(1, limit if limit is not None else int(weft_settings.MAX_PARALLEL_ACTIVITIES))
        self._lock = threading.Lock()
        self._running = 0
        self._queued: deque[tuple[AttemptJob, Future[Outcome]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The attempts that began and have not ended, and the tasks of the async ones among them.
        self._active: dict[Future[Outcome], AttemptJob] = {}
        self._tasks: dict[Future[Outcome], asyncio.Task[Outcome]] = {}

    def submit(self, job: AttemptJob) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        if self._inline:
            future.set_result(run_inline(job))
            return future
        with self._lock:
            start = self._running < self._limit
            if start:
                self._running += 1
            else:
                self._queued.append((job, future))
        if start:
            self._start(job, future)
        return future

    def _start(self, job: AttemptJob, future: Future[Outcome]) -> None:
        cancelled = _not_started(job)
        if cancelled is not None:
            self._finished(future, cancelled)
            return
        with self._lock:
            self._active[future] = job
        if job.is_async:
            loop = self._event_loop()
            loop.call_soon_threadsafe(self._start_task, loop, job, future)
            return
        thread = threading.Thread(target=job.context.run, args=(self._run_thread, job, future),
                                  name=f"weft-activity-{job.info.activity}"[:60], daemon=True)
        thread.start()

    def _run_thread(self, job: AttemptJob, future: Future[Outcome]) -> None:
        try:
            outcome = run_inline(job)
        except BaseException as exc:
            outcome = Outcome(error=exc)
        finally:
            connections.close_all()
        self._finished(future, outcome)

    def _start_task(self, loop: asyncio.AbstractEventLoop, job: AttemptJob, future: Future[Outcome]) -> None:
        task = loop.create_task(_run_coroutine(job), context=job.context)
        with self._lock:
            self._tasks[future] = task
        if job.info.control is not None and job.info.control.cancelled:
            task.cancel()  # abandoned while it waited for the loop

        def done(task: asyncio.Task[Outcome]) -> None:
            try:
                outcome = task.result()
            except BaseException as exc:
                outcome = Outcome(error=exc)
            self._finished(future, outcome)

        task.add_done_callback(done)

    def _finished(self, future: Future[Outcome], outcome: Outcome) -> None:
        with self._lock:
            self._active.pop(future, None)
            self._tasks.pop(future, None)
        future.set_result(outcome)
        with self._lock:
            following = self._queued.popleft() if self._queued else None
            if following is None:
                self._running -= 1
        if following is not None:
            self._start(*following)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop, args=(self._loop,), name="weft-activity-loop", daemon=True).start()
            return self._loop

    def wait_for_abandoned(self) -> None:
        """Wait for the attempts that were asked to stop (a race's losers, the branches of an execution that
        ended) to end: an async one is cancelled for real, a thread is waited for until it returns or passes its
        timeout (Python cannot stop a thread; past its timeout the engine has given up on it as on any attempt
        that overran). Nothing of the run runs on once its execution has moved past them."""
        with self._lock:
            stopping = [(future, job) for future, job in self._active.items()
                        if job.info.control is not None and job.info.control.cancelled]
            tasks = [self._tasks[future] for future, _ in stopping if future in self._tasks]
            loop = self._loop
        if loop is not None:
            for task in tasks:
                loop.call_soon_threadsafe(task.cancel)
        for future, job in stopping:
            control = job.info.control
            assert control is not None
            while not future.done():
                left = None if control.deadline is None else control.deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                step = WAIT_WARNING_SECONDS if left is None else min(left, WAIT_WARNING_SECONDS)
                if not wait([future], timeout=step).done and (left is None or left > step):
                    logger.warning("activity %s attempt %s was asked to stop (%s) and still runs; the run's execution "
                               "waits for it to end", job.info.activity, job.info.attempt, control.stop_reason)

    def close(self) -> None:
        """Stop starting attempts (queued ones never run) and wait for the running ones, which were asked to
        stop, to end (see ``wait_for_abandoned``)."""
        with self._lock:
            queued, self._queued = list(self._queued), deque()
        for job, future in queued:
            if job.info.control is not None:
                job.info.control.cancel("the execution ended before the attempt started")
            future.set_result(Outcome(error=RuntimeError("not started")))
        self.wait_for_abandoned()
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
