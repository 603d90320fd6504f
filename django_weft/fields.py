"""Model fields whose database form depends on the backend (data layer)."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

# Byte-for-byte comparison without PAD SPACE ("a" and "a " differ, as on PostgreSQL and SQLite). MariaDB
# names it utf8mb4_nopad_bin; MySQL 8.0's utf8mb4_0900_bin is NO PAD already (its utf8mb4_bin pads).
MARIADB_EXACT_COLLATION = "utf8mb4_nopad_bin"
MYSQL_EXACT_COLLATION = "utf8mb4_0900_bin"


def exact_collation(connection: BaseDatabaseWrapper) -> str | None:
    """The collation that makes string comparison exact on ``connection``; None where it already is."""
    if connection.vendor != "mysql":
        return None
    return MARIADB_EXACT_COLLATION if getattr(connection, "mysql_is_mariadb", False) else MYSQL_EXACT_COLLATION


class IdentifierField(models.CharField):
    """A ``CharField`` for ids that compares exactly (case, accents and trailing spaces) on every backend.

    PostgreSQL and SQLite compare strings byte for byte. MySQL's and MariaDB's default collations fold case
    and accents, so there "Order-1" and "order-1" would be one ``workflow_id``: a lookup would find the other's
    run and a unique constraint would refuse the second. On MySQL/MariaDB the column gets a binary collation
    (:func:`exact_collation`); elsewhere it is a plain ``CharField``. Being a database parameter, not a
    ``db_collation`` in the migration, it survives ``AlterField`` and leaves PostgreSQL and SQLite untouched.
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params = super().db_parameters(connection)
        if not params.get("collation"):
            collation = exact_collation(connection)
            if collation:
                params["collation"] = collation
        return params
