"""DATABASES from the DATABASE_URL environment variable; SQLite (IMMEDIATE transactions, WAL) without it."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


def database_from_env(url: str | None, sqlite_path: Path) -> dict:
    """No URL: SQLite at ``sqlite_path``; ``sqlite:////abs/path.sqlite3``: SQLite there; ``postgres://``."""
    if url and url.startswith("sqlite:///"):
        return database_from_env(None, Path(url.removeprefix("sqlite:///")))
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_path),
            "OPTIONS": {
                # django_weft needs the write lock taken when a transaction begins (check weft.E001).
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    parts = urlparse(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be postgres://... or sqlite:///..., got scheme {parts.scheme!r}")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        # Persistent connections (seconds; "None": unlimited) for long-lived processes, e.g. Celery workers.
        "CONN_MAX_AGE": _conn_max_age(os.environ.get("DJANGO_CONN_MAX_AGE", "60")),
        "CONN_HEALTH_CHECKS": True,
    }


def _conn_max_age(value: str) -> int | None:
    return None if value.lower() == "none" else int(value)
