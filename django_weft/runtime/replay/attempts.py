"""What happens after an activity attempt fails, for plain and async activities alike: a durable retry
backoff under the activity's RetryPolicy, or ActivityError in the workflow when it gives up.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from ... import clock, journal
from ...activities import ActivityDefinition
from ...exceptions import ActivityError
from ...models import StepKind, StepStatus, Timer, TimerPurpose, WorkflowStep
from ..errors import error_category
from .core import ReplayCore

logger = logging.getLogger("django_weft.executor")

# Error messages in log lines are cut to this many characters (the journal keeps the whole message).
LOGGED_MESSAGE_CHARS = 500


class AttemptOps(ReplayCore):
    """The replay context's attempts (mixed into runtime.context.Context)."""

    def _attempt_failed(self, seq: int, step: WorkflowStep | None, definition: ActivityDefinition,
                        attempt: int, started: datetime, error: dict, *, retryable: bool,
                        cause: BaseException | None = None) -> Any:
        now = clock.now()
        wake_at, error = self._retry_at(definition, attempt, started, error, retryable, now)
        if wake_at is None:
            self._log_attempt_failed(definition, attempt, error, "giving up: ActivityError is raised in the workflow")
            failed = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.FAILED, attempt=attempt,
                                error=error, started=started, finished=now, failure_category=error_category(error))
            self._defer(self._record(failed, step))
            raise self._activity_error(definition.name, error, attempt, seq) from cause
        self._log_attempt_failed(definition, attempt, error, f"retrying at {wake_at.isoformat(timespec='seconds')}")
        waiting = self._step(seq, StepKind.ACTIVITY, definition.name, StepStatus.WAITING, attempt=attempt,
                             error=error, started=started, finished=None)
        timer = Timer(run_id=self.run_id, seq=seq, purpose=TimerPurpose.RETRY_BACKOFF, fire_at=wake_at)
        self._park(wake_at=wake_at, writes=[self._record(waiting, step), journal.InsertTimer(timer)],
                   reason=f"retrying {definition.name} (attempt {attempt + 1}) at {wake_at.isoformat()}")
        raise AssertionError("unreachable")  # _park always raises

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
        logger.warning("run %s of %s: activity %s attempt %d of %d failed: %s: %s; %s", self.run_id,
                       self._claim.run.workflow_type, definition.name, attempt, definition.retry.max_attempts,
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
