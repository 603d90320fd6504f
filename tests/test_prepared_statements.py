"""The engine's hot statements are prepared on PostgreSQL (WEFT_PREPARED_STATEMENTS), and a connection whose
prepared statements vanish (a pooler in transaction mode sends them to another server connection) goes on
unprepared instead of failing its runs."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test import override_settings

import django_weft as weft
from django_weft.models import RunStatus, WorkflowStep

pytestmark = [pytest.mark.django_db(transaction=True)]


def prepared_here() -> list[str]:
    """The statements prepared on this thread's connection (its own session's view)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def spec(key: str, count: int = 3) -> dict:
    return {"key": key, "count": count}


def test_the_run_insert_and_the_step_commits_are_prepared(postgres_only):
    handle = weft.run("test.steps", spec("p1"))
    assert handle.status == RunStatus.COMPLETED
    statements = prepared_here()
    assert any('INSERT INTO "django_weft_workflow"' in s for s in statements), statements
    assert any('UPDATE "django_weft_workflow"' in s and "django_weft_workflowstep" in s for s in statements)
    # Prepared once per connection: a second run sends the same statements.
    before = len(statements)
    weft.run("test.steps", spec("p2"))
    assert len(prepared_here()) == before


@override_settings(WEFT_PREPARED_STATEMENTS=False)
def test_nothing_is_prepared_when_turned_off(postgres_only):
    assert weft.run("test.steps", spec("off")).status == RunStatus.COMPLETED
    assert prepared_here() == []


def test_a_connection_whose_prepared_statements_vanish_goes_on_unprepared(postgres_only, caplog):
    assert weft.run("test.steps", spec("before")).status == RunStatus.COMPLETED
    assert prepared_here()
    # What a pooler in transaction mode does to a client: the next server connection has none of them.
    with connection.cursor() as cursor:
        cursor.execute("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$")  # unseen by psycopg's own bookkeeping
    with caplog.at_level(logging.WARNING, logger="django_weft.bound_cursor"):
        handle = weft.run("test.steps", spec("after"))
    assert handle.status == RunStatus.COMPLETED
    assert list(WorkflowStep.objects.filter(run_id=handle.run_id).order_by("seq").values_list("seq", flat=True)) \
        == [1, 2, 3]
    assert "prepared statements fail on this connection" in caplog.text
    # From then on this connection prepares nothing more, and its runs still complete.
    assert prepared_here() == []
    assert weft.run("test.steps", spec("later")).status == RunStatus.COMPLETED
    assert prepared_here() == []


def test_runs_go_on_after_their_connection_is_closed_and_opened_again(postgres_only):
    # The engine keeps its cursors on the open connection; a new connection (CONN_MAX_AGE, a lost server)
    # must get new ones, prepared again, not the closed one's.
    assert weft.run("test.steps", spec("first")).status == RunStatus.COMPLETED
    connection.close()
    handle = weft.run("test.steps", spec("reopened"))
    assert handle.status == RunStatus.COMPLETED
    assert WorkflowStep.objects.filter(run_id=handle.run_id).count() == 3
    assert any('INSERT INTO "django_weft_workflow"' in s for s in prepared_here())
