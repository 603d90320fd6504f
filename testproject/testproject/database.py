"""DATABASES from the DATABASE_URL environment variable (postgres://, mysql://, sqlite:///); SQLite (IMMEDIATE
transactions, WAL) without it."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


def database_from_env(url: str | None, sqlite_path: Path) -> dict:
    """No URL: SQLite at ``sqlite_path``; ``sqlite:////abs/path.sqlite3``: SQLite there; ``postgres://``;
    ``mysql://`` (MySQL 8.0+ or MariaDB 10.6+, through mysqlclient: the ``django-weft[mysql]`` extra)."""
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
    options: dict = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme in ("postgres", "postgresql"):
        engine, default_name = "django.db.backends.postgresql", "postgres"
    elif parts.scheme in ("mysql", "mariadb"):
        engine, default_name = "django.db.backends.mysql", ""
        options = {
            "charset": "utf8mb4",
            # django_weft's fenced reads need each statement to see the latest committed rows, and no gap locks
            # (check weft.E005); Django's default too, written out so that a server default cannot change it.
            "isolation_level": "read committed",
            "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
            **options,
        }
    else:
        raise ValueError(
            f"DATABASE_URL must be postgres://..., mysql://... or sqlite:///..., got scheme {parts.scheme!r}")
    settings = {
        "ENGINE": engine,
        "NAME": unquote(parts.path.lstrip("/")) or default_name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
        # Persistent connections (seconds; "None": unlimited) for long-lived processes, e.g. Celery workers.
        "CONN_MAX_AGE": _conn_max_age(os.environ.get("DJANGO_CONN_MAX_AGE", "60")),
        "CONN_HEALTH_CHECKS": True,
    }
    if engine.endswith("mysql"):
        # The test database Django creates: utf8mb4 whatever the server's default character set is.
        settings["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    return settings


def _conn_max_age(value: str) -> int | None:
    return None if value.lower() == "none" else int(value)
