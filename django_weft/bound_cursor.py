"""A cursor for the engine's hot statements that sends their parameters apart from the SQL (data layer).

Django's PostgreSQL backend binds parameters on the client by default (psycopg's ``ClientCursor``): psycopg
quotes every value into the SQL text in Python and the server parses the literals again. For the few
statements every step sends (the fenced step commit, the insert of a run) that costs more than the statement
itself: a step commit took 0.68 ms client-bound against 0.43 ms server-bound on the project's machine. This
cursor binds on the server, through Django's cursor wrapper, so execute wrappers, query logging and error
translation still see the statement. Prepared statements stay as the project configured them (Django turns
them off unless ``OPTIONS["prepare_threshold"]`` is set, for connection poolers).
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def bound_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor on ``connection`` that binds parameters on the server (PostgreSQL with psycopg 3), else the
    connection's own cursor. Use it as ``with bound_cursor(connection) as cursor:``."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):  # psycopg2: it binds on the client whatever the cursor
        return connection.cursor()
    with connection.wrap_database_errors:
        cursor: Any = psycopg.Cursor(raw)  # the stubs take only Django's wrapper; the methods take any DB-API cursor
    return connection.make_debug_cursor(cursor) if connection.queries_logged else connection.make_cursor(cursor)
