"""A signal to a workflow's open run as one statement on PostgreSQL (state writer; ``weft.signal()`` uses it).

With the ORM, delivering a signal is BEGIN, SELECT ... FOR UPDATE of the open run, UPDATE of its inbox count
(and wake-up), INSERT of the signal, COMMIT: five round trips and three compiled queries, which made a signal
about half of an idle loop's signal-to-resume time. Here the same fenced transition is one prepared statement
whose implicit commit makes it as atomic as the transaction was: it locks the open run by its unique
``open_workflow_id`` (a run that closes meanwhile no longer matches once its lock is granted), numbers the
signal in the run's inbox, wakes the run if it waits for that name, and stores the signal.

Its timestamp is taken before it may wait for the run's lock (the ORM's way takes it once it holds the lock),
so the run's ``updated_at`` keeps the later of its value and this one: it never moves back over a transition
that committed meanwhile.

It applies outside a transaction of the caller's (autocommit on), without a ``signal_id`` (whose duplicate
check must see what committed while the statement waited for the lock), and while nothing listens to
``signal_received`` (whose receivers get the stored record) or to the Signal model's ``pre_save`` and
``post_save``. Everywhere else, and when the statement finds no open run (the workflow is unknown, finished,
or continued as new while it waited: the ORM's way follows the chain and names the problem),
:func:`django_weft.services.client.signal` takes the ORM's way.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from django.db import connections, router
from django.db.models.signals import post_save, pre_save

from django_weft import signals
from django_weft.models import RunStatus, Signal, Workflow
from django_weft.observability import events
from django_weft.store import wakeups
from django_weft.store.bound_cursor import bound_cursor, converter


@cache
def _sql() -> str:
    runs, inbox = Workflow._meta.db_table, Signal._meta.db_table
    return f'''
        WITH target AS (
            SELECT "run_id", ("status" = %(waiting)s AND "awaiting_signals" ? %(name)s) AS "wakes"
            FROM "{runs}" WHERE "open_workflow_id" = %(workflow_id)s FOR UPDATE
        ), counted AS (
            UPDATE "{runs}" AS w SET "inbox_seq" = w."inbox_seq" + 1,
                "updated_at" = GREATEST(w."updated_at", %(now)s),
                "runnable_at" = CASE WHEN t."wakes" THEN %(now)s ELSE w."runnable_at" END,
                "awaiting_signals" = CASE WHEN t."wakes" THEN '[]'::jsonb ELSE w."awaiting_signals" END
            FROM target AS t WHERE w."run_id" = t."run_id"
            RETURNING w."run_id", w."inbox_seq", t."wakes"
        ), stored AS (
            INSERT INTO "{inbox}" ("run_id", "name", "payload", "sequence", "received_at", "trace_context")
            SELECT c."run_id", %(name)s::text, %(payload)s::bytea, c."inbox_seq", %(now)s, %(trace)s::jsonb
            FROM counted AS c RETURNING "run_id"
        )
        SELECT c."run_id", c."wakes" FROM counted AS c JOIN stored AS s ON s."run_id" = c."run_id"
    '''


def applies(alias: str) -> bool:
    """PostgreSQL, autocommit on and no atomic block (the statement commits on its own, and its wake-up NOTIFY
    is sent at once), and no receivers of the signal the ORM's way sends (``signal_received`` and the
    Signal model's ``pre_save``/``post_save``)."""
    connection = connections[alias]
    return (connection.vendor == "postgresql" and connection.get_autocommit() and not connection.in_atomic_block
            and not signals.signal_received.has_listeners()
            and not pre_save.has_listeners(Signal) and not post_save.has_listeners(Signal))


def deliver_in_one_statement(workflow_id: str, name: str, payload: bytes, now: datetime) -> bool:
    """Store signal ``name`` for the open run of ``workflow_id`` and commit; False if this does not apply here
    or found no open run (then nothing was written)."""
    alias = router.db_for_write(Workflow)
    if not applies(alias):
        return False
    connection = connections[alias]
    sql = _sql()
    params = {
        "waiting": RunStatus.WAITING,
        "name": name,
        "workflow_id": workflow_id,
        "now": now,
        "payload": payload,
        "trace": converter(Signal._meta.get_field("trace_context"))(events.trace_context(), connection),
    }
    with bound_cursor(connection, statement=sql) as cursor:
        cursor.execute(sql, params)
        row: Any = cursor.fetchone()
    if row is None:
        return False
    run_id, wakes = row
    if wakes:
        wakeups.runnable(run_id, now, now)  # it has committed (autocommit), so this notifies at once
    return True
