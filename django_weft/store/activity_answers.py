"""Outside systems' answers to async activity attempts, recorded against the run they belong to.

Part of the state writer: each answer is one transaction over the locked run row, bumping its inbox so a
parked run wakes and a replaying one re-parks awake. Which attempts a token may resolve is decided here, and
which may still beat (:func:`beat_async`: one unlocked write, the run row untouched).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from django_weft.common.tokens import TaskToken, make_task_token
from django_weft.exceptions import (
    InvalidTaskToken,
    TaskTokenAlreadyUsed,
    WorkflowNotFound,
)
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    AttemptOutcome,
    StepAttempt,
    StepKind,
    StepStatus,
    Workflow,
    WorkflowStep,
)
from django_weft.store import activity_heartbeats, lock_retries
from django_weft.store.inbox import record_event
from django_weft.store.transitions import S, locked_run


@lock_retries.retrying("resolve_async")
def resolve_async(token: TaskToken, now: datetime, *, status: str, result: bytes | None = None,
                  error: dict | None = None) -> AsyncActivity:
    """Record an outside system's completion (or failure) of the async activity attempt ``token`` names.

    A token resolves exactly one attempt, once: the attempt's record, or, if the attempt has not parked
    yet (the outside system answered before ``complete_async()`` committed, or the executor died first),
    a record kept for the park to find. Tokens of attempts that can no longer be resolved (finished
    steps, later attempts, runs retried since) are refused.
    """
    run_id, seq, attempt, generation = token
    with transaction.atomic():
        try:
            run = locked_run(run_id)
        except WorkflowNotFound:
            raise InvalidTaskToken("the task token's workflow run no longer exists") from None
        if run.retries != generation:
            raise TaskTokenAlreadyUsed(
                f"the task token belongs to an attempt from before run {run.pk} was retried; it resolves nothing"
            )
        record = AsyncActivity.objects.select_for_update().filter(run=run, seq=seq, attempt=attempt).first()
        if record is None:
            if run.is_finished:
                raise TaskTokenAlreadyUsed(f"the task token's run is {run.status}; it takes no completions")
            _check_attempt_in_flight(run, seq, attempt)
            # A genuine token whose attempt has not parked yet: keep the answer; the park (or the replay
            # after a crash) finds it and applies it instead of waiting.
            record = AsyncActivity(run=run, seq=seq, attempt=attempt, activity="", created_at=now,
                                   token=make_task_token(run.pk, seq, attempt, generation))
            record.status, record.result, record.error, record.resolved_at = status, result, error, now
            record.save(force_insert=True)
            record_event(run, now, wakes=True)
            return record
        if record.status != AsyncStatus.PENDING:
            raise TaskTokenAlreadyUsed(
                f"the async activity {record.activity!r} (step {seq}, attempt {attempt}) is already "
                f"{record.status}; a task token can be used once"
            )
        record.status, record.result, record.error, record.resolved_at = status, result, error, now
        record.save(update_fields=["status", "result", "error", "resolved_at"])
        record_event(run, now, wakes=True)
    return record


def beat_async(token: TaskToken, now: datetime, details: bytes | None) -> bool:
    """Record an outside system's heartbeat for the async activity attempt ``token`` names; True if the
    attempt was cancelled (the outside system should stop), False if it goes on.

    Tokens are checked as completions check them. The attempt's record says how it ended: completed, failed
    or timed out refuses the beat (TaskTokenAlreadyUsed), cancelled answers True, as does a closed run. A
    pending attempt (or one still running its body, not parked yet) stores the beat: its time renews the
    attempt's heartbeat_timeout (read when its timer fires), its details (None keeps those stored) go to the
    step's next attempt. Neither the run row nor its fence is touched, so a beat never delays the run's commits.
    """
    run_id, seq, attempt, generation = token
    run = Workflow.objects.filter(pk=run_id).only("status", "retries").first()
    if run is None:
        raise InvalidTaskToken("the task token's workflow run no longer exists")
    if run.retries != generation:
        raise TaskTokenAlreadyUsed(
            f"the task token belongs to an attempt from before run {run.pk} was retried; it takes no heartbeats")
    status = AsyncActivity.objects.filter(run=run, seq=seq, attempt=attempt).values_list("status", flat=True).first()
    if status in (AsyncStatus.COMPLETED, AsyncStatus.FAILED, AsyncStatus.TIMED_OUT):
        raise TaskTokenAlreadyUsed(
            f"the async activity attempt (step {seq}, attempt {attempt}) is already {status}; it takes no heartbeats")
    if status == AsyncStatus.CANCELLED or run.is_finished:
        return True
    if status is None:
        _check_attempt_in_flight(run, seq, attempt)  # handed out by a body that has not parked yet
    activity_heartbeats.save(run_id, seq, attempt, now, details)
    return False


def _check_attempt_in_flight(run: Workflow, seq: int, attempt: int) -> None:
    """Refuse a token whose attempt has no record unless that attempt may be running right now: the one
    after the step's last recorded attempt (none yet: the first; a step waiting out a retry backoff or an
    attempt lost with its executor: the next). A lost attempt's token is used up."""
    step = WorkflowStep.objects.filter(run=run, seq=seq).only("kind", "status", "attempt").first()
    history = dict(StepAttempt.objects.filter(run=run, seq=seq).values_list("attempt", "outcome"))
    if history.get(attempt) == AttemptOutcome.LOST:
        raise TaskTokenAlreadyUsed(
            f"attempt {attempt} of step {seq} of run {run.pk} was lost with its executor and the step went on "
            "with the next attempt; its task token resolves nothing")
    if run.status not in (S.RUNNING, S.SUSPENDED):
        # Pending or parked: no attempt body can be running. (A suspended run's executor may still be in
        # the body it lost the run in; the attempt runs again after resume, with the same token.)
        in_flight = False
    elif step is None:
        in_flight = attempt == max(history, default=0) + 1
    else:
        in_flight = (step.kind == StepKind.ACTIVITY and step.status == StepStatus.WAITING
                     and attempt == max(step.attempt, *history) + 1)
    if not in_flight:
        finished = step is not None and step.status in (StepStatus.COMPLETED, StepStatus.FAILED)
        raise InvalidTaskToken(
            f"the task token names attempt {attempt} of step {seq} of run {run.pk}, which "
            + ("has finished without waiting for a completion (not an async activity attempt)" if finished
               else "is not waiting for a completion")
        )
