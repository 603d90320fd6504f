"""What MySQL/MariaDB support needs (design 8.7), checked on every backend where it can be: identifiers compare
exactly, the invariants that were partial unique indexes hold in the database, the checks that refuse a
server or an isolation level weft cannot run on, and lock-conflict retries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.utils import timezone

import django_weft as weft
from django_weft.checks import check_mysql_isolation_setting, check_mysql_server
from django_weft.models import RunStatus, Signal, Workflow
from django_weft.store import lock_retries

pytestmark = pytest.mark.django_db


def _run(workflow_id: str, status: str = RunStatus.PENDING) -> Workflow:
    now = timezone.now()
    finished = None if status in RunStatus.open_values() else now
    return Workflow(workflow_id=workflow_id, workflow_type="test.collect", status=status, created_at=now,
                    updated_at=now, finished_at=finished)


# --- identifiers compare exactly ------------------------------------------------------------------------


@pytest.mark.parametrize("other", ["ORDER-1", "order-1 ", "ordér-1"])
def test_workflow_ids_differing_in_case_accent_or_trailing_space_are_different_workflows(other):
    first = weft.start("test.collect", 1, workflow_id="order-1")
    second = weft.start("test.collect", 1, workflow_id=other)
    assert first.run_id != second.run_id
    assert weft.get_handle("order-1").run_id == first.run_id
    assert weft.get_handle(other).run_id == second.run_id
    assert Workflow.objects.filter(workflow_id="order-1").count() == 1


def test_signal_ids_and_idempotency_keys_compare_exactly():
    handle = weft.start("test.collect", 3, workflow_id="exact")
    assert weft.signal("exact", "item", 1, signal_id="A") is True
    assert weft.signal("exact", "item", 2, signal_id="a") is True
    assert weft.signal("exact", "item", 3, signal_id="A") is False  # the same id: delivered once
    assert sorted(Signal.objects.filter(run_id=handle.run_id).values_list("signal_id", flat=True)) == ["A", "a"]
    keyed = weft.start("test.collect", 1, idempotency_key="Key")
    assert weft.start("test.collect", 1, idempotency_key="key").run_id != keyed.run_id
    assert weft.start("test.collect", 1, idempotency_key="Key").run_id == keyed.run_id


# --- invariants held by the database ---------------------------------------------------------------------


def test_the_database_refuses_a_second_open_run_of_a_workflow_id():
    _run("one-open").save(force_insert=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        _run("one-open", RunStatus.WAITING).save(force_insert=True)
    # Finished runs do not count: any number of them beside the open one.
    _run("one-open", RunStatus.COMPLETED).save(force_insert=True)
    _run("one-open", RunStatus.FAILED).save(force_insert=True)
    assert Workflow.objects.filter(workflow_id="one-open").count() == 3


def test_the_open_workflow_id_column_follows_the_status_without_being_written():
    run = _run("follows")
    run.save(force_insert=True)
    assert Workflow.objects.values_list("open_workflow_id", flat=True).get(pk=run.pk) == "follows"
    Workflow.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, finished_at=timezone.now())
    assert Workflow.objects.values_list("open_workflow_id", flat=True).get(pk=run.pk) is None
    _run("follows").save(force_insert=True)  # the id is free again


def test_the_database_refuses_a_second_run_of_a_schedule_occurrence_and_ignores_runs_of_no_schedule():
    schedule = weft.create_schedule("unique-occurrence", "test.collect", 0, every=timedelta(hours=1))
    moment = timezone.now().replace(microsecond=0)
    first = _run("occ-1", RunStatus.COMPLETED)
    first.schedule, first.scheduled_for = schedule, moment
    first.save(force_insert=True)
    second = _run("occ-2", RunStatus.COMPLETED)
    second.schedule, second.scheduled_for = schedule, moment
    with pytest.raises(IntegrityError), transaction.atomic():
        second.save(force_insert=True)
    for index in range(3):  # NULL schedule and scheduled_for: never a clash
        _run(f"unscheduled-{index}", RunStatus.COMPLETED).save(force_insert=True)


def test_signals_without_an_id_never_clash():
    handle = weft.start("test.collect", 3, workflow_id="no-ids")
    for value in range(3):
        assert weft.signal("no-ids", "item", value) is True
    assert Signal.objects.filter(run_id=handle.run_id, signal_id__isnull=True).count() == 3


# --- system checks ---------------------------------------------------------------------------------------


def _mysql_settings(options: dict) -> dict:
    return {**connections["default"].settings_dict, "ENGINE": "django.db.backends.mysql", "OPTIONS": options}


@pytest.mark.parametrize("options, refused", [
    ({}, None),  # Django's default: read committed
    ({"isolation_level": "read committed"}, None),
    ({"isolation_level": None}, None),  # the server's: the database check looks
    ({"isolation_level": "repeatable read"}, "REPEATABLE READ"),
    ({"isolation_level": "SERIALIZABLE"}, "SERIALIZABLE"),
    ({"isolation_level": "read uncommitted"}, "READ UNCOMMITTED"),
])
def test_e005_refuses_mysql_isolation_levels_other_than_read_committed(monkeypatch, options, refused):
    monkeypatch.setattr(connections["default"], "settings_dict", _mysql_settings(options))
    errors = check_mysql_isolation_setting()
    if refused is None:
        assert errors == []
        return
    [error] = errors
    assert error.id == "weft.E005" and refused in error.msg
    assert '"isolation_level"] = "read committed"' in error.hint and "gap locks" in error.hint


def test_the_mysql_checks_say_nothing_elsewhere():
    if connection.vendor == "mysql":
        pytest.skip("on MySQL they look at the server: test_the_mysql_server_check_reads_the_session")
    assert check_mysql_isolation_setting() == []
    assert check_mysql_server(databases=["default"]) == []


def test_the_mysql_server_check_reads_the_session():
    if connection.vendor != "mysql":
        pytest.skip("needs MySQL/MariaDB: DATABASE_URL=mysql://...")
    assert check_mysql_server(databases=["default"]) == []
    assert connection.features.has_select_for_update_skip_locked
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        [error] = check_mysql_server(databases=["default"])
        assert error.id == "weft.E005" and "REPEATABLE READ" in error.msg
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    assert check_mysql_server(databases=["default"]) == []


# --- lock-conflict retries -------------------------------------------------------------------------------


class _Deadlock(OperationalError):
    def __init__(self) -> None:
        super().__init__(lock_retries.MYSQL_DEADLOCK, "Deadlock found when trying to get lock")


@pytest.mark.django_db(transaction=True)
def test_a_transition_aborted_by_a_deadlock_is_run_again_and_counted():
    attempts: list[int] = []

    def body() -> str:
        attempts.append(1)
        with transaction.atomic():
            if len(attempts) < 3:
                raise _Deadlock()
            return "done"

    before = lock_retries.RETRIES[("test", "deadlock")]
    assert lock_retries.retried("test", body) == "done"
    assert len(attempts) == 3
    assert lock_retries.RETRIES[("test", "deadlock")] == before + 2


def test_inside_a_callers_transaction_a_deadlock_goes_to_the_caller():
    # The test's own transaction is the caller's: InnoDB rolled all of it back, so only the caller can redo it.
    attempts: list[int] = []

    def body() -> None:
        attempts.append(1)
        raise _Deadlock()

    with pytest.raises(OperationalError):
        lock_retries.retried("test", body)
    assert len(attempts) == 1


@pytest.mark.django_db(transaction=True)
def test_with_autocommit_off_a_deadlock_goes_to_the_caller():
    # The caller's transaction is open outside any atomic block; InnoDB rolled it back with the deadlock, so a
    # retry would report success for writes of the caller's that are gone.
    attempts: list[int] = []

    def body() -> None:
        attempts.append(1)
        with transaction.atomic():
            raise _Deadlock()

    transaction.set_autocommit(False)
    try:
        with pytest.raises(OperationalError):
            lock_retries.retried("test", body)
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert len(attempts) == 1


def test_other_database_errors_are_not_retried():
    assert lock_retries.lock_conflict(OperationalError(2006, "MySQL server has gone away")) is None
    assert lock_retries.lock_conflict(OperationalError(lock_retries.MYSQL_LOCK_WAIT_TIMEOUT, "Lock wait timeout")
                                      ) == "lock_wait_timeout"
    assert lock_retries.lock_conflict(IntegrityError(1062, "Duplicate entry")) is None


def _deadlocking_first(*table_writes: str):
    """A query wrapper that aborts the first statement starting with one of ``table_writes`` as InnoDB's
    deadlock."""
    aborted: list[str] = []

    def wrapper(execute, sql, params, many, context):
        if not aborted and sql.lstrip().upper().startswith(table_writes):
            aborted.append(sql)
            raise _Deadlock()
        return execute(sql, params, many, context)
    return wrapper, aborted


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("action", ["terminate", "signal", "suspend"])
def test_an_operators_action_aborted_by_a_deadlock_is_run_again(action):
    # Seen on MariaDB: four threads terminating one run while its executor commits, and one terminate got
    # error 1213 instead of its answer. The action decides from what it reads under its lock: run it again.
    handle = weft.start("test.collect", 1, workflow_id=f"deadlocked-{action}")
    # A signal's write on PostgreSQL is one statement (WITH ... INSERT); elsewhere the INSERT of its row.
    wrapper, aborted = _deadlocking_first(*(("INSERT", "WITH") if action == "signal" else ("UPDATE",)))
    with connection.execute_wrapper(wrapper):
        if action == "terminate":
            assert handle.terminate("operator") is True
        elif action == "signal":
            assert weft.signal(handle.workflow_id, "go", 1) is True
        else:
            handle.suspend("operator")
    assert aborted, "the deadlock was never raised"
    run = handle.refresh()
    if action == "terminate":
        assert run.status == RunStatus.TIMED_OUT
    elif action == "signal":
        assert Signal.objects.filter(run=run, name="go").count() == 1
    else:
        assert run.status == RunStatus.SUSPENDED
