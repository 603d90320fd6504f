"""Group commit: the step commits of several runs that are ready at the same moment, in one statement.

On PostgreSQL a step commit outside a transaction is one statement (:func:`django_weft.store.journal.
write_in_one_statement`): the fenced UPDATE of the run and the INSERT of its new steps, committed implicitly.
Each such statement costs a round trip and a WAL flush. When several threads of a process commit steps at the
same time (the executor threads of ``weft_maintenance``, callers of ``weft.run()``), the first one *leads*: it
sends its commit at once, and the commits that arrive while that statement is in flight wait for it and then
go together, as one statement, sent by the first of them. Alone, a commit goes at once: grouping adds no wait.

It is off unless ``WEFT_GROUP_COMMIT = True``. It sends fewer commits (a three-step run's drive took 1.3 where
it took 3.1 with four executor threads), but only one statement is in flight per process while the others wait
for it, and PostgreSQL already shares WAL flushes among concurrent commits: on the project's 2-core machine,
where the database's CPU rather than its commits was the limit, four threads drove 350-390 runs/s grouped
against 550-600 ungrouped. Try it where commits are the cost (few connections, a slow WAL disk).

What each commit keeps, grouped or not:

* its own fence: each UPDATE of a group names its run, fence and status, and a commit whose fence moved gets
  no rows and is told so while the others commit. Outcomes are matched to commits by position, so two commits
  of one run (a stale execution beside the one that took the run over) each get their own;
* no waiting on others' locks: a group (a lone commit too, when grouping is on) locks its runs' rows with
  ``FOR NO KEY UPDATE SKIP LOCKED`` (the lock an UPDATE takes), and a commit whose row another transaction
  holds (an operator's cancel, a parent closing its children) is sent again alone, on its own thread, once the
  group is done; so a group never waits for a lock, cannot deadlock, and one busy run holds up no other;
* its own error: a group the database refused (it rolled the statement back: a value one step cannot store)
  is sent again commit by commit, so each gets its own outcome. When the reply was lost (the connection
  broke: the statement may or may not have committed) every commit of the group gets a transient error, as a
  lone commit would, and its run is left to its lease.

Grouped commits are sent on the leading thread's connection: its session state is theirs. Commits of
connections that differ in session state (``connection.schema_name``, as django-tenants sets it) are never
grouped together; for other per-connection state, set ``WEFT_GROUP_COMMIT = False``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.db import DatabaseError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from django_weft.conf import weft_settings
from django_weft.store.bound_cursor import bound_cursor

# The most commits, and about the most parameters, one group statement carries (PostgreSQL takes 65,535).
MAX_GROUP = 32
MAX_PARAMETERS = 20_000

QUEUED, LEADS, DONE, ALONE, FAILED = "queued", "leads", "done", "alone", "failed"


@dataclass(eq=False)
class StepCommit:
    """One run's fenced commit: the UPDATE of ``assignments`` where run, fence and status still match, and the
    new journal rows (``rows``: the values of the step columns, database-ready)."""

    run_id: Any  # database-ready
    fence: int
    status: str
    assignments: tuple[str, ...]  # run columns set, in the order of ``values``
    values: list[Any]
    rows: list[list[Any]]
    # Once sent: whether the fence held, and the ids of the new rows by seq.
    held: bool | None = None
    ids: dict[int, int] = field(default_factory=dict)
    state: str = QUEUED
    error: BaseException | None = None
    woken: threading.Event | None = None  # made only when it has to wait

    def statement_values(self) -> list[Any]:
        """Its parameters in statement order: the run columns set, run id, fence, status, then the rows."""
        return [*self.values, self.run_id, self.fence, self.status, *(value for row in self.rows for value in row)]

    @property
    def parameters(self) -> int:
        return len(self.values) + 3 + sum(len(row) for row in self.rows)


@dataclass(frozen=True)
class Tables:
    run: str
    step: str
    step_columns: tuple[str, ...]
    step_types: tuple[str, ...]


class _Queue:
    """The commits waiting for the statement in flight on one database (and session)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: list[StepCommit] = []
        self.busy = False


_queues: dict[tuple[str, Any], _Queue] = {}
_queues_lock = threading.Lock()


def _forget_queues() -> None:
    global _queues_lock
    _queues.clear()  # a forked child has none of its parent's threads, in flight or waiting
    _queues_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_queues)


def _queue(connection: BaseDatabaseWrapper) -> _Queue:
    key = (connection.alias, getattr(connection, "schema_name", None))
    queue = _queues.get(key)
    if queue is None:
        with _queues_lock:
            queue = _queues.setdefault(key, _Queue())
    return queue


def commit(connection: BaseDatabaseWrapper, mine: StepCommit, tables: Tables) -> None:
    """Send ``mine``, alone or with the commits waiting beside it; sets ``mine.held`` and ``mine.ids``, or
    raises the database's error for it."""
    if not weft_settings.GROUP_COMMIT:
        _send_alone(connection, mine, tables)
        return
    queue = _queue(connection)
    with queue.lock:
        if not queue.busy:
            queue.busy, mine.state = True, LEADS
        else:
            mine.woken = threading.Event()
            queue.waiting.append(mine)
    if mine.state != LEADS:
        _wait(queue, mine)
        if mine.state == DONE:
            return
        if mine.state == FAILED:
            assert mine.error is not None
            raise mine.error
        if mine.state == ALONE:
            _send_alone(connection, mine, tables)
            return
    _lead(connection, queue, mine, tables)


def _wait(queue: _Queue, mine: StepCommit) -> None:
    assert mine.woken is not None
    try:
        mine.woken.wait()  # the statement in flight waits for no lock: it returns soon
    except BaseException:
        # Interrupted (Ctrl-C in a weft.run() caller): leave the queue as if this commit had never come.
        with queue.lock:
            if mine in queue.waiting:
                queue.waiting.remove(mine)
            elif mine.state == LEADS:
                _hand_on(queue)
        raise


def _hand_on(queue: _Queue) -> None:
    """Under ``queue.lock``: the first waiting commit leads the next group, or the queue is idle."""
    if queue.waiting:
        following = queue.waiting.pop(0)
        following.state = LEADS
        assert following.woken is not None
        following.woken.set()
    else:
        queue.busy = False


def _lead(connection: BaseDatabaseWrapper, queue: _Queue, mine: StepCommit, tables: Tables) -> None:
    group = [mine]
    sending = False
    outcome, error, locked = ALONE, None, []  # what the followers learn if this thread is interrupted at once
    try:
        with queue.lock:
            budget = MAX_PARAMETERS - mine.parameters
            while queue.waiting and len(group) < MAX_GROUP and queue.waiting[0].parameters <= budget:
                budget -= queue.waiting[0].parameters
                group.append(queue.waiting.pop(0))
        sending = True
        locked = _send_group(connection, group, tables)
        outcome, error = DONE, None
    except BaseException as exc:
        locked, error = [], exc
        # Rolled back by the server (it names why) or never sent: each is sent again alone. Sent and then lost:
        # it may have committed, so each run is left to its lease, as a lone commit's would be.
        outcome = ALONE if not sending or _rolled_back(exc) else FAILED
    finally:
        # Every follower learns its outcome and is woken, whatever interrupts this thread meanwhile.
        with queue.lock:
            for other in group[1:]:
                if outcome == FAILED:
                    other.error = OperationalError(f"a group commit's reply was lost: {error}")
                other.state = ALONE if outcome == DONE and other not in locked else outcome
            _hand_on(queue)
        _wake(group[1:])
    if error is not None:
        if outcome == FAILED or len(group) == 1 or not isinstance(error, DatabaseError):
            raise error
        _send_alone(connection, mine, tables)
    elif mine not in locked:
        _send_alone(connection, mine, tables)  # its row was busy: wait for it alone, holding up nobody


def _wake(commits: list[StepCommit]) -> None:
    try:
        for c in commits:
            c.woken.set()  # type: ignore[union-attr]  # a waiting commit has its event
    finally:  # again, if interrupted half-way (setting an event twice is harmless)
        for c in commits:
            c.woken.set()  # type: ignore[union-attr]


def _rolled_back(exc: BaseException) -> bool:
    """Whether the database answered ``exc`` (a SQLSTATE: the statement was rolled back), rather than the
    connection failing with the outcome unknown."""
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else None
    return getattr(cause, "sqlstate", None) is not None


def _send_alone(connection: BaseDatabaseWrapper, mine: StepCommit, tables: Tables) -> None:
    """One commit in its own statement, waiting for its row's lock as needed."""
    sql = _alone_statement(mine.assignments, len(mine.rows), tables)
    with bound_cursor(connection, statement=sql) as cursor:
        cursor.execute(sql, mine.statement_values())
        returned = cursor.fetchall()
    _read(mine, returned)


def _read(mine: StepCommit, returned: list[tuple]) -> None:
    mine.held = False
    for kind, seq, pk in returned:
        if kind == "u":
            mine.held = True
        else:
            mine.ids[seq] = pk
    mine.state = DONE


def _send_group(connection: BaseDatabaseWrapper, group: list[StepCommit], tables: Tables) -> list[StepCommit]:
    """Send ``group`` as one statement; returns the commits whose rows it could lock (each of them DONE)."""
    params: list[Any] = [c.run_id for c in group]
    for c in group:
        params += c.statement_values()
    sql = _group_statement(tuple((c.assignments, len(c.rows)) for c in group), tables)
    with bound_cursor(connection, prepare=False) as cursor:  # of many shapes, each planned once per group
        cursor.execute(sql, params)
        returned = cursor.fetchall()
    locked_runs = {str(run_id) for position, kind, _, _, run_id in returned if kind == "l"}
    by_position: dict[int, list[tuple]] = {}
    for position, kind, seq, pk, _ in returned:
        if kind != "l":
            by_position.setdefault(position, []).append((kind, seq, pk))
    locked = [c for c in group if str(c.run_id) in locked_runs]
    for position, c in enumerate(group):
        if c in locked:
            _read(c, by_position.get(position, []))
    return locked


@lru_cache(maxsize=64)
def _alone_statement(assigned: tuple[str, ...], rows: int, tables: Tables) -> str:
    sets = ", ".join(f'"{column}" = %s' for column in assigned)
    sql = (f'WITH u AS (UPDATE "{tables.run}" SET {sets} WHERE "run_id" = %s AND "fence" = %s AND "status" = %s '
           'RETURNING "run_id")')
    if rows:
        sql += f", i AS ({_insert('u', rows, tables)})"
    return sql + " SELECT 'u', NULL::integer, NULL::bigint FROM u" + (
        " UNION ALL SELECT 'i', seq, id FROM i" if rows else "")


def _insert(updated: str, rows: int, tables: Tables) -> str:
    names = ", ".join(f'"{c}"' for c in tables.step_columns)
    row = "(" + ", ".join(f"%s::{t}" for t in tables.step_types) + ")"
    return (f'INSERT INTO "{tables.step}" ("run_id", {names}) SELECT {updated}.run_id, v.* FROM {updated}, '
            f"(VALUES {', '.join([row] * rows)}) AS v({names}) RETURNING \"seq\", \"id\"")


@lru_cache(maxsize=512)
def _group_statement(shape: tuple[tuple[tuple[str, ...], int], ...], tables: Tables) -> str:
    """The statement for a group of this shape (per commit: the run columns it sets, how many rows it adds).
    Rows returned: ``(NULL, 'l', NULL, NULL, run_id)`` for each run whose row it locked, and per commit
    (by position) ``'u'`` if its fence held and ``'i', seq, id`` for each row it added."""
    ids = ", ".join(["%s"] * len(shape))
    ctes = [f'locked AS (SELECT "run_id" FROM "{tables.run}" WHERE "run_id" IN ({ids}) '
            'FOR NO KEY UPDATE SKIP LOCKED)']
    selects = ["SELECT NULL::integer, 'l', NULL::integer, NULL::bigint, run_id FROM locked"]
    for i, (assigned, rows) in enumerate(shape):
        sets = ", ".join(f'"{column}" = %s' for column in assigned)
        ctes.append(f'u{i} AS (UPDATE "{tables.run}" SET {sets} WHERE "run_id" = %s AND "fence" = %s '
                    'AND "status" = %s AND "run_id" IN (SELECT "run_id" FROM locked) RETURNING "run_id")')
        selects.append(f"SELECT {i}, 'u', NULL::integer, NULL::bigint, run_id FROM u{i}")
        if rows:
            ctes.append(f"i{i} AS ({_insert(f'u{i}', rows, tables)})")
            selects.append(f"SELECT {i}, 'i', seq, id, NULL::uuid FROM i{i}")
    return f"WITH {', '.join(ctes)} {' UNION ALL '.join(selects)}"
