"""Retrying a transition that the database aborted over a lock conflict (state writer).

InnoDB (MySQL, MariaDB) resolves a deadlock by rolling back one of the transactions in it (error 1213), and
gives up on a lock it waited ``innodb_lock_wait_timeout`` for (1205); PostgreSQL reports a deadlock as
SQLSTATE 40P01. Either way nothing the transaction wrote remains, so a transition that decides everything
from what it reads under its locks (a claim, a fenced step commit, a park, a signal delivery) can simply be
run again: a fence that moved meanwhile refuses the second attempt as it would have refused the first.

Only the outermost transaction is retried. Inside a caller's ``transaction.atomic()`` the caller's earlier
writes are gone with the rollback (InnoDB rolls back the whole transaction, not the savepoint), so the error
goes up to the caller, who alone can redo its work.

Every retry is counted: :data:`RETRIES` in this process, ``weft_deadlock_retries_total`` when metrics are on,
and a log line.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from django.db import OperationalError, connections, router

from django_weft.models import Workflow
from django_weft.observability import events

logger = logging.getLogger("django_weft.lock_retries")

T = TypeVar("T")
P = ParamSpec("P")

MYSQL_DEADLOCK = 1213
MYSQL_LOCK_WAIT_TIMEOUT = 1205
POSTGRESQL_DEADLOCK = "40P01"
# Under REPEATABLE READ or SERIALIZABLE (a project's isolation level): the transaction saw a conflicting write.
POSTGRESQL_SERIALIZATION_FAILURE = "40001"
# Attempts in all (the first and the retries), and the ceiling of the random pause between them (seconds).
ATTEMPTS = 5
MAX_PAUSE = 0.05

# (transition, reason) -> retries in this process; reason is "deadlock" or "lock_wait_timeout".
RETRIES: Counter[tuple[str, str]] = Counter()
_lock = threading.Lock()


def lock_conflict(exc: BaseException) -> str | None:
    """``"deadlock"``, ``"lock_wait_timeout"`` or ``"serialization_failure"`` when ``exc`` is the database
    aborting over locks, else None."""
    if not isinstance(exc, OperationalError):
        return None
    for error in (exc, exc.__cause__):
        if error is None:
            continue
        code = error.args[0] if error.args else None
        if code == MYSQL_DEADLOCK:
            return "deadlock"
        if code == MYSQL_LOCK_WAIT_TIMEOUT:
            return "lock_wait_timeout"
        if getattr(error, "sqlstate", None) == POSTGRESQL_DEADLOCK:
            return "deadlock"
        if getattr(error, "sqlstate", None) == POSTGRESQL_SERIALIZATION_FAILURE:
            return "serialization_failure"
    return None


def retried(what: str, body: Callable[[], T], *, using: str | None = None,
            before_retry: Callable[[], None] | None = None) -> T:
    """``body()`` (which opens its own transaction), run again when the database aborts it over a lock
    conflict and no transaction of the caller's is open; ``before_retry`` restores what a failed attempt
    consumed in memory. ``what`` names the transition in the count."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return body()
        except OperationalError as exc:
            reason = lock_conflict(exc)
            # Asked only here, off the hot path: once body's own atomic block has unwound, the connection is
            # back in the caller's state, inside a transaction of theirs or not.
            if reason is None or attempt == ATTEMPTS or _in_callers_transaction(using):
                raise
            count(what, reason)
            logger.info("%s: %s (%s), attempt %d of %d; retrying", what, reason, exc, attempt, ATTEMPTS)
        time.sleep(random.uniform(0, MAX_PAUSE * attempt))
        if before_retry is not None:
            before_retry()
    raise AssertionError("unreachable")  # pragma: no cover


def _in_callers_transaction(using: str | None) -> bool:
    # With autocommit off the caller's transaction is open outside any atomic block (which made body's block
    # a savepoint in it): InnoDB rolled that whole transaction back too.
    connection = connections[using or router.db_for_write(Workflow)]
    return connection.in_atomic_block or not connection.get_autocommit()


def retrying(what: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A transition run again when the database aborts it over locks (:func:`retried`): it decides from
    what it reads under its locks, so a second attempt is as right as the first."""
    def wrap(transition: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(transition)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            return retried(what, lambda: transition(*args, **kwargs))
        return run
    return wrap


class Held(Protocol):
    """What :func:`retrying_held` needs of ``transitions.Claim``: the writes folded into its next commit."""

    deferred: list[Any]


H = TypeVar("H", bound=Held)


def retrying_held(what: str) -> Callable[[Callable[Concatenate[H, P], T]], Callable[Concatenate[H, P], T]]:
    """:func:`retrying` for an executor's write on the claim it takes first: an aborted attempt gives back
    the deferred writes it took from the claim, and the next attempt re-checks the fence."""
    def wrap(transition: Callable[Concatenate[H, P], T]) -> Callable[Concatenate[H, P], T]:
        @functools.wraps(transition)
        def run(held: H, *args: P.args, **kwargs: P.kwargs) -> T:
            deferred = list(held.deferred)

            def give_back() -> None:
                held.deferred = list(deferred)
            return retried(what, lambda: transition(held, *args, **kwargs), before_retry=give_back)
        return run
    return wrap


def count(what: str, reason: str) -> None:
    with _lock:
        RETRIES[(what, reason)] += 1
    events.lock_retry(what, reason)


def total() -> int:
    """Lock-conflict retries in this process so far."""
    with _lock:
        return sum(RETRIES.values())
