"""``@weft.transaction``: a step whose function runs inside the database transaction that records it (design 9.4).

Its ORM writes and the step's journal row commit together or not at all, so the step happens exactly once,
whatever crashes: a replay returns the recorded result, a crash before the commit leaves neither. That holds only
for writes on the database django_weft records its steps on, so writes the router sends elsewhere are refused
before they reach that database (:func:`writes_confined_to`), and models a function declares are checked against
the router before it runs (:func:`routing_refusal`).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, overload

from django.db import connections, router

from django_weft.common.storable import unstorable_reason
from django_weft.exceptions import InvalidArgument, TransactionRoutingError
from django_weft.runtime.activities import ActivityDefinition, RetryPolicy, register_definition

F = TypeVar("F", bound=Callable[..., Any])

# A business error fails the step at once by default: the workflow decides (catch ActivityError to compensate).
# Database errors that trying again can fix (a deadlock, a serialisation failure) are retried in a new
# transaction whatever the policy says.
NO_RETRY = RetryPolicy(max_attempts=1)

# Statements that change a database (anything else, a SELECT, may read another database freely).
_WRITE = re.compile(r"\s*(?:/\*.*?\*/\s*)*(insert|update|delete|replace|merge|upsert|create|alter|drop|truncate)\b",
                    re.IGNORECASE | re.DOTALL)


@overload
def transaction(fn: F, /) -> F: ...
@overload
def transaction(*, name: str | None = None, retry: RetryPolicy | None = None,
                models: Iterable[type] = ()) -> Callable[[F], F]: ...


def transaction(fn: Any = None, /, *, name: str | None = None, retry: RetryPolicy | None = None,
                models: Iterable[type] = ()) -> Any:
    """Mark a function as a database step: ``ctx.run(fn, ...)`` runs it inside the transaction that records the
    step, on django_weft's database, so its ORM writes and the step commit together: exactly once.

    The function gets its arguments (not ``ctx``); it may read and write the project's models but may not call
    ``ctx`` operations, activities or sleep: keep it short, it holds the run's row lock while it runs. An error
    it raises fails the step (ActivityError in the workflow), unless ``retry`` allows another attempt; a
    deadlock or serialisation failure runs it again in a new transaction. ``models``: the models it writes,
    checked against the database router before it runs (writes the router sends elsewhere are refused anyway,
    when they are made, and nothing the function did is kept).
    """
    declared = tuple(models)
    for model in declared:
        if not (isinstance(model, type) and hasattr(model, "_meta")):
            raise InvalidArgument(f"@weft.transaction models= takes model classes, got {model!r}")
    if name is not None and (not isinstance(name, str) or not name or len(name) > 255 or unstorable_reason(name)):
        raise InvalidArgument(f"transaction name {name!r} must be a non-empty string of at most 255 characters "
                              "without NUL or lone surrogates")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise InvalidArgument(f"@weft.transaction retry= takes a weft.RetryPolicy, got {retry!r}")

    def register(func: F) -> F:
        if inspect.iscoroutinefunction(func):
            raise InvalidArgument(f"@weft.transaction needs a plain function, got the coroutine function "
                                  f"{func.__qualname__}: Django's ORM runs transactions synchronously")
        definition = ActivityDefinition(
            name=name or f"{func.__module__}.{func.__qualname__}", fn=func, retry=retry or NO_RETRY, timeout=None,
            transactional=True, models=declared,
        )
        return register_definition(func, definition)

    if fn is not None:
        return register(fn)
    return register


def step_alias() -> str:
    """The database django_weft records steps on (where a transaction step's writes must go)."""
    from django_weft.models import WorkflowStep

    return router.db_for_write(WorkflowStep)


def routing_refusal(definition: ActivityDefinition, alias: str) -> TransactionRoutingError | None:
    """Why the step cannot run here, before it runs: a model it declared is routed to another database."""
    for model in definition.models:
        target = router.db_for_write(model)
        if target != alias:
            return TransactionRoutingError(
                f"@weft.transaction {definition.name!r} writes {model._meta.label}, which the database router sends "  # type: ignore[attr-defined]
                f"to {target!r}, but django_weft records its steps on {alias!r}: the writes could not commit with "
                "the step. Route the model to that database, or make the step an activity (at least once)")
    return None


@contextlib.contextmanager
def writes_confined_to(alias: str, name: str) -> Iterator[None]:
    """While the function runs, a write on any other database connection is refused before it is sent."""
    with contextlib.ExitStack() as stack:
        for other in connections:
            if other != alias:
                stack.enter_context(connections[other].execute_wrapper(_Refuser(alias, other, name)))
        yield


class _Refuser:
    def __init__(self, alias: str, other: str, name: str) -> None:
        self.alias, self.other, self.name = alias, other, name

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if _WRITE.match(sql):
            raise TransactionRoutingError(
                f"@weft.transaction {self.name!r} wrote to database {self.other!r}, but django_weft records its steps "
                f"on {self.alias!r}: that write could not commit with the step, so it was refused and nothing the "
                "function did was kept. Route its models to the same database, or make the step an activity")
        return execute(sql, params, many, context)
