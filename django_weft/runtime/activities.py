"""Activities: the plain functions that hold a workflow's side effects, their retry policy, and async
activities that an outside system completes with a signed task token."""

from __future__ import annotations

import contextvars
import inspect
import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, overload

from django_weft.common.durations import to_seconds
from django_weft.common.queues import ActivityLimits, Rate, parse_rate
from django_weft.common.storable import check_text, unstorable_reason
from django_weft.common.tokens import make_task_token, parse_task_token
from django_weft.exceptions import ApplicationError, InvalidArgument, WeftError

if TYPE_CHECKING:
    from django_weft.runtime.heartbeats import AttemptControl

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast a failing activity is tried again.

    ``max_attempts`` counts every attempt, the first included; ``None`` retries without limit (bounded by the
    activity's ``schedule_to_close_timeout``, with waits that stop growing at ``max_backoff``). The wait before
    attempt n+1 is
    ``min(initial_backoff * backoff_multiplier ** (n - 1), max_backoff)`` seconds, spent as a durable
    timer: the run parks, no thread sleeps. Exceptions of a ``non_retryable`` type fail at once.
    """

    max_attempts: int | None = 3
    initial_backoff: float = 1.0
    backoff_multiplier: float = 2.0
    max_backoff: float = 30.0
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        limit = self.max_attempts
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise InvalidArgument(f"RetryPolicy.max_attempts must be an int >= 1 or None (no limit), got {limit!r}")
        # Stored as seconds, whether given as numbers or timedeltas.
        object.__setattr__(self, "initial_backoff",
                           to_seconds(self.initial_backoff, "RetryPolicy.initial_backoff", allow_zero=True))
        object.__setattr__(self, "max_backoff",
                           to_seconds(self.max_backoff, "RetryPolicy.max_backoff", allow_zero=True))
        if self.initial_backoff > self.max_backoff:  # else the first wait would silently be max_backoff
            raise InvalidArgument(f"RetryPolicy.initial_backoff ({self.initial_backoff:g} s) is above its max_backoff "
                                  f"({self.max_backoff:g} s): no wait is longer than max_backoff; raise it too")
        multiplier = self.backoff_multiplier
        try:
            finite = isinstance(multiplier, int | float) and not isinstance(multiplier, bool) and math.isfinite(
                float(multiplier))
        except OverflowError:
            finite = False
        if not finite or multiplier < 1:
            raise InvalidArgument(f"RetryPolicy.backoff_multiplier must be a finite number >= 1, got {multiplier!r}")
        kinds = self.non_retryable
        if isinstance(kinds, type):
            kinds = (kinds,)  # one exception class, not a tuple of them
        try:
            checked: tuple | None = tuple(kinds)
        except TypeError:
            checked = None
        if checked is None or not all(isinstance(k, type) and issubclass(k, BaseException) for k in checked):
            raise InvalidArgument(f"RetryPolicy.non_retryable must be exception classes, got {self.non_retryable!r}")
        object.__setattr__(self, "non_retryable", checked)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        try:
            grown = self.initial_backoff * self.backoff_multiplier ** (attempt - 1)
        except OverflowError:
            grown = math.inf
        return min(grown, self.max_backoff)

    def should_retry(self, attempt: int, error: BaseException) -> bool:
        return (self.allows(attempt + 1) and not isinstance(error, self.non_retryable)
                and not (isinstance(error, ApplicationError) and error.non_retryable))

    def allows(self, attempt: int) -> bool:
        """Attempt number ``attempt`` may begin (every attempt counts: failed, timed out and lost ones)."""
        return self.max_attempts is None or attempt <= self.max_attempts


DEFAULT_RETRY_POLICY = RetryPolicy()


@dataclass(frozen=True)
class ResetRetryPolicy(RetryPolicy):
    """A policy whose first ``counted_after`` attempts no longer count (an operator reset the step's attempts)."""

    counted_after: int = 0

    def backoff(self, attempt: int) -> float:
        return super().backoff(max(1, attempt - self.counted_after))

    def allows(self, attempt: int) -> bool:
        return super().allows(attempt - self.counted_after)


@dataclass(frozen=True)
class ActivityDefinition:
    name: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    timeout: float | None
    schedule_to_close_timeout: float | None = None
    heartbeat_timeout: float | None = None
    # Flow control (store/activity_slots): attempts at once, and attempts begun per period, in all processes;
    # per key when ``key`` (called with the activity's arguments) gives one.
    concurrency: int | None = None
    rate: Rate | None = None
    key: Callable[..., Any] | None = None
    # @weft.transaction (runtime.transactions): the function runs in the transaction that records its step; the
    # models it declared it writes, checked against the router before it runs.
    transactional: bool = False
    models: tuple[type, ...] = ()

    @property
    def step_kind(self) -> str:
        from django_weft.models.choices import StepKind

        return StepKind.TRANSACTION if self.transactional else StepKind.ACTIVITY

    @property
    def limits(self) -> ActivityLimits | None:
        if self.concurrency is None and self.rate is None:
            return None
        return ActivityLimits(concurrency=self.concurrency, rate=self.rate, keyed=self.key is not None)


@overload
def activity(fn: F, /) -> F: ...
@overload
def activity(
    *, name: str | None = None, retry: RetryPolicy | None = None, timeout: float | timedelta | None = None,
    schedule_to_close_timeout: float | timedelta | None = None, heartbeat_timeout: float | timedelta | None = None,
    concurrency: int | None = None, rate: str | None = None, key: Callable[..., str] | None = None,
) -> Callable[[F], F]: ...


def activity(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | timedelta | None = None,
    schedule_to_close_timeout: float | timedelta | None = None,
    heartbeat_timeout: float | timedelta | None = None,
    concurrency: int | None = None,
    rate: str | None = None,
    key: Callable[..., str] | None = None,
) -> Any:
    """Mark a function as an activity: ``@weft.activity`` or ``@weft.activity(retry=..., timeout=30)``.

    The function stays callable as before; ``ctx.run(fn, ...)`` runs it as a journaled step. ``timeout``
    caps each attempt: the workflow stops waiting and fails the attempt (the function itself cannot be
    interrupted and runs on in the background). ``schedule_to_close_timeout`` caps the whole activity,
    retries and backoffs included, and an async activity's wait for its completion (a durable timer).
    ``heartbeat_timeout``: an attempt that has not called ``weft.heartbeat()`` for this long fails with
    ActivityTimeout and is retried by its policy. ``async def`` functions work as activities too.

    ``concurrency`` (attempts executing at once) and ``rate`` ("N/s", "N/m", "N/h": attempts begun in any window
    of that length) bound the activity's attempts across every executor and process; with ``key`` (called with
    the activity's arguments, returning a string) they bound each key's. An attempt over its limit waits, its
    run parked (no thread held, its timeouts not started), and begins when a slot frees, in start order.
    """
    timeout_seconds = None if timeout is None else to_seconds(timeout, "activity timeout", allow_zero=False)
    close_seconds = (None if schedule_to_close_timeout is None
                     else to_seconds(schedule_to_close_timeout, "schedule_to_close_timeout", allow_zero=False))
    heartbeat_seconds = (None if heartbeat_timeout is None
                         else to_seconds(heartbeat_timeout, "heartbeat_timeout", allow_zero=False))

    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or concurrency < 1):
        raise InvalidArgument(f"activity concurrency must be a positive int, got {concurrency!r}")
    rate_limit = parse_rate(rate, "activity rate")
    if key is not None and not callable(key):
        raise InvalidArgument(f"activity key must be a function of the activity's arguments, got {key!r}")
    if key is not None and concurrency is None and rate_limit is None:
        raise InvalidArgument("activity key counts the concurrency or rate of each key: give one of them")
    if name is not None and (not isinstance(name, str) or not name or len(name) > 255 or unstorable_reason(name)):
        raise InvalidArgument(f"activity name {name!r} must be a non-empty string of at most 255 characters "
                              "without NUL or lone surrogates")

    def register(func: F) -> F:
        definition = ActivityDefinition(
            name=name or f"{func.__module__}.{func.__qualname__}",
            fn=func,
            retry=retry or DEFAULT_RETRY_POLICY,
            timeout=timeout_seconds,
            schedule_to_close_timeout=close_seconds,
            heartbeat_timeout=heartbeat_seconds,
            concurrency=concurrency,
            rate=rate_limit,
            key=key,
        )
        return register_definition(func, definition)

    if fn is not None:
        return register(fn)
    return register


def register_definition(func: F, definition: ActivityDefinition) -> F:
    """Attach ``definition`` to ``func`` (what ``ctx.run(func)`` runs) and register it by name."""
    global _any_limited
    func.__weft_activity__ = definition  # type: ignore[attr-defined]
    _by_name[definition.name] = definition
    _any_limited = _any_limited or definition.limits is not None
    return func


# Whether any activity registered in this process has a concurrency or rate limit: a project that uses none
# never looks for slots.
_any_limited = False


def any_limited() -> bool:
    """Whether some registered activity has a concurrency or rate limit."""
    return _any_limited


# --- replacements (test doubles) ----------------------------------------------------------------------

# Bodies that stand in for activities, by activity name, newest last: the one at the end is called for
# every attempt instead of the activity's own function. ``django_weft.testing`` sets them
# (``WeftTestEnv.mock_activity``); they apply to runs executed in this process.
_replacements: dict[str, list[_Replacement]] = {}
_replacements_lock = threading.Lock()


class _Replacement:
    """One replacement, compared by identity (the same body may be installed twice)."""

    __slots__ = ("body",)

    def __init__(self, body: Callable[..., Any]) -> None:
        self.body = body

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.body(*args, **kwargs)


def replace_activity(activity_name: str, body: Callable[..., Any]) -> Callable[[], None]:
    """Call ``body`` instead of activity ``activity_name``'s function from now on; returns the function
    that undoes exactly this replacement (replacements stack: undoing the newest uncovers the previous)."""
    entry = _Replacement(body)
    with _replacements_lock:
        _replacements.setdefault(activity_name, []).append(entry)

    def undo() -> None:
        with _replacements_lock:
            stack = _replacements.get(activity_name, [])
            if entry in stack:
                stack.remove(entry)
            if not stack:
                _replacements.pop(activity_name, None)

    return undo


def body_of(definition: ActivityDefinition) -> Callable[..., Any]:
    """What an attempt of ``definition`` calls: its function, or the newest replacement of it."""
    stack = _replacements.get(definition.name)
    return stack[-1] if stack else definition.fn


def is_coroutine_body(body: Callable[..., Any]) -> bool:
    """An ``async def`` body (a test's replacement is looked through)."""
    return inspect.iscoroutinefunction(body.body if isinstance(body, _Replacement) else body)


# Activities by registered name (``ctx.run("name", ...)``), the one registered last for a name.
_by_name: dict[str, ActivityDefinition] = {}


def definitions_by_name() -> dict[str, ActivityDefinition]:
    """The registered activities (and transaction functions) by name."""
    return dict(_by_name)


def definition_of(fn: Callable[..., Any] | str) -> ActivityDefinition:
    """The activity definition of ``fn`` (a function, or a registered activity's name); plain functions get the
    default policy."""
    if isinstance(fn, str):
        named = _by_name.get(fn)
        if named is None:
            raise InvalidArgument(f"no activity is registered as {fn!r}; registered: "
                                  f"{', '.join(sorted(_by_name)) or 'none'}")
        return named
    definition = getattr(fn, "__weft_activity__", None)
    if definition is not None:
        return definition
    if not callable(fn):
        raise InvalidArgument(f"ctx.run needs a function, got {fn!r}")
    return ActivityDefinition(
        name=f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}",
        fn=fn,
        retry=DEFAULT_RETRY_POLICY,
        timeout=None,
    )


# --- inside an activity ------------------------------------------------------------------------------


@dataclass
class ActivityInfo:
    """Where the running activity attempt sits: ``weft.activity_info()`` inside an activity."""

    workflow_id: str
    run_id: uuid.UUID
    seq: int
    attempt: int
    activity: str
    # How often an operator retried the run: part of the token, so pre-retry tokens resolve nothing.
    generation: int = 0
    token_handed_out: bool = field(default=False, init=False, repr=False, compare=False)
    # The engine's side of this attempt (cancellation, heartbeats); set by the executor.
    control: AttemptControl | None = field(default=None, repr=False, compare=False)

    @property
    def executor(self) -> str:
        """The executor running this attempt (its ``Executor`` name), "" where none runs it."""
        return self.control.executor if self.control is not None else ""

    @property
    def idempotency_key(self) -> str:
        """``{run_id}:{seq}``: the same for every attempt and replay of this step, so an idempotent API
        (a payment provider) sees a repeated attempt as the same request."""
        return f"{self.run_id}:{self.seq}"

    @cached_property
    def heartbeat_details(self) -> Any:
        """What the step's last ``weft.heartbeat(details)`` (or ``weft.heartbeat_async(token, details)``) stored (an
        earlier attempt's progress), or None."""
        from django_weft.runtime.heartbeats import recorded_details

        return recorded_details(self.run_id, self.seq)

    @cached_property
    def task_token(self) -> str:
        """The signed token that completes this attempt once it called ``weft.complete_async()``.

        Deterministic for (run, step, attempt), so an attempt re-run after a crash hands out the same
        token; it is single-use and names nothing else.
        """
        self.token_handed_out = True
        return make_task_token(self.run_id, self.seq, self.attempt, self.generation)


# Set by the executor around each activity attempt.
current_activity: contextvars.ContextVar[ActivityInfo | None] = contextvars.ContextVar(
    "weft_activity", default=None
)


def heartbeat(details: Any = None) -> None:
    """Report that the running activity attempt is alive, optionally with progress ``details``.

    Keeps the run's lease (a beating activity is never taken over), stores ``details`` for the step's
    next attempt (``activity_info().heartbeat_details``), and raises :class:`ActivityCancelled` when the
    attempt should stop: its run was cancelled, terminated, timed out or taken away, the attempt passed
    its timeout, or its branch lost a ``ctx.race``. Call it often in long activities.
    """
    info = current_activity.get()
    if info is None:
        raise WeftError("weft.heartbeat() is only available inside an activity run by ctx.run or ctx.start_activity")
    if info.control is not None:
        info.control.beat(details)


def activity_info() -> ActivityInfo:
    """The running activity attempt's identity and task token. Only valid inside an activity."""
    info = current_activity.get()
    if info is None:
        raise WeftError("weft.activity_info() is only available inside an activity run by ctx.run")
    return info


class CompleteAsync(BaseException):
    """Raised by complete_async(); a BaseException so the activity's own ``except Exception`` lets it by."""


def complete_async() -> NoReturn:
    """End the activity body without a result: the workflow waits until an outside system calls
    ``weft.complete_async_activity(token, result)`` or ``weft.fail_async_activity(token, error)``."""
    if current_activity.get() is None:
        raise WeftError("weft.complete_async() is only available inside an activity run by ctx.run")
    raise CompleteAsync()


# --- completing async activities -------------------------------------------------------------------


def complete_async_activity(token: str, result: Any = None) -> None:
    """Complete a pending async activity attempt with ``result``; the workflow continues with it.

    Raises InvalidTaskToken for a forged or unknown token, TaskTokenAlreadyUsed if the attempt was
    already resolved (or its run finished), PayloadTooLarge / PayloadNotSerializable for a bad result,
    in which case the token is not used up.
    """
    from django_weft.common import clock
    from django_weft.common.codec import encode
    from django_weft.models import AsyncStatus
    from django_weft.store import activity_answers

    parts = parse_task_token(token)
    data = encode(result, what="async activity result")
    activity_answers.resolve_async(parts, clock.now(), status=AsyncStatus.COMPLETED, result=data)


MAX_ERROR_TEXT = 4000


def fail_async_activity(token: str, error: BaseException | str | dict) -> None:
    """Fail a pending async activity attempt; the activity's retry policy decides what happens next.

    ``error`` is an exception, a message, or ``{"message": ..., "type": ...}``.
    """
    from django_weft.common import clock
    from django_weft.models import AsyncStatus
    from django_weft.runtime.errors import error_dict
    from django_weft.store import activity_answers

    parts = parse_task_token(token)
    if isinstance(error, BaseException):
        details = error_dict(error)
    elif isinstance(error, str) and error:
        details = {"type": "AsyncActivityFailed", "message": error}
    elif isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        unknown = sorted(set(error) - {"message", "type"}, key=str)
        if unknown:  # a misspelt "type" would be dropped silently
            raise InvalidArgument(f'the error holds {unknown[0]!r}: only "message" and "type" are read')
        kind = error.get("type") or "AsyncActivityFailed"
        if not isinstance(kind, str):
            raise InvalidArgument('the error\'s "type" must be a string')
        details = {"type": kind, "message": error["message"]}
    else:
        raise InvalidArgument('error must be an exception, a non-empty message, or {"message": ..., "type": ...}')
    for part in ("type", "message"):
        if len(details[part]) > MAX_ERROR_TEXT:
            raise InvalidArgument(f"the error's {part} is longer than {MAX_ERROR_TEXT} characters")
        check_text(details[part], f"the error's {part}")
    details["attempt"] = parts.attempt
    activity_answers.resolve_async(parts, clock.now(), status=AsyncStatus.FAILED, error=details)
