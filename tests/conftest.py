from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.procs import maintenance, processes  # noqa: F401  (fixtures for the subprocess tests)

pytest_plugins = ["django_weft.testing", "tests.api_helpers"]


# Test files that run real weft_maintenance processes or the soak: marked "slow" (`-m "not slow"` leaves them out).
SLOW_FILES = ("test_processes_", "test_soak", "test_browser")
# Test files that talk to the real Redis and RabbitMQ of the machine: their queues are shared by every xdist
# worker, so they all run on one worker (pytest -n ... --dist loadgroup, as pyproject.toml's addopts say).
BROKER_FILES = ("test_celery_broker.py", "test_celery_sends.py", "test_bench_command.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        if name.startswith(SLOW_FILES):
            item.add_marker(pytest.mark.slow)
        if name in BROKER_FILES:
            item.add_marker(pytest.mark.xdist_group("broker"))


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def has_row_locks() -> bool:
    """A database with real row locks and SKIP LOCKED, where processes and threads race for rows: PostgreSQL
    or MySQL/MariaDB. SQLite serialises whole transactions instead."""
    return connection.vendor in ("postgresql", "mysql")


@pytest.fixture
def staff_client(client):
    """The test client, logged in as a superuser ("admin")."""
    client.force_login(get_user_model().objects.create_superuser("admin", "admin@example.com", "pw"))
    return client


@pytest.fixture
def postgres_only(db: object) -> None:
    """What only PostgreSQL has: LISTEN/NOTIFY, pg_stat_activity, its plans, its text rules."""
    if not on_postgres():
        pytest.skip("needs PostgreSQL: run with DATABASE_URL=postgres://... (as .ci/run does)")


@pytest.fixture
def row_locks(db: object) -> None:
    """The concurrency tests (marked ``concurrent``): processes and threads racing over row locks."""
    if not has_row_locks():
        pytest.skip("needs a database with row locks: DATABASE_URL=postgres://... or mysql://... (as .ci/run does)")
