"""Step controls (design 9.5), the operator's face of :mod:`django_weft.store.step_controls`: check the arguments,
find the chain's current run, act, and tell what happened. The admin, the API and ``weft_runs step`` call these;
``WorkflowHandle`` has them as methods."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django_weft.common import clock
from django_weft.common.durations import to_seconds
from django_weft.exceptions import InvalidArgument
from django_weft.models import Workflow
from django_weft.runtime.activities import RetryPolicy
from django_weft.store import step_controls

RETRY_FIELDS = ("max_attempts", "initial_backoff", "backoff_multiplier", "max_backoff")


def _seq(seq: Any) -> int:
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise InvalidArgument(f"a step is its position in the journal, an int >= 1; got {seq!r}")
    return seq


def fire_timer_now(run: Workflow, seq: int, *, requested_by: str = "") -> None:
    """Fire step ``seq``'s sleep, retry backoff or wait timeout now: the run goes on at once."""
    step_controls.fire_now(run.pk, _seq(seq), clock.now(), requested_by)


def reset_attempts(run: Workflow, seq: int, *, requested_by: str = "") -> None:
    """Let step ``seq``'s activity start over with its retry policy: its next attempt counts as the first."""
    step_controls.reset_attempts(run.pk, _seq(seq), clock.now(), requested_by)


def pause_retries(run: Workflow, seq: int, *, requested_by: str = "") -> None:
    """Hold step ``seq``'s next retry until :func:`unpause_retries` (its backoff no longer wakes the run)."""
    step_controls.pause_retries(run.pk, _seq(seq), clock.now(), requested_by, paused=True)


def unpause_retries(run: Workflow, seq: int, *, requested_by: str = "") -> None:
    """Let step ``seq``'s retries go on: the next begins when its backoff is over (at once if it is)."""
    step_controls.pause_retries(run.pk, _seq(seq), clock.now(), requested_by, paused=False)


def set_activity_options(run: Workflow, seq: int, *, retry: RetryPolicy | dict | None = None,
                         timeout: float | timedelta | None = None,
                         schedule_to_close_timeout: float | timedelta | None = None,
                         requested_by: str = "") -> None:
    """Replace the retry policy (a RetryPolicy, or a dict of its numeric fields), the per-attempt ``timeout`` or
    the ``schedule_to_close_timeout`` of the activity waiting (to retry, or for its async completion) at step
    ``seq``; they apply from its next attempt (an async wait's deadline moves at once). Only what is given
    changes."""
    options: dict[str, Any] = {}
    if retry is not None:
        if isinstance(retry, dict):
            unknown = sorted(set(retry) - set(RETRY_FIELDS))
            if unknown:
                raise InvalidArgument(f"retry takes {', '.join(RETRY_FIELDS)}; not {', '.join(unknown)}")
            retry = RetryPolicy(**retry)  # checked as the decorator checks it
        if not isinstance(retry, RetryPolicy):
            raise InvalidArgument(f"retry must be a weft.RetryPolicy or a dict of its fields, got {retry!r}")
        options["retry"] = {name: getattr(retry, name) for name in RETRY_FIELDS}
    if timeout is not None:
        options["timeout"] = to_seconds(timeout, "timeout", allow_zero=False)
    if schedule_to_close_timeout is not None:
        options["schedule_to_close_timeout"] = to_seconds(schedule_to_close_timeout, "schedule_to_close_timeout",
                                                          allow_zero=False)
    if not options:
        raise InvalidArgument("give retry, timeout or schedule_to_close_timeout: there is nothing to change")
    step_controls.set_options(run.pk, _seq(seq), clock.now(), options, requested_by)


def declared_retry(run: Workflow, seq: int) -> RetryPolicy:
    """The retry policy the activity at step ``seq`` has now (its declaration, or an operator's replacement), which a
    partial replacement (the API's) completes."""
    from django_weft.models import StepControl, WorkflowStep
    from django_weft.runtime.activities import DEFAULT_RETRY_POLICY, definitions_by_name

    step = WorkflowStep.objects.filter(run=run, seq=seq).only("name").first()
    definition = definitions_by_name().get(step.name) if step is not None else None
    policy = definition.retry if definition is not None else DEFAULT_RETRY_POLICY
    control = StepControl.objects.filter(run=run, seq=seq).first()
    return RetryPolicy(**{**{name: getattr(policy, name) for name in RETRY_FIELDS}, **(control.retry or {})}
                       ) if control is not None and control.retry else policy


ACTIONS = {"fire_timer_now": fire_timer_now, "reset_attempts": reset_attempts, "pause_retries": pause_retries,
           "unpause_retries": unpause_retries, "set_activity_options": set_activity_options}


def perform(run: Workflow, action: str, seq: int, *, requested_by: str = "", **options: Any) -> None:
    """One of ACTIONS by name (the admin, the API and the CLI dispatch through here)."""
    control = ACTIONS.get(action)
    if control is None:
        raise InvalidArgument(f"unknown step control {action!r}; one of {', '.join(ACTIONS)}")
    if action != "set_activity_options" and options:
        raise InvalidArgument(f"{action} takes no options ({', '.join(sorted(options))})")
    control(run, seq, requested_by=requested_by, **options)
