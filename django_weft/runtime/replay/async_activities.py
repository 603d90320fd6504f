"""Async activities: an attempt that called ``weft.complete_async()`` parks on its task token until an outside
system resolves it; a resolution that came before the park is applied instead of waiting.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_weft.common import clock
from django_weft.common.codec import decode
from django_weft.common.tokens import make_task_token
from django_weft.exceptions import NonDeterminismError
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
from django_weft.store import journal


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
        deadline = self._close_deadline(definition, started)
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
            if timer is None or timer.fire_at > now:
                self._park(wake_at=timer.fire_at if timer else None,
                           reason=f"waiting for async activity {definition.name} (attempt {step.attempt}) "
                                  "to be completed")
            self._time_out_async(record, definition, step.attempt, now)
        if timer is not None:
            self._defer(journal.FireTimer(timer.pk, now))
        return self._apply_resolution(seq, step, definition, step.attempt, step.started_at, record)

    def _backoff_over(self, seq: int, step: WorkflowStep, timer: Timer | None) -> bool:
        """A waiting step whose retry backoff timer has fired (the fire commits before the next attempt
        starts): that attempt was cut short by a crash. An async wait has a record, or no error yet."""
        return timer is None and step.error is not None and not AsyncActivity.objects.filter(
            run_id=self.run_id, seq=seq, attempt=step.attempt).exists()

    def _time_out_async(self, record: AsyncActivity, definition: ActivityDefinition, attempt: int,
                        now: datetime) -> None:
        """The attempt's schedule_to_close_timeout passed before its token was used: it resolves as timed out."""
        error = {"type": "django_weft.exceptions.ActivityTimeout", "attempt": attempt,
                 "message": f"async activity {definition.name!r} was not completed within its "
                            f"{definition.schedule_to_close_timeout or 0:g}s schedule_to_close_timeout"}
        self._defer(journal.ResolveAsync(record.pk, AsyncStatus.TIMED_OUT, now, error))
        record.status, record.error = AsyncStatus.TIMED_OUT, error

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
                                    retryable=record.status == AsyncStatus.FAILED
                                    and definition.retry.allows(attempt + 1), began=record.created_at)
