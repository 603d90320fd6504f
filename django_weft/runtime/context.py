"""The replay context handed to workflow functions.

Each durable operation takes the next position (``seq``) in the run's journal. If the journal has an
entry there, the operation returns what was recorded (after checking that the code still asks for the
same kind and name); the first operation without an entry does the work and records its entry (committed
with the run's next write, and always before the next side effect), and an operation that must wait
commits the run as parked and raises :class:`Suspend`.
"""

from __future__ import annotations

import logging
import random as _random
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections

from .. import clock, journal, transitions
from ..activities import ActivityDefinition, definition_of
from ..codec import decode, encode
from ..durations import to_seconds
from ..exceptions import (
    ActivityError,
    ActivityTimeout,
    FencingError,
    InvalidArgument,
    NonDeterminismError,
    PayloadError,
)
from ..models import StepKind, StepStatus, Timer, TimerPurpose, WorkflowStep
from .errors import StopExecution, Suspend, error_dict

logger = logging.getLogger("django_weft.executor")


class Context:
    """What a workflow function receives as ``ctx``."""

    def __init__(
        self,
        claim: transitions.Claim,
        steps: dict[int, WorkflowStep],
        timers: dict[int, Timer],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self._claim = claim
        self._journal = steps
        self._timers = timers
        self._should_stop = should_stop
        self._seq = 0

    # --- identity ------------------------------------------------------------------------------------

    @property
    def workflow_id(self) -> str:
        return self._claim.run.workflow_id

    @property
    def run_id(self) -> uuid.UUID:
        return self._claim.run.run_id

    @property
    def is_replaying(self) -> bool:
        """True while the code is re-walking operations already in the journal."""
        return self._seq < len(self._journal)

    # --- journal plumbing ----------------------------------------------------------------------------

    def _next(self, kind: str, name: str) -> tuple[int, WorkflowStep | None]:
        self._seq += 1
        seq = self._seq
        step = self._journal.get(seq)
        if step is not None and (step.kind != kind or step.name != name):
            raise NonDeterminismError(
                f"step {seq} of run {self.run_id}: the journal recorded {step.kind} {step.name!r} but the "
                f"workflow code now asks for {kind} {name!r}; workflow code must make the same durable "
                "calls in the same order on every replay (deploy changes as a new workflow name)"
            )
        return seq, step

    def _before_new_work(self, *, side_effects: bool) -> None:
        """Check before doing anything not yet recorded.

        Stops if the worker is stopping or lost the run. Before work with side effects (an activity, a
        side effect function) the deferred writes commit, so nothing touches the world while an earlier
        step's result could still be lost.
        """
        if self._claim.lost:
            raise StopExecution(release=False)
        if self._should_stop():
            raise StopExecution(release=True)
        if side_effects and self._claim.deferred:
            self._commit()

    def _commit(self, writes: Sequence[journal.JournalWrite] = ()) -> None:
        try:
            transitions.commit(self._claim, clock.now(), writes)
        except FencingError:
            raise StopExecution(release=False) from None
        except DatabaseError as exc:
            raise self._commit_failed(exc) from exc

    def _commit_failed(self, exc: DatabaseError) -> StopExecution:
        # Not the workflow's fault (lost connection, lock timeout, ...): leave the run to its lease, after
        # which any executor retries from the journal, instead of failing it.
        logger.warning("run %s: committing a step failed (%s); it is retried when its lease expires",
                       self.run_id, exc)
        return StopExecution(release=False)

    def _park(self, *, wake_at: datetime | None, reason: str,
              writes: Sequence[journal.JournalWrite] = ()) -> None:
        try:
            transitions.park(self._claim, clock.now(), wake_at=wake_at, reason=reason, writes=writes)
        except FencingError:
            raise StopExecution(release=False) from None
        except DatabaseError as exc:
            raise self._commit_failed(exc) from exc
        raise Suspend()

    def _defer(self, write: journal.JournalWrite) -> None:
        """Fold a write into the run's next commit (made before the next side effect, at the latest when
        the run parks, finishes or is handed back). Only deterministic workflow code runs in between, so
        a crash in that window only repeats what at-least-once already allows."""
        self._claim.deferred.append(write)

    def _step(self, seq: int, kind: str, name: str, status: str, *, attempt: int = 1,
              result: bytes | None = None, error: dict | None = None, started: datetime,
              finished: datetime | None) -> WorkflowStep:
        return WorkflowStep(
            run_id=self.run_id, seq=seq, kind=kind, name=name[:255], status=status, attempt=attempt,
            result=result, error=error, started_at=started, finished_at=finished,
        )

    def _record(self, step: WorkflowStep, existing: WorkflowStep | None) -> journal.JournalWrite:
        """The write that stores ``step`` (new, or replacing ``existing``); the journal sees it at once."""
        self._journal[step.seq] = step
        if existing is None:
            return journal.InsertStep(step)
        step.pk = existing.pk
        return journal.UpdateStep(step)

    def _recorded_value(self, kind: str, name: str, produce: Callable[[], Any], *, side_effects: bool) -> Any:
        """Run ``produce`` once per run and journal its value; replays return the recorded value."""
        seq, step = self._next(kind, name)
        if step is not None:
            return decode(step.result)
        self._before_new_work(side_effects=side_effects)
        value = produce()
        data = encode(value, what=f"value of {kind} {name!r}")
        now = clock.now()
        self._defer(self._record(
            self._step(seq, kind, name, StepStatus.COMPLETED, result=data, started=now, finished=now), None,
        ))
        return value

    # --- deterministic values ------------------------------------------------------------------------

    def now(self) -> datetime:
        """The current time, recorded on first execution so replays see the same value."""
        return self._recorded_value(StepKind.NOW, "now", clock.now, side_effects=False)

    def uuid4(self) -> uuid.UUID:
        return self._recorded_value(StepKind.UUID, "uuid4", uuid.uuid4, side_effects=False)

    def random(self) -> float:
        return self._recorded_value(StepKind.RANDOM, "random", _random.random, side_effects=False)

    def side_effect(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` once for this run and record its (encodable) return value."""
        name = getattr(fn, "__qualname__", "side_effect")
        return self._recorded_value(StepKind.SIDE_EFFECT, name, fn, side_effects=True)

    # --- timers --------------------------------------------------------------------------------------

    def sleep(self, duration: float | int | timedelta) -> None:
        """Wait durably: the run parks and a timer wakes it, across restarts and deploys."""
        seconds = to_seconds(duration, "ctx.sleep duration", allow_zero=True)
        self._sleep(lambda now: now + timedelta(seconds=seconds))

    def sleep_until(self, moment: datetime) -> None:
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise InvalidArgument(f"ctx.sleep_until needs an aware datetime, got {moment!r}")
        self._sleep(lambda now: moment)

    def _sleep(self, wake_at_from: Callable[[datetime], datetime]) -> None:
        seq, step = self._next(StepKind.SLEEP, "sleep")
        if step is not None and step.status == StepStatus.COMPLETED:
            return
        now = clock.now()
        if step is not None:
            timer = self._timers.get(seq)
            if timer is None or timer.fire_at <= now:
                # The timer fired: the step's completion rides on the run's next commit.
                step.status, step.finished_at = StepStatus.COMPLETED, now
                self._defer(self._record(step, step))
                if timer is not None:
                    self._defer(journal.FireTimer(timer.pk, now))
                return
            self._park(wake_at=timer.fire_at, reason=f"sleeping until {timer.fire_at.isoformat()}")
        self._before_new_work(side_effects=False)
        wake_at = wake_at_from(now)
        new_step = self._step(seq, StepKind.SLEEP, "sleep", StepStatus.WAITING, started=now, finished=None)
        if wake_at <= now:
            new_step.status, new_step.finished_at = StepStatus.COMPLETED, now
            self._defer(self._record(new_step, None))
            return
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.SLEEP, fire_at=wake_at)
        self._park(wake_at=wake_at, reason=f"sleeping until {wake_at.isoformat()}",
                   writes=[self._record(new_step, None), journal.InsertTimer(timer)])

    # --- activities ----------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an activity as a journaled step and return its result.

        A recorded result is returned without calling ``fn`` again. Failures are retried by the
        activity's :class:`RetryPolicy` with durable backoff; when it gives up, :class:`ActivityError`
        is raised here (catch it to compensate, or let it fail the run).
        """
        definition = definition_of(fn)
        seq, step = self._next(StepKind.ACTIVITY, definition.name)
        if step is not None and step.status == StepStatus.COMPLETED:
            return decode(step.result)
        if step is not None and step.status == StepStatus.FAILED:
            raise self._activity_error(definition.name, step.error or {}, step.attempt)
        attempt = 1
        started = clock.now()
        if step is not None:  # waiting out a retry backoff
            timer = self._timers.get(seq)
            if timer is not None and timer.fire_at > clock.now():
                self._park(wake_at=timer.fire_at,
                           reason=f"retrying {definition.name} (attempt {step.attempt + 1}) at "
                                  f"{timer.fire_at.isoformat()}")
            if timer is not None:
                self._defer(journal.FireTimer(timer.pk, clock.now()))
            attempt = step.attempt + 1
            started = step.started_at
        self._before_new_work(side_effects=True)
        try:
            value = self._invoke(definition, attempt, args, kwargs)
            data = encode(value, what=f"result of activity {definition.name!r}")
        except Exception as exc:
            return self._attempt_failed(seq, step, definition, attempt, started, exc)
        self._defer(self._record(self._step(
            seq, StepKind.ACTIVITY, definition.name, StepStatus.COMPLETED, attempt=attempt, result=data,
            started=started, finished=clock.now(),
        ), step))
        return value

    def _invoke(self, definition: ActivityDefinition, attempt: int, args: tuple, kwargs: dict) -> Any:
        if definition.timeout is None:
            return definition.fn(*args, **kwargs)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = definition.fn(*args, **kwargs)
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                connections.close_all()
                done.set()

        # The activity cannot be interrupted; on timeout we stop waiting and let it finish on its own.
        worker = threading.Thread(target=target, name=f"weft-activity-{definition.name}", daemon=True)
        worker.start()
        if not done.wait(definition.timeout):
            raise ActivityTimeout(
                f"activity {definition.name!r} attempt {attempt} ran longer than its {definition.timeout:g}s "
                "timeout"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _attempt_failed(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition,
                        attempt: int, started: datetime, exc: Exception) -> Any:
        now = clock.now()
        error = error_dict(exc, attempt=attempt)
        retryable = not isinstance(exc, PayloadError) and definition.retry.should_retry(attempt, exc)
        if not retryable:
            failed = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.FAILED, attempt=attempt,
                                error=error, started=started, finished=now)
            self._defer(self._record(failed, step))
            raise self._activity_error(definition.name, error, attempt) from exc
        wake_at = now + timedelta(seconds=definition.retry.backoff(attempt))
        waiting = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.WAITING, attempt=attempt,
                             error=error, started=started, finished=None)
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.RETRY_BACKOFF, fire_at=wake_at)
        self._park(wake_at=wake_at, writes=[self._record(waiting, step), journal.InsertTimer(timer)],
                   reason=f"retrying {definition.name} (attempt {attempt + 1}) at {wake_at.isoformat()}")
        raise AssertionError("unreachable")  # _park always raises

    @staticmethod
    def _activity_error(name: str, error: dict, attempts: int) -> ActivityError:
        return ActivityError(
            f"activity {name!r} failed after {attempts} attempt(s): {error.get('type')}: {error.get('message')}",
            activity=name, error_type=str(error.get("type")), attempts=attempts,
        )

    def assert_journal_consumed(self) -> None:
        """The code finished; a longer journal means it skipped operations it made before."""
        if self._seq < len(self._journal):
            extra = self._journal[self._seq + 1]
            raise NonDeterminismError(
                f"run {self.run_id}: the workflow returned after {self._seq} step(s), but the journal "
                f"recorded {len(self._journal)}; step {extra.seq} was {extra.kind} {extra.name!r}"
            )
