"""Transaction steps: ``ctx.run`` of a ``@weft.transaction`` function runs it inside the fenced transaction that
records its step (runtime.transactions, store.transitions.commit_transaction), returning the recorded result on
replay.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from django_weft.common import clock
from django_weft.common.codec import decode, encode
from django_weft.exceptions import FencingError, InvalidArgument, PayloadError
from django_weft.models import AttemptOutcome, StepStatus, TimerPurpose, WorkflowStep
from django_weft.runtime.activities import ActivityDefinition, body_of
from django_weft.runtime.errors import ReplayFrontier, StopExecution, error_dict, is_transient
from django_weft.runtime.replay.attempts import AttemptOps
from django_weft.runtime.transactions import routing_refusal, step_alias, writes_confined_to
from django_weft.store import journal, lock_retries, transitions


class _BodyFailed(Exception):
    """The function (or encoding its result) raised: the transaction rolls back, the step's attempt failed."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class TransactionOps(AttemptOps):
    """The replay context's transaction steps (mixed into runtime.context.Context)."""

    def _run_transaction(self, definition: ActivityDefinition, args: tuple, kwargs: dict) -> Any:
        seq, step = self._next(definition.step_kind, definition.name)
        if step is not None and step.status == StepStatus.WAITING:
            definition = self._with_controls(definition, seq)
        if step is not None and step.status == StepStatus.COMPLETED:
            return decode(step.result)
        if step is not None and step.status == StepStatus.FAILED:
            raise self._activity_error(definition.name, step.error or {}, step.attempt, seq)
        if self._dry and step is not None:
            raise ReplayFrontier()  # it waits out a retry backoff here
        attempt, started = 1, clock.now()
        if step is not None:  # waiting out a retry backoff (a business error its policy retries)
            timer = self._timers.get(seq)
            if timer is not None and timer.purpose == TimerPurpose.RETRY_BACKOFF:
                if self._retries_paused(seq):
                    self._park(wake_at=None, reason=f"retries of {definition.name} (step {seq}) paused by an operator")
                if timer.fire_at > clock.now():
                    self._park(wake_at=timer.fire_at,
                               reason=f"retrying transaction {definition.name} (attempt {step.attempt + 1}) at "
                                      f"{timer.fire_at.isoformat()}")
                self._defer(journal.FireTimer(timer.pk, clock.now()))
            attempt, started = step.attempt + 1, step.started_at
        self._check_new_work()  # the deferred writes commit with the step, in its transaction
        alias = step_alias()
        refused = routing_refusal(definition, alias)
        if refused is not None:
            return self._attempt_failed(seq, step, definition, attempt, started, error_dict(refused, attempt=attempt),
                                        retryable=False, cause=refused)
        began = clock.now()

        def work() -> list[journal.JournalWrite]:
            try:
                value = self._call_in_transaction(definition, alias, args, kwargs)
                data = encode(value, what=f"result of transaction {definition.name!r}")
            except Exception as exc:
                if lock_retries.lock_conflict(exc) or (isinstance(exc, DatabaseError) and is_transient(exc)):
                    raise  # run again in a new transaction, or left to the lease
                raise _BodyFailed(exc) from exc  # its writes are rolled back with the whole transaction
            outcome.append(value)
            writes: list[journal.JournalWrite] = []
            if attempt > 1:
                writes.append(self._attempt_row(seq, attempt, AttemptOutcome.COMPLETED, began))
            writes.append(self._record(self._step(
                seq, definition.step_kind, definition.name, StepStatus.COMPLETED, attempt=attempt, result=data,
                started=started, finished=clock.now()), step))
            return writes

        outcome: list[Any] = []
        try:
            self._commit_transaction(work, seq, step)
        except _BodyFailed as failed:
            exc = failed.error
            retryable = (not isinstance(exc, PayloadError | InvalidArgument)
                         and definition.retry.should_retry(attempt, exc))
            return self._attempt_failed(seq, step, definition, attempt, started, error_dict(exc, attempt=attempt),
                                        retryable=retryable, cause=exc, began=began)
        return outcome[-1]

    def _call_in_transaction(self, definition: ActivityDefinition, alias: str, args: tuple, kwargs: dict) -> Any:
        self._in_transaction = definition.name
        try:
            with writes_confined_to(alias, definition.name):
                return body_of(definition)(*args, **kwargs)
        finally:
            self._in_transaction = ""

    def _commit_transaction(self, work: Any, seq: int, step: WorkflowStep | None) -> None:
        if self._dry:
            raise ReplayFrontier()
        try:
            transitions.commit_transaction(self._claim, clock.now(), work)
        except FencingError:
            raise StopExecution(release=False) from None
        except DatabaseError as exc:
            self._journal.pop(seq, None)  # nothing of the step committed
            if step is not None:
                self._journal[seq] = step
            raise self._commit_failed(exc) from exc
        self._taken_over_from = ""
