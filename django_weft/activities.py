"""Activities: the plain functions that hold a workflow's side effects, and their retry policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, overload

from .durations import to_seconds
from .exceptions import InvalidArgument

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast a failing activity is tried again.

    ``max_attempts`` counts every attempt, the first included. The wait before attempt n+1 is
    ``min(initial_backoff * backoff_multiplier ** (n - 1), max_backoff)`` seconds, spent as a durable
    timer: the run parks, no thread sleeps. Exceptions of a ``non_retryable`` type fail at once.
    """

    max_attempts: int = 3
    initial_backoff: float = 1.0
    backoff_multiplier: float = 2.0
    max_backoff: float = 30.0
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InvalidArgument(f"RetryPolicy.max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise InvalidArgument("RetryPolicy backoffs must not be negative")
        if self.backoff_multiplier < 1:
            raise InvalidArgument(
                f"RetryPolicy.backoff_multiplier must be >= 1, got {self.backoff_multiplier!r}"
            )
        if not isinstance(self.non_retryable, tuple):
            object.__setattr__(self, "non_retryable", tuple(self.non_retryable))

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.initial_backoff * self.backoff_multiplier ** (attempt - 1), self.max_backoff)

    def should_retry(self, attempt: int, error: BaseException) -> bool:
        return attempt < self.max_attempts and not isinstance(error, self.non_retryable)


DEFAULT_RETRY_POLICY = RetryPolicy()


@dataclass(frozen=True)
class ActivityDefinition:
    name: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    timeout: float | None


@overload
def activity(fn: F, /) -> F: ...
@overload
def activity(
    *, name: str | None = None, retry: RetryPolicy | None = None, timeout: float | timedelta | None = None
) -> Callable[[F], F]: ...


def activity(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | timedelta | None = None,
) -> Any:
    """Mark a function as an activity: ``@weft.activity`` or ``@weft.activity(retry=..., timeout=30)``.

    The function stays callable as before; ``ctx.run(fn, ...)`` runs it as a journaled step. ``timeout``
    caps each attempt: the workflow stops waiting and fails the attempt (the function itself cannot be
    interrupted and runs on in the background).
    """
    timeout_seconds = None if timeout is None else to_seconds(timeout, "activity timeout", allow_zero=False)

    def register(func: F) -> F:
        func.__weft_activity__ = ActivityDefinition(  # type: ignore[attr-defined]
            name=name or f"{func.__module__}.{func.__qualname__}",
            fn=func,
            retry=retry or DEFAULT_RETRY_POLICY,
            timeout=timeout_seconds,
        )
        return func

    if fn is not None:
        return register(fn)
    return register


def definition_of(fn: Callable[..., Any]) -> ActivityDefinition:
    """The activity definition of ``fn``; plain functions get the default policy."""
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
