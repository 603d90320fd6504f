"""Group commit: the step commits of several runs that are ready at the same moment, in one statement.

On PostgreSQL a step commit outside a transaction is one statement (:func:`django_weft.journal.
write_in_one_statement`): the fenced UPDATE of the run and the INSERT of its new steps, committed implicitly.
Each such statement costs a round trip and a WAL flush. When several threads of a process commit steps at the
same time (the executor threads of ``weft_maintenance``, callers of ``weft.run()``), the first one *leads*:
it sends its own commit at once, and the commits that arrive while that statement is in flight wait for it
and then go together, as one statement, sent by the first of them. Every run keeps its own fence: each UPDATE
of the group names its run, fence and status, and a run whose fence moved gets no steps and is told so,
while the others commit. Alone, a commit goes at once, as before: grouping adds no wait to a lone run.

A group that the database refuses (a value one run's step cannot store, a deadlock, a lost connection) is not
failed as a whole: each of its commits is sent again alone, on its own thread's connection, so each gets its
own outcome and error, as without grouping. ``WEFT_GROUP_COMMIT = False`` turns grouping off.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from .bound_cursor import bound_cursor
from .conf import weft_settings

# The most commits one statement carries (its parameters stay well under PostgreSQL's 65,535).
MAX_GROUP = 32


@dataclass(eq=False)
class StepCommit:
    """One run's fenced commit: the UPDATE of ``fields`` where run, fence and status still match, and the new
    journal rows (``rows``: the values of ``columns``, database-ready)."""

    run_id: Any  # database-ready
    fence: int
    status: str
    assignments: tuple[str, ...]  # run columns set, in the order of ``values``
    values: list[Any]
    rows: list[list[Any]]
    # Set once the commit was sent: whether the fence held, and the ids of the new rows by seq.
    held: bool | None = None
    ids: dict[int, int] = field(default_factory=dict)
    alone: bool = False  # the group failed: send it again on its own
    _woken: threading.Event | None = None  # made only when it has to wait
    _leads: bool = False


class _Queue:
    """The commits waiting for the statement in flight on one database."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: list[StepCommit] = []
        self.busy = False


_queues: dict[str, _Queue] = {}
_queues_lock = threading.Lock()


def _queue(alias: str) -> _Queue:
    queue = _queues.get(alias)
    if queue is None:
        with _queues_lock:
            queue = _queues.setdefault(alias, _Queue())
    return queue


def commit(connection: BaseDatabaseWrapper, mine: StepCommit, columns: tuple[str, ...], types: tuple[str, ...],
           run_table: str, step_table: str) -> None:
    """Send ``mine`` (alone or with the commits waiting beside it); sets ``mine.held`` and ``mine.ids``, or
    raises the database's error for it."""
    if not weft_settings.GROUP_COMMIT:
        _send(connection, [mine], columns, types, run_table, step_table)
        return
    queue = _queue(connection.alias)
    with queue.lock:
        if queue.busy:
            mine._woken = threading.Event()
            queue.waiting.append(mine)
        else:
            queue.busy = mine._leads = True
    if mine._woken is not None:
        mine._woken.wait()
        if not mine._leads:  # sent with the group, or to be sent alone
            if mine.alone:
                _send(connection, [mine], columns, types, run_table, step_table)
            return
    _lead(connection, queue, mine, columns, types, run_table, step_table)


def _lead(connection: BaseDatabaseWrapper, queue: _Queue, mine: StepCommit, columns: tuple[str, ...],
          types: tuple[str, ...], run_table: str, step_table: str) -> None:
    with queue.lock:
        others, queue.waiting = queue.waiting[:MAX_GROUP - 1], queue.waiting[MAX_GROUP - 1:]
    group = [mine, *others]
    failure: DatabaseError | None = None
    sent = False
    try:
        _send(connection, group, columns, types, run_table, step_table)
        sent = True
    except DatabaseError as exc:
        failure = exc
    finally:
        for other in others:
            other.alone = not sent
            other._woken.set()  # type: ignore[union-attr]  # a waiting commit has its event
        with queue.lock:  # the next waiting commit leads the next group
            if queue.waiting:
                following = queue.waiting.pop(0)
                following._leads = True
                following._woken.set()  # type: ignore[union-attr]
            else:
                queue.busy = False
    if failure is not None:
        if not others:
            raise failure
        _send(connection, [mine], columns, types, run_table, step_table)


def _send(connection: BaseDatabaseWrapper, group: list[StepCommit], columns: tuple[str, ...],
          types: tuple[str, ...], run_table: str, step_table: str) -> None:
    # Rows locked in one order by every group, so two groups never deadlock on each other.
    group = sorted(group, key=lambda c: str(c.run_id)) if len(group) > 1 else group
    shape = tuple((c.assignments, len(c.rows)) for c in group)
    sql = _statement(shape, columns, types, run_table, step_table)
    params: list[Any] = []
    for c in group:
        params += [*c.values, c.run_id, c.fence, c.status]
        for row in c.rows:
            params += row
    with bound_cursor(connection) as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchall()
    by_run = {str(c.run_id): c for c in group}
    for c in group:
        c.held = False
    for run_id, seq, pk in returned:
        c = by_run[str(run_id)]
        if seq is None:
            c.held = True
        else:
            c.ids[seq] = pk


@lru_cache(maxsize=512)
def _statement(shape: tuple[tuple[tuple[str, ...], int], ...], columns: tuple[str, ...], types: tuple[str, ...],
               run_table: str, step_table: str) -> str:
    """The statement for a group of this shape (per commit: the run columns it sets, how many rows it adds):
    ``(run_id, NULL, NULL)`` for each run whose fence held, ``(run_id, seq, id)`` for each row added."""
    names = ", ".join(f'"{c}"' for c in columns)
    row = "(" + ", ".join(f"%s::{t}" for t in types) + ")"
    ctes, selects = [], []
    for i, (assigned, rows) in enumerate(shape):
        sets = ", ".join(f'"{column}" = %s' for column in assigned)
        ctes.append(f'u{i} AS (UPDATE "{run_table}" SET {sets} WHERE "run_id" = %s AND "fence" = %s '
                    'AND "status" = %s RETURNING "run_id")')
        selects.append(f"SELECT run_id, NULL::integer, NULL::bigint FROM u{i}")
        if rows:
            ctes.append(f'i{i} AS (INSERT INTO "{step_table}" ("run_id", {names}) SELECT u{i}.run_id, v.* '
                        f"FROM u{i}, (VALUES {', '.join([row] * rows)}) AS v({names}) "
                        'RETURNING "run_id", "seq", "id")')
            selects.append(f"SELECT run_id, seq, id FROM i{i}")
    return f"WITH {', '.join(ctes)} {' UNION ALL '.join(selects)}"
