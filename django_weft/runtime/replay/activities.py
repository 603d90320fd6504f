"""Activities: ``ctx.run(fn, *args, **kwargs)`` runs an activity as a journaled step (with its per-attempt
timeout), returning the recorded result on replay.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from django.db import connections

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.exceptions import ActivityCancelled, ActivityTimeout, PayloadError
from django_weft.models import AttemptOutcome, StepKind, StepStatus, TimerPurpose
from django_weft.observability import events
from django_weft.runtime.activities import (
    ActivityDefinition,
    ActivityInfo,
    CompleteAsync,
    body_of,
    current_activity,
    definition_of,
    is_coroutine_body,
)
from django_weft.runtime.attempt_pool import AttemptJob, in_callers_transaction
from django_weft.runtime.errors import ReplayFrontier, StopExecution, error_dict
from django_weft.runtime.heartbeats import AttemptControl
from django_weft.runtime.replay.branches import POLL_SECONDS, Branches
from django_weft.runtime.replay.core import durable
from django_weft.store import journal

P = ParamSpec("P")
R = TypeVar("R")


class ActivityOps(Branches):
    """The replay context's activities (mixed into runtime.context.Context)."""

    @overload
    def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    def run(self, fn: str, *args: Any, **kwargs: Any) -> Any: ...

    @durable
    def run(self, fn: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run an activity (a function, or a registered activity's name) as a journaled step and return its result.

        A recorded result is returned without calling ``fn`` again. Failures are retried by the
        activity's :class:`RetryPolicy` with durable backoff; when it gives up, :class:`ActivityError`
        is raised here (catch it to compensate, or let it fail the run). An activity that calls
        ``weft.complete_async()`` parks the run until its task token is completed or failed (annotate
        its return type as the type of the result it is completed with).

        Typed like a call of ``fn``: a type checker reports arguments ``fn`` does not take, and the
        result has ``fn``'s return type. (For an ``async def`` activity a type checker sees the coroutine
        type; ``ctx.start_activity(fn, ...).result()`` is typed with what it returns when awaited.)
        """
        definition = definition_of(fn)
        if definition.transactional:
            return self._run_transaction(definition, args, kwargs)
        seq, step = self._next(StepKind.ACTIVITY, definition.name)
        if step is not None and step.status == StepStatus.WAITING:
            definition = self._with_controls(definition, seq)
        if step is not None and step.status == StepStatus.COMPLETED:
            return decode(step.result)
        if step is not None and step.status == StepStatus.FAILED:
            raise self._activity_error(definition.name, step.error or {}, step.attempt, seq)
        if self._dry and step is not None:
            raise ReplayFrontier()  # the run waits here: its retry or async completion is not replayed
        attempt = 1
        started = clock.now()
        if step is not None:  # waiting: out a retry backoff, or for an async completion
            timer = self._timers.get(seq)
            if self._backoff_over(seq, step, timer):
                pass  # the next attempt began before a crash cut it short: it runs again
            elif timer is None or timer.purpose != TimerPurpose.RETRY_BACKOFF:
                return self._resume_async(seq, step, definition, timer)
            elif self._retries_paused(seq):
                self._park(wake_at=None, reason=f"retries of {definition.name} (step {seq}) paused by an operator")
            elif timer.fire_at > clock.now():
                self._park(wake_at=timer.fire_at,
                           reason=f"retrying {definition.name} (attempt {step.attempt + 1}) at "
                                  f"{timer.fire_at.isoformat()}")
            else:
                self._defer(journal.FireTimer(timer.pk, clock.now()))
            attempt = step.attempt + 1
            started = step.started_at
        self._before_new_work(side_effects=True)
        if self._taken_over_from:
            early = self._early_resolution(seq, attempt)  # the lost attempt's token was answered meanwhile
            if early is not None:
                return self._apply_resolution(seq, step, definition, attempt, started, early)
            attempt, lost = self._next_after_lost(seq, attempt, definition)
            if lost is not None:
                return self._attempt_failed(seq, step, definition, attempt, started, lost, retryable=False)
        if definition.limits is not None:
            self._wait_for_slot(definition, seq, args, kwargs)  # parks the run until the step holds a slot
        began = clock.now()
        try:
            value = self._invoke_holding_slot(definition, seq, attempt, args, kwargs)
            data = encode(value, what=f"result of activity {definition.name!r}")
        except CompleteAsync:
            return self._park_async(seq, step, definition, attempt, started)
        except Exception as exc:
            early = self._token_used_first(seq, attempt)
            if early is not None:
                return self._apply_resolution(seq, step, definition, attempt, started, early)
            if isinstance(exc, ActivityCancelled) and self._cancel_due():
                raise self._deliver_cancel(seq, StepKind.ACTIVITY, definition.name, step) from exc
            retryable = not isinstance(exc, PayloadError) and definition.retry.should_retry(attempt, exc)
            error = error_dict(exc, attempt=attempt, executor=self._claim.owner)  # which executor ran it
            return self._attempt_failed(seq, step, definition, attempt, started, error, retryable=retryable,
                                        cause=exc, began=began)
        early = self._token_used_first(seq, attempt)
        if early is not None:
            return self._apply_resolution(seq, step, definition, attempt, started, early)
        if attempt > 1:
            self._defer(self._attempt_row(seq, attempt, AttemptOutcome.COMPLETED, began))
        self._defer(self._record(self._step(
            seq, StepKind.ACTIVITY, definition.name, StepStatus.COMPLETED, attempt=attempt, result=data,
            started=started, finished=clock.now(),
        ), step))
        return value

    def _invoke_holding_slot(self, definition: ActivityDefinition, seq: int, attempt: int, args: tuple,
                             kwargs: dict) -> Any:
        """``_invoke``; a limited activity's slot is given back once the body returned or raised (not when the
        execution stops: a run taken over finds its slot held and goes on with it)."""
        if definition.limits is None:
            return self._invoke(definition, seq, attempt, args, kwargs)
        try:
            value = self._invoke(definition, seq, attempt, args, kwargs)
        except (Exception, CompleteAsync):
            self._release_slot(definition, seq)
            raise
        self._release_slot(definition, seq)
        return value

    def _invoke(self, definition: ActivityDefinition, seq: int, attempt: int, args: tuple, kwargs: dict) -> Any:
        control = AttemptControl(self._claim, self.run_id, seq, attempt, timeout=definition.timeout,
                                 heartbeat_timeout=definition.heartbeat_timeout, activity=definition.name)
        control.shielded = self._cleanup_depth > 0
        info = ActivityInfo(workflow_id=self.workflow_id, run_id=self.run_id, seq=seq, attempt=attempt,
                            activity=definition.name, generation=self._claim.run.retries, control=control)
        self._last_info = info
        body = body_of(definition)  # the activity's function, or a test's replacement of it
        is_async = is_coroutine_body(body)
        body = events.attempt(body, info, self._claim.run, is_async=is_async)
        if definition.heartbeat_timeout is not None or is_async:
            return self._invoke_in_pool(definition, info, body, args, kwargs)
        control.begin()
        token = current_activity.set(info)
        try:
            if definition.timeout is None:
                return body(*args, **kwargs)
            if in_callers_transaction():
                return self._invoke_inline_with_timeout(definition, body, attempt, args, kwargs)
            return self._invoke_with_timeout(definition, control, body, attempt, args, kwargs)
        finally:
            current_activity.reset(token)
            control.flush()

    def _invoke_in_pool(self, definition: ActivityDefinition, info: ActivityInfo, body: Callable[..., Any],
                        args: tuple, kwargs: dict) -> Any:
        """An ``async def`` activity (on the run's event loop) or one with a heartbeat_timeout (watched
        from this thread while it runs on a thread of its own)."""
        control = info.control
        assert control is not None
        future = self._attempt_pool().submit(AttemptJob(info, body, args, kwargs, timeout=definition.timeout))
        while not future.done():
            concurrent.futures.wait([future], timeout=POLL_SECONDS)
            now = time.monotonic()
            if future.done():
                break
            if control.past_deadline(now):
                control.cancel("the attempt passed its timeout")
                raise self._timed_out(definition, info.attempt)
            if control.silent_too_long(now):
                control.cancel("the attempt stopped sending heartbeats")
                raise ActivityTimeout(f"activity {definition.name!r} attempt {info.attempt} sent no heartbeat for "
                                      f"longer than its {definition.heartbeat_timeout:g}s heartbeat_timeout")
            if self._claim.lost:
                control.cancel("the run was taken away from this executor")
                raise StopExecution(release=False)
            if self._claim.cancel_requested and not control.shielded:
                control.cancel("the run's cancel was requested")  # it ends at its next heartbeat
        outcome = future.result()
        if outcome.completes_async:
            raise CompleteAsync()
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    @staticmethod
    def _timed_out(definition: ActivityDefinition, attempt: int) -> ActivityTimeout:
        return ActivityTimeout(
            f"activity {definition.name!r} attempt {attempt} ran longer than its {definition.timeout:g}s timeout"
        )

    def _invoke_inline_with_timeout(self, definition: ActivityDefinition, body: Callable[..., Any],
                                    attempt: int, args: tuple, kwargs: dict) -> Any:
        """An attempt executed inside the caller's transaction (``run_maintenance()`` called in
        ``transaction.atomic()``, a test database wrapped in one transaction): it runs in this thread, on
        this connection, like an activity without a timeout, because a thread on a connection of its own
        would not see the transaction's uncommitted rows (and on SQLite would wait for its write lock).
        The timeout is checked when the body returns: an attempt that took longer fails with
        ActivityTimeout and its result is dropped, as when the engine stops waiting for it."""
        assert definition.timeout is not None
        began = time.monotonic()
        try:
            value = body(*args, **kwargs)
        except (Exception, CompleteAsync) as exc:
            if time.monotonic() - began > definition.timeout:
                raise self._timed_out(definition, attempt) from exc
            raise
        if time.monotonic() - began > definition.timeout:
            raise self._timed_out(definition, attempt)
        return value

    def _invoke_with_timeout(self, definition: ActivityDefinition, control: AttemptControl, body: Callable[..., Any],
                             attempt: int, args: tuple, kwargs: dict) -> Any:
        assert definition.timeout is not None
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = body(*args, **kwargs)
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                outcome["ended"] = time.monotonic()
                connections.close_all()
                done.set()

        # The activity cannot be interrupted; on timeout we stop waiting and let it finish on its own.
        context = contextvars.copy_context()  # activity_info() works in the thread too
        worker = threading.Thread(target=context.run, args=(target,), name=f"weft-activity-{definition.name}",
                                  daemon=True)
        worker.start()
        if not done.wait(definition.timeout) or control.past_deadline(outcome["ended"]):
            # Past its deadline whatever it returned or raised (a heartbeat then raises ActivityCancelled).
            raise self._timed_out(definition, attempt)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
