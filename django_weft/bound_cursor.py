"""A cursor for the engine's hot statements: parameters bound on the server, the statement prepared (data layer).

Django's PostgreSQL backend binds parameters on the client by default (psycopg's ``ClientCursor``): psycopg
quotes every value into the SQL text in Python and the server parses and plans the whole text again, every
time. For the few statements every run sends (the run's insert, the fenced step commit, the claim) that costs
more than executing them: on the project's machine a three-step ``weft.run()`` went from about 225 to about
330 runs/s with these statements bound on the server and prepared. This cursor does both, through Django's
cursor wrapper, so execute wrappers, query logging and error translation still see each statement.

Prepared statements and connection poolers: Django leaves preparing off (``OPTIONS["prepare_threshold"]``)
because a pooler in transaction mode may send a statement to another server connection than the one that
prepared it. These cursors prepare only the engine's own statements (``WEFT_PREPARED_STATEMENTS``, default
True; the connection's threshold for everything else is left as the project set it), and a connection on
which the server answers that a prepared statement is missing or already exists (such a pooler) stops
preparing and sends the statement again unprepared: it had not run.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from .conf import weft_settings

logger = logging.getLogger("django_weft.bound_cursor")

# SQLSTATEs of a prepared statement the server does not have, or already has under that name.
POOLER_REFUSALS = ("26000", "42P05")
# A psycopg connection's threshold while only these cursors prepare: never reached by the project's statements.
NEVER = sys.maxsize


def bound_cursor(connection: BaseDatabaseWrapper, *, prepare: bool = True) -> Any:
    """A cursor on ``connection`` that binds parameters on the server and (with ``prepare``) prepares its
    statements (PostgreSQL with psycopg 3), else the connection's own cursor. Use it as ``with
    bound_cursor(connection) as cursor:``. Prepare statements of a few shapes only: psycopg keeps 100 per
    connection."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):  # psycopg2: it binds on the client whatever the cursor
        return connection.cursor()
    # Not while queries are logged (DEBUG, CaptureQueriesContext): Django cannot show a prepared statement's SQL.
    prepare = (prepare and bool(weft_settings.PREPARED_STATEMENTS) and not connection.queries_logged
               and not getattr(raw, "_weft_unprepared", False))
    if prepare and raw.prepare_threshold is None:
        raw.prepare_threshold = NEVER  # psycopg prepares nothing while it is None, not even on request
    with connection.wrap_database_errors:
        cursor: Any = _preparing_cursor()(raw) if prepare else psycopg.Cursor(raw)
    # The stubs type these as taking Django's wrapper; they take any DB-API cursor.
    return connection.make_debug_cursor(cursor) if connection.queries_logged else connection.make_cursor(cursor)


_class: Any = None


def _preparing_cursor() -> Any:
    global _class
    if _class is None:
        import psycopg

        class PreparingCursor(psycopg.Cursor):
            """Prepares each statement it sends, unless its connection refused prepared statements."""

            def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                        binary: bool | None = None) -> Any:
                try:
                    return super().execute(query, params, prepare=True if prepare is None else prepare,
                                           binary=binary)
                except psycopg.Error as exc:
                    if exc.sqlstate not in POOLER_REFUSALS:
                        raise
                    logger.warning("prepared statements fail on this connection (%s: %s); the engine sends its "
                                   "statements unprepared on it: a connection pooler in transaction mode? Set "
                                   "WEFT_PREPARED_STATEMENTS = False to stop trying", exc.sqlstate, exc)
                    # psycopg then forgets its prepared statements too (it would send the others' names).
                    self.connection._weft_unprepared = True  # type: ignore[attr-defined]
                    self.connection.prepare_threshold = None
                    return super().execute(query, params, prepare=False, binary=binary)

        _class = PreparingCursor
    return _class
