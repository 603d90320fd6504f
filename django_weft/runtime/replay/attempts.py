"""What happens after an activity attempt fails, for plain and async activities alike: a durable retry
backoff under the activity's RetryPolicy, or ActivityError in the workflow when it gives up.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Max

from django_weft.common import clock
from django_weft.exceptions import ActivityError
from django_weft.models import AttemptOutcome, StepAttempt, StepStatus, Timer, TimerPurpose, WorkflowStep
from django_weft.runtime.activities import ActivityDefinition
from django_weft.runtime.errors import attempt_outcome, error_category
from django_weft.runtime.replay.core import ReplayCore
from django_weft.store import journal

logger = logging.getLogger("django_weft.executor")

# Error messages in log lines are cut to this many characters (the journal keeps the whole message).
LOGGED_MESSAGE_CHARS = 500


class AttemptOps(ReplayCore):
    """The replay context's attempts (mixed into runtime.context.Context)."""

    def _attempt_failed(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition,
                        attempt: int, started: datetime, error: dict, *, retryable: bool,
                        cause: BaseException | None = None, began: datetime | None = None) -> Any:
        now = clock.now()
        wake_at, error = self._retry_at(definition, attempt, started, error, retryable, now)
        if wake_at is None:
            self._log_attempt_failed(definition, attempt, error, "giving up: ActivityError is raised in the workflow")
            failed = self._step(seq, definition.step_kind, definition.name, StepStatus.FAILED, attempt=attempt,
                                error=error, started=started, finished=now, failure_category=error_category(error))
            if attempt > 1 and began is not None:
                self._defer(self._attempt_row(seq, attempt, attempt_outcome(error), began, error))
            self._defer(self._record(failed, step))
            raise self._activity_error(definition.name, error, attempt, seq) from cause
        self._log_attempt_failed(definition, attempt, error, f"retrying at {wake_at.isoformat(timespec='seconds')}")
        waiting = self._step(seq, definition.step_kind, definition.name, StepStatus.WAITING, attempt=attempt,
                             error=error, started=started, finished=None)
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.RETRY_BACKOFF, fire_at=wake_at)
        self._park(wake_at=wake_at, writes=[self._attempt_row(seq, attempt, attempt_outcome(error), began, error),
                                            self._record(waiting, step), journal.InsertTimer(timer)],
                   reason=f"retrying {definition.name} (attempt {attempt + 1}) at {wake_at.isoformat()}")
        raise AssertionError("unreachable")  # _park always raises

    # --- the attempt history (models.StepAttempt) ---

    def _attempt_row(self, seq: int, attempt: int, outcome: str, began: datetime | None,
                     error: dict | None = None, *, executor: str | None = None) -> journal.InsertAttempt:
        """The history row of an attempt that ended now (a step finished on its first attempt has none)."""
        return journal.InsertAttempt(StepAttempt(
            run_id=self.run_id, seq=seq, attempt=attempt, outcome=outcome, error=error,
            executor=(self._claim.owner if executor is None else executor)[:255], started_at=began,
            finished_at=clock.now()))

    def _next_after_lost(self, seq: int, attempt: int, definition: ActivityDefinition) -> tuple[int, dict | None]:
        """The number of the attempt about to begin at step ``seq``, and, when that passes the activity's
        max_attempts, the error the step fails with instead.

        In an execution that took the run over and has recorded nothing new yet, the executor it took the run
        from may have begun this very attempt (see ReplayCore._taken_over_from): that one counts as lost, its
        row is committed before the next begins (so a second loss counts too), and the next is numbered after
        it, as ``activity_info().attempt`` and the retry policy see it."""
        lost_from = self._taken_over_from
        if not lost_from:
            return attempt, None
        # Earlier takeovers may have lost attempts of this step already (a step without a row yet).
        recorded = StepAttempt.objects.filter(run_id=self.run_id, seq=seq).aggregate(last=Max("attempt"))["last"]
        attempt = max(attempt, (recorded or 0) + 1)
        error = {"type": "AttemptLost", "message": f"lost: executor {lost_from}'s lease expired while attempt "
                 f"{attempt} ran (it may have done its work, or part of it); the run was taken over"}
        self._defer(self._attempt_row(seq, attempt, AttemptOutcome.LOST, None, error, executor=lost_from))
        self._commit()
        logger.warning("run %s of %s: activity %s attempt %d was lost with executor %s; %s", self.run_id,
                       self._claim.run.workflow_type, definition.name, attempt, lost_from,
                       "giving up: ActivityError is raised in the workflow" if not
                       definition.retry.allows(attempt + 1) else f"attempt {attempt + 1} begins now")
        if not definition.retry.allows(attempt + 1):
            return attempt, error
        return attempt + 1, None

    def _retry_at(self, definition: ActivityDefinition, attempt: int, started: datetime, error: dict,
                  retryable: bool, now: datetime) -> tuple[datetime | None, dict]:
        """When the next attempt starts (None: no retry), and the error to record for this one."""
        if not retryable:
            return None, error
        wake_at = now + timedelta(seconds=definition.retry.backoff(attempt))
        deadline = self._close_deadline(definition, started)
        if deadline is not None and wake_at >= deadline:
            return None, {**error, "message": f"{error.get('message')} (no retry: schedule_to_close_timeout of "
                                              f"{definition.schedule_to_close_timeout:g}s would pass first)"}
        return wake_at, error

    def _log_attempt_failed(self, definition: ActivityDefinition, attempt: int, error: dict, then: str) -> None:
        """One WARNING per failed attempt (a Celery user expects to see retries in the worker's output)."""
        message = str(error.get("message"))
        if len(message) > LOGGED_MESSAGE_CHARS:
            message = message[:LOGGED_MESSAGE_CHARS] + "..."
        limit = definition.retry.max_attempts
        logger.warning("run %s of %s: activity %s attempt %d of %s failed: %s: %s; %s", self.run_id,
                       self._claim.run.workflow_type, definition.name, attempt, "unlimited" if limit is None else limit,
                       error.get("type"), message, then)

    @staticmethod
    def _close_deadline(definition: ActivityDefinition, started: datetime) -> datetime | None:
        if definition.schedule_to_close_timeout is None:
            return None
        return started + timedelta(seconds=definition.schedule_to_close_timeout)

    @staticmethod
    def _activity_error(name: str, error: dict, attempts: int, seq: int | None = None) -> ActivityError:
        return ActivityError(
            f"activity {name!r} failed after {attempts} attempt(s): {error.get('type')}: {error.get('message')}",
            activity=name, error_type=str(error.get("type")), attempts=attempts, seq=seq,
        )
