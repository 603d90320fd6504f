from __future__ import annotations

import pytest
from django.db import connection

from tests.procs import maintenance, processes  # noqa: F401  (fixtures for the subprocess tests)

pytest_plugins = ["django_weft.testing", "tests.api_helpers"]


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def postgres_only(db: object) -> None:
    if not on_postgres():
        pytest.skip("needs PostgreSQL: run with DATABASE_URL=postgres://... (as .ci/run does)")
