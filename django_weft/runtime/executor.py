"""Drive one claimed run: replay its journal, run what comes next, and record how it ended."""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import DatabaseError

from django_weft.common import attributes, clock
from django_weft.common.codec import encode
from django_weft.common.registry import WorkflowDefinition, get_workflow
from django_weft.conf import weft_settings
from django_weft.exceptions import (
    ActivityError,
    CancelledError,
    FencingError,
    InvalidArgument,
    NonDeterminismError,
    PayloadError,
    WeftError,
    WorkflowNotRegistered,
)
from django_weft.models import FailureCategory, StepKind, StepStatus, Timer, Workflow, WorkflowStep
from django_weft.models.instances import loaded
from django_weft.observability import events
from django_weft.runtime import kept_journals, sticky_runs
from django_weft.runtime.activities import any_limited
from django_weft.runtime.context import Context
from django_weft.runtime.errors import (
    ContinueAsNew,
    HistoryLimitReached,
    StopExecution,
    Suspend,
    error_dict,
    failure_category_of,
    is_transient,
    refused_by_database,
    termination_reason_of,
)
from django_weft.runtime.replay.core import run_workflow_code
from django_weft.store import activity_slots, transitions
from django_weft.store.starts import prepare_run

logger = logging.getLogger("django_weft.executor")

# An executor that finds a run of a type it does not know puts it back for this long (a deploy may be
# rolling out the code that knows it).
UNKNOWN_TYPE_RETRY = timedelta(seconds=60)

# Runs still waiting in a claimed batch after this long (a slow run held them up) go back to the pool,
# where idle executors can take them.
BATCH_HOLD_SECONDS = 2.0

# Outcomes of execute()
COMPLETED, FAILED, CANCELLED, WAITING, RELEASED, LOST, TIMED_OUT, CONTINUED, HELD = (
    "completed", "failed", "cancelled", "waiting", "released", "lost", "timed_out", "continued", "held",
)

# A run held because its code raised (on_error="hold") is tried again after this many seconds, doubled at each
# hold up to WEFT_WORKFLOW_HOLD_MAX_BACKOFF, and whenever a process starts.
HOLD_FIRST_BACKOFF = 1.0

# termination_reason of a run failed because the database refused to store a step or its outcome.
DATABASE_REFUSED = "database_refused"

# weft_maintenance warns about a run whose journal holds this share of WEFT_MAX_HISTORY.
HISTORY_WARNING = 0.8


def execute(claim: transitions.Claim, should_stop: Callable[[], bool] = lambda: False, *,
            stay_parked: bool = True) -> str:
    """Drive ``claim.run`` until it parks, finishes, or is taken away. Never raises for workflow errors.
    ``stay_parked=False``: this thread will not claim the run again (a caller's), so its code is not kept where
    it parks (runtime.sticky_runs)."""
    with events.execution(claim.run) as observed:  # its span is current while the workflow's code runs
        outcome = _execute(claim, should_stop, stay_parked)
        observed.ended(outcome)
    return outcome


def _execute(claim: transitions.Claim, should_stop: Callable[[], bool], stay_parked: bool) -> str:
    run = claim.run
    now = clock.now()
    if run.execution_deadline is not None and run.execution_deadline <= now:
        return TIMED_OUT if transitions.time_out(run.pk, now) else LOST
    try:
        definition = get_workflow(run.workflow_type, version=run.version)
    except WorkflowNotRegistered as exc:
        # Held, not failed: a deploy may be rolling out (or back to) the code that has it.
        logger.error("run %s: %s; retrying in %s", run.pk, exc, UNKNOWN_TYPE_RETRY)
        transitions.release(claim, now, retry_at=now + UNKNOWN_TYPE_RETRY, reason=str(exc))
        return RELEASED

    # The whole journal in one query, and the unfired timers in one more: replay costs no per-step reads.
    # A run claimed for the first time has no journal yet; only waiting steps (sleeps, retry backoffs)
    # have timers.
    journal: dict[int, WorkflowStep] = {}
    timers: dict[int, Timer] = {}
    sticky: sticky_runs.StickyCode | None = None
    if not claim.fresh:
        # Parked on this thread at the fence before this claim's: its code waits where it parked, and the journal
        # it holds is the whole of it (runtime.sticky_runs). Parked by this process: the journal it kept is
        # (runtime.kept_journals). Either way, in case a row was written where this process did not see it, only
        # if the database holds as many rows.
        sticky = sticky_runs.take(run.pk, claim.fence, definition)
        kept = None if sticky is not None else kept_journals.take(run.pk, claim.fence)
        held = sticky.ctx._journal if sticky is not None else kept.journal if kept is not None else None
        if held is not None and WorkflowStep.objects.filter(run_id=run.pk).count() != len(held):
            logger.warning("run %s: the journal kept at its park differs from the database's; read again", run.pk)
            if sticky is not None:
                sticky.let_go()
            sticky = kept = held = None
        if kept is not None:
            claim.has_dependents = kept.has_dependents  # as the execution that parked it left it
        if held is not None:
            journal = held
        else:
            journal = {step.seq: step for step in loaded(WorkflowStep.objects.filter(run_id=run.pk))}
            # Slots an earlier execution asked for may still be in line (a branch it never polled again): the
            # run's close must drop them.
            claim.has_dependents = any(step.kind == StepKind.CHILD for step in journal.values()) or (
                any_limited() and activity_slots.run_has_slots(run.pk))
        # Newest first: a parked run's waiting step is mostly its last.
        if any(step.status == StepStatus.WAITING for step in reversed(journal.values())):
            timers = {int(t.seq or 0): t for t in Timer.objects.filter(run_id=run.pk, fired_at__isnull=True,
                                                                       seq__isnull=False)}
    if claim.previous_status == transitions.S.RUNNING and claim.previous_owner:
        events.takeover(run, previous_owner=claim.previous_owner, owner=claim.owner)
        poisoned = _count_recovery(claim, len(journal))
        if poisoned is not None:
            if sticky is not None:
                sticky.let_go()
            return poisoned
    if len(journal) >= HISTORY_WARNING * weft_settings.MAX_HISTORY:
        logger.warning("run %s of %s holds %d journal rows, %d%% of WEFT_MAX_HISTORY (%d); it times out at the "
                       "limit: let it ctx.continue_as_new()", run.pk, run.workflow_type, len(journal),
                       100 * len(journal) // weft_settings.MAX_HISTORY, weft_settings.MAX_HISTORY)
    if sticky is not None:
        ctx = sticky.ctx
        ctx.resume(claim, timers, should_stop)
    else:
        ctx = Context(claim, journal, timers, should_stop)
        # Not on a run's first execution: most runs end in it (a greenlet would only cost them), and a run that
        # parks is kept from its next one.
        if stay_parked and not claim.fresh and weft_settings.STICKY_ROWS:
            sticky = sticky_runs.StickyCode(ctx, definition, partial(run_workflow_code, ctx, definition, run.input))
    try:
        ending, stays = _run_code(ctx, claim, definition, sticky)
    finally:
        # Nothing of the execution runs on once it ends: attempts still in flight are asked to stop and waited
        # for before the run is finished, parked or handed back.
        ctx.close_branches()
    outcome = ending()
    if stays and sticky is not None and outcome == WAITING:
        sticky_runs.keep(run.pk, claim.fence, sticky)  # its code waits where it parked, on this thread
    whole = ctx.whole_journal() if outcome == WAITING else None
    if whole is not None:
        # Parked: its rows are all committed. For another thread of this process that claims it next (the code kept
        # on this one is then let go, its fence passed).
        kept_journals.keep(run.pk, claim.fence, whole, claim.has_dependents or bool(claim.slot_seqs))
    return outcome


def _run_code(ctx: Context, claim: transitions.Claim, definition: WorkflowDefinition,
              sticky: sticky_runs.StickyCode | None) -> tuple[Callable[[], str], bool]:
    """Run the workflow's code over its journal (in ``sticky``'s greenlet, or on from where it parked there); how
    its execution ends, to apply once nothing of it runs, and whether the code stays parked in ``sticky``."""
    stays = False

    def code() -> Any:
        nonlocal stays
        if sticky is None:
            return run_workflow_code(ctx, definition, claim.run.input)
        stays, value = sticky.switch_in()
        if stays:
            raise Suspend()  # parked, its code waiting where it parked
        return value

    ending = _ending(ctx, claim, definition, code)
    return ending, stays


def _ending(ctx: Context, claim: transitions.Claim, definition: WorkflowDefinition,
            code: Callable[[], Any]) -> Callable[[], str]:
    run = claim.run
    try:
        value = code()
        ctx.assert_journal_consumed()
        result = encode(value, what=f"result of workflow {run.workflow_type!r}")
    except Suspend:
        return lambda: WAITING  # parked: its state is committed
    except ContinueAsNew as continued:
        return partial(_continue, claim, continued.input)
    except HistoryLimitReached as limit:
        message = (f"the run's journal reached WEFT_MAX_HISTORY ({limit.limit} rows) at step {limit.seq}; a run that "
                   "loops for long should ctx.continue_as_new()")
        logger.error("run %s of %s timed out: %s", run.pk, run.workflow_type, message)
        return partial(_finish, claim, transitions.S.TIMED_OUT, error={"type": "HistoryLimit", "message": message},
                       failure_category=FailureCategory.TIMEOUT, termination_reason="history_limit")
    except CancelledError:
        # Uncaught (or raised again after its cleanup): the run ends cancelled, as a cancel always ended it.
        return partial(_finish, claim, transitions.S.CANCELLED, error=_cancelled_error(claim),
                       failure_category=FailureCategory.CANCELLATION,
                       termination_reason=run.termination_reason or transitions.CANCEL_REQUESTED)
    except StopExecution as stop:
        if stop.fail_with is not None:  # the database refused to store a step
            return partial(_finish, claim, transitions.S.FAILED, error=stop.fail_with,
                           failure_category=FailureCategory.RESOURCE, termination_reason=DATABASE_REFUSED)
        if stop.release:
            return partial(hand_back, claim)
        return lambda: LOST
    except Exception as exc:
        if holds(definition, exc):
            return partial(_hold, claim, exc)
        # Never raises, even for an exception whose __str__ does. An activity's failure names its step, which
        # an operator's retry runs again even when later branches settled after it.
        error = error_dict(exc, **({"step": exc.seq} if isinstance(exc, ActivityError) and exc.seq else {}))
        logger.error("run %s of %s failed: %s: %s", run.pk, run.workflow_type, error["type"], error["message"])
        return partial(_finish, claim, transitions.S.FAILED, error=error, failure_category=failure_category_of(exc),
                       termination_reason=termination_reason_of(exc))
    return partial(_finish, claim, transitions.S.COMPLETED, result=result)


def holds(definition: WorkflowDefinition, exc: Exception) -> bool:
    """The run is held, not failed: its workflow holds runs whose own code raises (a bug a deploy can fix: any
    exception but an activity's or child's failure, a wait that timed out, weft.ApplicationError...), and this is
    such an exception (an API misused, a journal the code no longer matches, a result it cannot store included)."""
    on_error = definition.on_error or weft_settings.WORKFLOW_ERRORS
    if on_error != "hold":
        return False
    return not isinstance(exc, WeftError) or isinstance(exc, InvalidArgument | NonDeterminismError | PayloadError)


def _hold(claim: transitions.Claim, exc: Exception) -> str:
    run = claim.run
    backoff = min(HOLD_FIRST_BACKOFF * 2 ** min(run.code_errors, 30),
                  float(weft_settings.WORKFLOW_HOLD_MAX_BACKOFF))
    now = clock.now()
    retry_at = now + timedelta(seconds=backoff)
    where = _raised_at(exc)
    error = error_dict(exc)
    reason = (f"held: the workflow's code raised {error['type']}: {error['message']}{where}; tried again at "
              f"{retry_at.isoformat(timespec='seconds')} and when a process starts (a deploy)")
    logger.error("run %s of %s held (on_error=\"hold\"): %s: %s%s", run.pk, run.workflow_type, error["type"],
                 error["message"], where)
    return HELD if transitions.hold(claim, now, retry_at=retry_at, reason=reason) else LOST


def _raised_at(exc: BaseException) -> str:
    """`` at file:line`` of the innermost frame of the traceback outside django_weft (the workflow's code)."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}django_weft{os.sep}" not in frame.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"


def _cancelled_error(claim: transitions.Claim) -> dict:
    """Why the run was cancelled: the reason of its request (read again if the request came while it ran)."""
    run = claim.run
    if run.cancel_requested_at is None and claim.cancel_requested:
        run.cancel_reason = Workflow.objects.filter(pk=run.pk).values_list("cancel_reason", flat=True).first() or ""
    return transitions.cancel_error(run.cancel_reason)


def _count_recovery(claim: transitions.Claim, progress: int) -> str | None:
    """This claim took the run over from an executor that died. One that keeps dying at the same step (a
    poison run: it exhausts memory, crashes the interpreter) fails after WEFT_MAX_RECOVERY_ATTEMPTS instead
    of being re-claimed forever. Returns the outcome if the run failed, else None."""
    run = claim.run
    recoveries = run.recoveries + 1 if run.recovery_mark == progress else 1
    limit = int(weft_settings.MAX_RECOVERY_ATTEMPTS)
    if recoveries >= limit:
        message = (f"the run was taken over {recoveries} times at step {progress + 1} without progress: each "
                   "executor running it died there (WEFT_MAX_RECOVERY_ATTEMPTS)")
        logger.error("run %s of %s failed: %s", run.pk, run.workflow_type, message)
        return _finish(claim, transitions.S.FAILED, error={"type": "RecoveryLimit", "message": message,
                                                           "step": progress + 1},
                       failure_category=FailureCategory.SYSTEM, termination_reason="recovery_limit")
    try:
        transitions.note_recovery(claim, clock.now(), recoveries, progress)
    except FencingError:
        return LOST
    run.recoveries, run.recovery_mark = recoveries, progress
    return None


def _continue(claim: transitions.Claim, data: bytes) -> str:
    """The run continues as new: the next run of its workflow id, with the newest version of its type."""
    run = claim.run
    # It keeps its predecessor's place on its queue: admitted, never queued again.
    following = prepare_run(get_workflow(run.workflow_type), workflow_id=run.workflow_id, tags=run.tags,
                            search_attributes=attributes.from_json(run.search_attributes),
                            queue=run.queue or None, concurrency_key=run.concurrency_key, priority=run.priority,
                            admitted=True)
    following.input = data
    following.restarted_from = run
    following.schedule_id = run.schedule_id
    following.parent_id, following.parent_close_policy = run.parent_id, run.parent_close_policy
    try:
        transitions.continue_as_new(claim, clock.now(), following)
    except FencingError:
        return LOST
    return CONTINUED


def hand_back(claim: transitions.Claim) -> str:
    """Release a held run without executing it (a stop, a held-up batch): RELEASED, or LOST if taken."""
    return RELEASED if transitions.release(claim, clock.now()) else LOST


def _finish(claim: transitions.Claim, status: str, *, result: bytes | None = None,
            error: dict | None = None, failure_category: str = "", termination_reason: str = "") -> str:
    try:
        transitions.finish(claim, clock.now(), status, result=result, error=error,
                           failure_category=failure_category, termination_reason=termination_reason)
    except FencingError:
        return LOST
    except DatabaseError as exc:
        if is_transient(exc):
            raise  # the worker logs it; the run is retried when its lease expires
        # The database refused the result or the error (a result column it cannot hold): fail the run
        # with the database's reason, which always fits, instead of retrying the same refusal forever.
        logger.error("run %s: the database refused to store its %s outcome (%s: %s); the run fails",
                     claim.run.pk, status, type(exc).__name__, exc)
        try:
            transitions.finish(claim, clock.now(), transitions.S.FAILED,
                               error=refused_by_database(exc, f"the run's {status} outcome"),
                               failure_category=FailureCategory.RESOURCE, termination_reason=DATABASE_REFUSED)
        except FencingError:
            return LOST
        return FAILED
    outcomes: dict[str, str] = {transitions.S.COMPLETED: COMPLETED, transitions.S.FAILED: FAILED}
    return outcomes.get(status, CANCELLED)
