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
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from django_weft.conf import weft_settings

logger = logging.getLogger("django_weft.bound_cursor")

# SQLSTATEs of a prepared statement the server does not have, or already has under that name.
POOLER_REFUSALS = ("26000", "42P05")
# A psycopg connection's threshold while only these cursors prepare: never reached by the project's statements.
NEVER = sys.maxsize
# Cursors kept open on one connection, one per statement shape (see bound_cursor).
MAX_KEPT_CURSORS = 32


def bound_cursor(connection: BaseDatabaseWrapper, *, prepare: bool = True, statement: str | None = None) -> Any:
    """A cursor on ``connection`` that binds parameters on the server and (with ``prepare``) prepares its
    statements (PostgreSQL with psycopg 3), else the connection's own cursor. Use it as ``with
    bound_cursor(connection, statement=sql) as cursor: cursor.execute(sql, params)``. Prepare statements of a
    few shapes only: psycopg keeps 100 per connection.

    The cursor is kept open on the connection for the next time, one per ``statement`` (one for all without
    it): a psycopg cursor caches how it adapts parameters for the statement it last sent, and building that
    again took about a third of each statement's client time."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    import psycopg

    connection.ensure_connection()  # also Django's check that no event loop runs in this thread
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):  # psycopg2: it binds on the client whatever the cursor
        return connection.cursor()
    # Not while queries are logged (DEBUG, CaptureQueriesContext): Django cannot show a prepared statement's SQL.
    prepare = (prepare and bool(weft_settings.PREPARED_STATEMENTS) and not connection.queries_logged
               and not getattr(raw, "_weft_unprepared", False))
    if prepare and raw.prepare_threshold is None:
        raw.prepare_threshold = NEVER  # psycopg prepares nothing while it is None, not even on request
    kept: dict[tuple[bool, str | None], Any] | None = getattr(raw, "_weft_cursors", None)
    if kept is None:
        kept = {}
        raw._weft_cursors = kept  # type: ignore[attr-defined]  # the connection's, gone with it
    cursor = kept.get((prepare, statement))
    if cursor is None:
        if len(kept) >= MAX_KEPT_CURSORS:
            kept.clear()  # the engine's statements have a few shapes; this bounds a connection that sees more
        kept_class, preparing_class = _cursor_classes()
        with connection.wrap_database_errors:
            cursor = kept[(prepare, statement)] = (preparing_class if prepare else kept_class)(raw)
    # The stubs type these as taking Django's wrapper; they take any DB-API cursor.
    return connection.make_debug_cursor(cursor) if connection.queries_logged else connection.make_cursor(cursor)


@cache
def _cursor_classes() -> tuple[Any, Any]:
    import psycopg  # not at import: the module is imported on every backend

    class KeptCursor(psycopg.Cursor):
        def close(self) -> None:
            """Left open: Django's wrapper closes its cursor at the end of each ``with`` block, and this one
            is for the next statement on its connection (the connection's close ends it)."""

    class PreparingCursor(KeptCursor):
        """Prepares each statement it sends, unless its connection refused prepared statements."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                    binary: bool | None = None) -> Any:
            try:
                return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)
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

    return KeptCursor, PreparingCursor


# --- parameters ------------------------------------------------------------------------------------------


@cache
def _empty_json() -> dict[type, Any] | None:
    """An empty list and dict as JSONField.get_db_prep_save() makes them on psycopg 3, their JSON text written
    once (about a fifth of a run's parameter making was dumping ``[]`` and ``{}``); None on psycopg2."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return None
    from psycopg.types.json import Jsonb

    return {list: Jsonb([], dumps=lambda _: "[]"), dict: Jsonb({}, dumps=lambda _: "{}")}

Converter = Callable[[Any, BaseDatabaseWrapper], Any]
_INTEGER_FIELDS = (models.IntegerField, models.PositiveIntegerField, models.BigIntegerField,
                   models.PositiveBigIntegerField, models.SmallIntegerField, models.PositiveSmallIntegerField)


def _unchanged_from(field: Field, base: type[Field]) -> bool:
    """``field`` is a ``base`` that prepares its values as ``base`` does (a subclass may convert them)."""
    cls = type(field)
    methods = ("get_db_prep_save", "get_db_prep_value", "get_prep_value", "to_python")
    return isinstance(field, base) and all(getattr(cls, name) is getattr(base, name) for name in methods)


@cache
def converter(field: Field) -> Converter:
    """How the hot statements turn a value of ``field`` into a parameter on PostgreSQL: what
    ``field.get_db_prep_save()`` returns, without its layers for the values the engine writes (strings, UUIDs,
    aware datetimes, bytes and ints; about a third of a run's statements' preparing). Anything else, and
    fields of other classes, go through ``get_db_prep_save()``."""
    def generic(value: Any, connection: BaseDatabaseWrapper) -> Any:
        return field.get_db_prep_save(value, connection)

    if _unchanged_from(field, models.CharField) or _unchanged_from(field, models.TextField):
        return lambda value, connection: (value if value is None or isinstance(value, str)
                                          else generic(value, connection))
    if _unchanged_from(field, models.UUIDField):
        return lambda value, connection: value if type(value) is uuid.UUID else generic(value, connection)
    if _unchanged_from(field, models.DateTimeField):
        return lambda value, connection: (value if type(value) is datetime and value.utcoffset() is not None
                                          else generic(value, connection))
    if _unchanged_from(field, models.BinaryField):
        return lambda value, connection: value if type(value) is bytes else generic(value, connection)
    if _unchanged_from(field, models.JSONField) and getattr(field, "encoder", None) is None:
        def json_value(value: Any, connection: BaseDatabaseWrapper) -> Any:
            # The engine's usual defaults ([] tags, {} attributes), on psycopg 3.
            if type(value) in (list, dict) and not value and connection.vendor == "postgresql":
                empty = _empty_json()
                if empty is not None:
                    return empty[type(value)]
            return generic(value, connection)
        return json_value
    if type(field) in _INTEGER_FIELDS:
        internal = field.get_internal_type()

        def integer(value: Any, connection: BaseDatabaseWrapper) -> Any:
            wrap = getattr(connection.ops, "integerfield_type_map", None)  # psycopg 3's, as Django wraps them
            if type(value) is int and wrap is not None:
                return wrap[internal](value)
            return generic(value, connection)
        return integer
    return generic
