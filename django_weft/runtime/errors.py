"""Control-flow exceptions of the engine.

They derive from BaseException so that a workflow's ``except Exception:`` cannot swallow them.
"""

from __future__ import annotations

import traceback
from typing import Any

from django_weft.common.storable import storable_json, storable_text
from django_weft.exceptions import (
    ActivityCancelled,
    ActivityError,
    ActivityTimeout,
    BranchCancelled,
    ChildWorkflowFailed,
    NonDeterminismError,
    PayloadTooLarge,
    WaitTimeout,
)
from django_weft.models.choices import AttemptOutcome, FailureCategory, RunStatus


class EngineExit(BaseException):
    """The engine takes the run's code off the executor before the workflow has ended (it parks, stops, is
    handed back or taken away, reached its history limit, continues as new, or a dry replay reached the
    frontier). The code unwinds through its ``finally:`` and ``except BaseException:`` blocks then, but the
    workflow goes on later: every durable call made while it unwinds re-raises this (runtime.replay.core)."""


class Suspend(EngineExit):
    """The run parked (its state is committed); the executor has nothing more to do with it."""


class StopExecution(EngineExit):
    """The executor must stop driving this run: it lost the run, or the worker is shutting down."""

    def __init__(self, *, release: bool, fail_with: dict[str, Any] | None = None) -> None:
        super().__init__()
        # True: the run is still ours and should be handed back; False: it was taken from us.
        self.release = release
        # The run is still ours but cannot go on: the database refused to store its next step for a
        # reason no retry fixes. The executor fails the run with this error instead.
        self.fail_with = fail_with


class ContinueAsNew(EngineExit):
    """``ctx.continue_as_new()``: the executor ends the run and starts the next with this (encoded) input."""

    def __init__(self, input: bytes) -> None:
        super().__init__()
        self.input = input


class HistoryLimitReached(EngineExit):
    """The run's next step would pass WEFT_MAX_HISTORY journal rows."""

    def __init__(self, seq: int, limit: int) -> None:
        super().__init__()
        self.seq = seq
        self.limit = limit


class ReplayFrontier(EngineExit):
    """A dry replay (the replay check) reached work not in the journal: everything before it matched."""


MAX_TRACEBACK_CHARS = 8000
MAX_MESSAGE_CHARS = 4000


def _type_name(kind: type[BaseException]) -> str:
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def error_dict(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A description of an exception that every database can store (see :mod:`django_weft.common.storable`),
    kept on steps and runs."""
    name = _type_name(type(exc))
    try:
        message = str(exc)
    except Exception as broken:  # an exception whose __str__ raises must still be recordable
        message = f"<{name}.__str__ raised {type(broken).__name__}>"
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        text = ""
    # Escaped first, then cut: an escape makes text longer.
    return {
        "type": storable_text(name),
        "message": storable_text(message)[:MAX_MESSAGE_CHARS],
        "traceback": storable_text(text)[-MAX_TRACEBACK_CHARS:],
        **storable_json(extra),
    }


# What is not the application's own failure, by exception class (the first match wins) and by the type a
# recorded error names (error_dict's, or the engine's own short names).
_CATEGORIES: tuple[tuple[type[BaseException], str], ...] = (
    (ActivityTimeout, FailureCategory.TIMEOUT),
    (WaitTimeout, FailureCategory.TIMEOUT),
    (ActivityCancelled, FailureCategory.CANCELLATION),
    (BranchCancelled, FailureCategory.CANCELLATION),
    (NonDeterminismError, FailureCategory.SYSTEM),
    (PayloadTooLarge, FailureCategory.RESOURCE),
)
_CATEGORY_OF_TYPE: dict[str, str] = {
    **{_type_name(kind): category for kind, category in _CATEGORIES},
    "WaitTimeout": FailureCategory.TIMEOUT,
    "BranchCancelled": FailureCategory.CANCELLATION,
    "AttemptLost": FailureCategory.SYSTEM,  # the last attempt allowed was lost with its executor
}
_CATEGORY_OF_STATUS: dict[str, str] = {
    RunStatus.CANCELLED: FailureCategory.CANCELLATION,
    RunStatus.TIMED_OUT: FailureCategory.TIMEOUT,
}


def error_category(error: dict | None) -> str:
    """The failure category (a FailureCategory value) of a recorded error: a failed step's."""
    return _CATEGORY_OF_TYPE.get(str((error or {}).get("type")), FailureCategory.APPLICATION)


def attempt_outcome(error: dict | None) -> str:
    """How an attempt that failed with ``error`` (a recorded error) ended: timed out or failed."""
    return AttemptOutcome.TIMED_OUT if error_category(error) == FailureCategory.TIMEOUT else AttemptOutcome.FAILED


def failure_category_of(exc: BaseException) -> str:
    """The failure category of what ``exc`` fails (a run the workflow let it through): an activity's
    failure is its last attempt's, a child's is the child's."""
    if isinstance(exc, ActivityError):
        return _CATEGORY_OF_TYPE.get(exc.error_type, FailureCategory.APPLICATION)
    if isinstance(exc, ChildWorkflowFailed):
        return child_category(exc.failure_category, exc.status)
    return next((category for kind, category in _CATEGORIES if isinstance(exc, kind)), FailureCategory.APPLICATION)


def child_category(recorded: str, status: str) -> str:
    """A failed child's category, from what its run recorded (or, for a run that recorded none, its status)."""
    return recorded or _CATEGORY_OF_STATUS.get(status, FailureCategory.APPLICATION)


def termination_reason_of(exc: BaseException) -> str:
    """Why the engine ended a run that ``exc`` fails, where the engine ended it; "" for the workflow's own
    failures."""
    if isinstance(exc, NonDeterminismError):
        return "non_determinism"
    if isinstance(exc, PayloadTooLarge):
        return "payload_too_large"
    return ""


def refused_by_database(exc: BaseException, what: str, **extra: Any) -> dict[str, Any]:
    """The error a run fails with when the database refuses to store ``what`` for a reason no retry fixes."""
    error = error_dict(exc, **extra)
    error["message"] = f"the database refused to store {what}: {error['message']}"
    return error


def is_transient(exc: BaseException) -> bool:
    """A database error that trying again can fix (a lost connection, a lock or statement timeout, a
    deadlock, a serialisation failure), as opposed to one it cannot (data the database refuses, a broken
    constraint, a missing table)."""
    from django.db import InterfaceError, OperationalError

    return isinstance(exc, OperationalError | InterfaceError)
