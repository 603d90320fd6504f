"""Async activities: an attempt that called ``weft.complete_async()`` parks on its task token until an outside
system resolves it; a resolution that came before the park is applied instead of waiting.

A parked attempt has one timer, at the earlier of its schedule_to_close deadline and, with a heartbeat_timeout,
that long after its last sign of life (the park, or the latest ``weft.heartbeat_async`` with its token). A beat
writes only its heartbeat row; when the timer fires the run reads the last beat and, if it is recent enough,
fires the timer and parks on a new one at the later deadline, else the attempt times out (and is retried).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django_weft.common import clock
from django_weft.common.codec import decode
from django_weft.common.tokens import make_task_token
from django_weft.exceptions import ActivityTimeout, NonDeterminismError
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    AttemptOutcome,
    StepKind,
    StepStatus,
    Timer,
    TimerPurpose,
    WorkflowStep,
)
from django_weft.runtime.activities import ActivityDefinition
from django_weft.runtime.replay.attempts import AttemptOps
from django_weft.store import activity_heartbeats, journal


class AsyncActivityOps(AttemptOps):
    """The replay context's async activities (mixed into runtime.context.Context)."""

    def _park_async(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition, attempt: int,
                    started: datetime) -> Any:
        """The attempt called complete_async(): its pending record commits with the parked step, so a
        replay never needs to run the body again to learn the token.

        The token may have been used already: while the body still ran, or before an executor that died
        ahead of its park, whose attempt this one repeats. Then the answer is applied now; one that comes
        after this check finds the run's inbox moved and wakes the run as soon as it parks.
        """
        early = self._early_resolution(seq, attempt)
        if early is not None:
            return self._apply_resolution(seq, step, definition, attempt, started, early)
        now = clock.now()
        record = AsyncActivity(run_id=self.run_id, seq=seq, attempt=attempt, activity=definition.name,
                               token=make_task_token(self.run_id, seq, attempt, self._claim.run.retries),
                               created_at=now)
        waiting = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.WAITING, attempt=attempt,
                             started=started, finished=None)
        writes: list[journal.JournalWrite] = [self._record(waiting, step), journal.InsertAsync(record)]
        deadline = self._async_deadline(definition, started, alive_at=now)
        if deadline is not None:
            writes.append(journal.InsertTimer(Timer(run_id=self.run_id, seq=seq, fire_at=deadline,
                                                    purpose=TimerPurpose.ACTIVITY_TIMEOUT)))
        self._park(wake_at=deadline, writes=writes,
                   reason=f"waiting for async activity {definition.name} (attempt {attempt}) to be completed")

    def _resume_async(self, seq: int, step: WorkflowStep, definition: ActivityDefinition,
                      timer: Timer | None) -> Any:
        record = AsyncActivity.objects.filter(run_id=self.run_id, seq=seq, attempt=step.attempt).first()
        if record is None:
            raise NonDeterminismError(
                f"step {seq} of run {self.run_id} waits for an async activity attempt {step.attempt} that has "
                "no record"
            )
        now = clock.now()
        if record.status == AsyncStatus.PENDING:
            reason = f"waiting for async activity {definition.name} (attempt {step.attempt}) to be completed"
            if timer is None or timer.fire_at > now:
                self._park(wake_at=timer.fire_at if timer else None, reason=reason)
            later = self._timed_out_unless_beating(record, definition, step.started_at, now)
            if later is not None:  # heartbeats kept it alive: the fired timer gives way to one at the new deadline
                fresh = Timer(run_id=self.run_id, seq=seq, fire_at=later, purpose=TimerPurpose.ACTIVITY_TIMEOUT)
                self._park(wake_at=later, reason=reason, writes=[*self._fired(timer, now), journal.InsertTimer(fresh)])
        if timer is not None:
            self._defer(journal.FireTimer(timer.pk, now))
        return self._apply_resolution(seq, step, definition, step.attempt, step.started_at, record)

    def _backoff_over(self, seq: int, step: WorkflowStep, timer: Timer | None) -> bool:
        """A waiting step whose retry backoff timer has fired (the fire commits before the next attempt
        starts): that attempt was cut short by a crash. An async wait has a record, or no error yet."""
        return timer is None and step.error is not None and not AsyncActivity.objects.filter(
            run_id=self.run_id, seq=seq, attempt=step.attempt).exists()

    def _async_deadline(self, definition: ActivityDefinition, started: datetime, *,
                        alive_at: datetime) -> datetime | None:
        """When a parked attempt last heard of at ``alive_at`` times out unless resolved first: its
        schedule_to_close deadline, or heartbeat_timeout after ``alive_at``, whichever comes first."""
        close = self._close_deadline(definition, started)
        if definition.heartbeat_timeout is None:
            return close
        silent = alive_at + timedelta(seconds=definition.heartbeat_timeout)
        return silent if close is None else min(close, silent)

    def _timed_out_unless_beating(self, record: AsyncActivity, definition: ActivityDefinition,
                                  started: datetime, now: datetime) -> datetime | None:
        """The pending attempt's timer fired: the later deadline its heartbeats earned, or None after it was
        resolved as timed out (schedule_to_close passed, or silent for longer than heartbeat_timeout)."""
        close = self._close_deadline(definition, started)
        if definition.heartbeat_timeout is None or (close is not None and close <= now):
            self._time_out_async(record, definition, record.attempt, now)
            return None
        beat = activity_heartbeats.last_beat_at(self.run_id, record.seq, record.attempt)
        alive_at = record.created_at if beat is None else max(beat, record.created_at)
        deadline = self._async_deadline(definition, started, alive_at=alive_at)
        if deadline is not None and deadline > now:  # not at now: the run would wake at once, again and again
            return deadline
        self._time_out_async(record, definition, record.attempt, now, silent=True)
        return None

    @staticmethod
    def _fired(timer: Timer, now: datetime) -> list[journal.JournalWrite]:
        """The writes that mark ``timer`` fired (one whose insert is still deferred is marked in place)."""
        if timer.pk is None:
            timer.fired_at = now
            return []
        return [journal.FireTimer(timer.pk, now)]

    def _time_out_async(self, record: AsyncActivity, definition: ActivityDefinition, attempt: int,
                        now: datetime, *, silent: bool = False) -> None:
        """The attempt's schedule_to_close_timeout passed before its token was used, or (``silent``) it heard
        nothing for longer than its heartbeat_timeout: it resolves as timed out."""
        if silent:  # an attempt's own timeout: the retry policy decides (see _async_retryable)
            error = {"type": "django_weft.exceptions.ActivityTimeout", "attempt": attempt, "timeout": "heartbeat",
                     "message": f"async activity {definition.name!r} attempt {attempt} sent no heartbeat for "
                                f"longer than its {definition.heartbeat_timeout or 0:g}s heartbeat_timeout"}
        else:
            error = {"type": "django_weft.exceptions.ActivityTimeout", "attempt": attempt,
                     "message": f"async activity {definition.name!r} was not completed within its "
                                f"{definition.schedule_to_close_timeout or 0:g}s schedule_to_close_timeout"}
        self._defer(journal.ResolveAsync(record.pk, AsyncStatus.TIMED_OUT, now, error))
        record.status, record.error = AsyncStatus.TIMED_OUT, error

    @staticmethod
    def _async_retryable(definition: ActivityDefinition, attempt: int, record: AsyncActivity) -> bool:
        """Whether a resolved attempt's failure goes to the retry policy: a failure does, and a heartbeat timeout
        (unless the policy calls ActivityTimeout non-retryable); a schedule_to_close timeout ends the step."""
        if record.status == AsyncStatus.FAILED:
            return definition.retry.allows(attempt + 1)
        error = record.error or {}
        if record.status == AsyncStatus.TIMED_OUT and error.get("timeout") == "heartbeat":
            return definition.retry.should_retry(attempt, ActivityTimeout(error.get("message", "")))
        return False

    def _token_used_first(self, seq: int, attempt: int) -> AsyncActivity | None:
        """A body that handed its token out and then returned or raised may have been resolved by its token
        meanwhile: a token resolves its attempt once, and the first resolution wins."""
        if self._last_info is None or not self._last_info.token_handed_out:
            return None
        return self._early_resolution(seq, attempt)

    def _early_resolution(self, seq: int, attempt: int) -> AsyncActivity | None:
        """The resolution an outside system gave this attempt's token before the attempt parked."""
        record = AsyncActivity.objects.filter(run_id=self.run_id, seq=seq, attempt=attempt).first()
        return record if record is not None and record.status != AsyncStatus.PENDING else None

    def _apply_resolution(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition,
                          attempt: int, started: datetime, record: AsyncActivity) -> Any:
        """Continue with an async attempt's resolution: its result, or a failed attempt for the retry policy."""
        if not record.activity:  # kept before the park named it
            self._defer(journal.InsertAsync(AsyncActivity(
                run_id=self.run_id, seq=seq, attempt=attempt, activity=definition.name, token=record.token)))
        if record.status == AsyncStatus.COMPLETED:
            if attempt > 1:
                self._defer(self._attempt_row(seq, attempt, AttemptOutcome.COMPLETED, record.created_at))
            self._defer(self._record(self._step(
                seq, StepKind.ACTIVITY, definition.name, StepStatus.COMPLETED, attempt=attempt,
                result=record.result, started=started, finished=record.resolved_at or clock.now(),
            ), step))
            return decode(record.result)
        error = record.error or {"type": "AsyncActivityFailed", "message": f"async activity {record.status}"}
        return self._attempt_failed(seq, step, definition, attempt, started, error,
                                    retryable=self._async_retryable(definition, attempt, record),
                                    began=record.created_at)
