"""django_weft as a backend of Django's tasks framework (issue 35): every ``@task`` a durable one-activity run.

The cases named "after django-tasks-db's ``test_x``" are the expectations that django-tasks-db's test suite
(tests/tests.py: DatabaseBackendTestCase, DatabaseBackendWorkerTestCase) checks of its database backend, written
again here against ours: where its worker is ``db_worker``, ours is ``weft_maintenance`` (``weft_env.drive()``
runs its passes in this process). The rest are what a durable backend adds: retries, transactions, queues and
priorities, the operator's view, a SIGKILL.
"""

from __future__ import annotations

import signal
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

import django_weft as weft
from django_weft.common import tasks_api as api
from django_weft.models import RunStatus, StepAttempt, Workflow
from django_weft.tasks_backend import WeftBackend, task_options
from tests.procs import SHORT_LEASE, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db
FRAMEWORK_LOGGER = "django.tasks" if api.FRAMEWORK == "django.tasks" else "django_tasks"
ADD_TYPE = "task:tests.testapp.tasks.add"


class Received:
    """The framework's signals as receivers see them: (signal name, sender, status, attempts)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object, str, int]] = []
        self.results: list[object] = []

    def __enter__(self) -> Received:
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(api, name).connect(self.receiver(name), dispatch_uid=f"test-{name}", weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(api, name).disconnect(dispatch_uid=f"test-{name}")

    def receiver(self, name: str):
        def receive(sender, task_result, **kwargs):
            self.seen.append((name, sender, str(task_result.status), task_result.attempts))
            self.results.append(task_result)
        return receive


# --- the backend (django-tasks-db's DatabaseBackendTestCase) -----------------------------------------------------


def test_using_correct_backend():
    """After django-tasks-db's test_using_correct_backend."""
    backend = api.task_backends["default"]
    assert isinstance(backend, WeftBackend) and backend.alias == "default" and backend.options == {}
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)


@pytest.mark.parametrize("task", [tasks.add, tasks.async_add], ids=["sync", "async"])
@pytest.mark.django_db(transaction=True)  # the framework's signals are sent after commits
def test_enqueue_task(weft_env, task):
    """After django-tasks-db's test_enqueue_task: a READY result, its arguments as JSON, the enqueued signal; here
    also one run, of the task's type, written and nothing run."""
    with Received() as received:
        result = task.enqueue(1, b=3)
    assert uuid.UUID(result.id).version == 4
    assert result.status == api.TaskResultStatus.READY and not result.is_finished
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert (result.task, result.args, result.kwargs, result.attempts) == (task, [1], {"b": 3}, 0)
    assert received.seen == [("task_enqueued", WeftBackend, "READY", 0)] and received.results == [result]
    run = Workflow.objects.get(workflow_id=result.id)
    assert (run.workflow_type, run.status) == (f"task:{task.module_path}", RunStatus.PENDING)


def test_enqueue_task_async(weft_env):
    """After django-tasks-db's test_enqueue_task_async: aenqueue, then aget_result, as an async view would."""
    result = async_to_sync(tasks.add.aenqueue)(2, 5)
    assert result.status == api.TaskResultStatus.READY and result.args == [2, 5]
    assert async_to_sync(tasks.add.aget_result)(result.id) == result


def test_get_result(weft_env):
    """After django-tasks-db's test_get_result: the result read back equals the one enqueue returned."""
    result = tasks.add.enqueue(1, 2)
    assert api.task_backends["default"].get_result(result.id) == result
    assert tasks.add.get_result(result.id) == result


def test_refresh_result(weft_env):
    """After django-tasks-db's test_refresh_result (the worker, not a hand-written row, changes it here)."""
    result = tasks.add.enqueue(40, 2)
    weft_env.drive()
    assert result.status == api.TaskResultStatus.READY  # a result changes only when refreshed
    result.refresh()
    assert result.status == api.TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 42 and result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at
    assert result.worker_ids[0].split(":")[1].isdigit()  # the executor that ran it: host:pid:thread
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


@pytest.mark.parametrize("result_id", ["0b2f6a0e-4d0c-4a5e-9a7e-3f1f5c2d9b10", "123", ""])
def test_get_missing_result(result_id):
    """After django-tasks-db's test_get_missing_result and test_invalid_uuid."""
    with pytest.raises(api.TaskResultDoesNotExist):
        api.task_backends["default"].get_result(result_id)
    with pytest.raises(api.TaskResultDoesNotExist):
        async_to_sync(api.task_backends["default"].aget_result)(result_id)


def test_a_run_that_is_not_a_task_is_no_task_result(weft_env):
    handle = weft.start("test.long_sleep", workflow_id="not-a-task")
    with pytest.raises(api.TaskResultDoesNotExist):
        api.task_backends["default"].get_result(handle.workflow_id)


def test_check():
    """After django-tasks-db's test_check: a good configuration has no errors."""
    from django_weft.checks import check_tasks_backends

    assert list(api.task_backends["default"].check()) == [] and check_tasks_backends() == []


@override_settings(TASKS={"default": {
    "BACKEND": "django_weft.tasks_backend.WeftBackend", "QUEUES": ["default", "nowhere", "emails"],
    "OPTIONS": {"retry": {"max_attempts": 0}, "timeout": -1, "colour": "red", "queue_map": {"emails": "missing"}}}})
def test_check_names_each_configuration_problem():
    """After django-tasks-db's test_database_backend_app_missing: the backend's check says what is wrong."""
    from django_weft.checks import check_tasks_backends

    messages = [error.msg for error in check_tasks_backends()]
    assert all(error.id == "weft.E010" for error in check_tasks_backends())
    assert any("unknown option 'colour'" in message for message in messages), messages
    assert any("max_attempts" in message for message in messages), messages
    assert any("task queue 'nowhere'" in message and "WEFT_QUEUES" in message for message in messages), messages
    assert any("'missing'" in message for message in messages), messages
    out = StringIO()
    with pytest.raises(Exception, match=r"weft\.E010"):
        call_command("check", stdout=out, stderr=out)


def test_validate_on_enqueue(weft_env):
    """After django-tasks-db's test_validate_on_enqueue: a queue the backend does not list is refused."""
    with pytest.raises(api.InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        tasks.add.using(queue_name="unknown_queue").enqueue(1, 2)
    assert not Workflow.objects.exists()


def test_unserialisable_arguments_are_refused_and_nothing_is_written(weft_env):
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(weft.PayloadTooLarge):
        tasks.add.enqueue("x" * 2_000_000, 1)
    assert not Workflow.objects.exists()


def test_a_task_policy_that_is_not_one_is_refused_when_declared():
    with pytest.raises(weft.InvalidArgument, match=r"retry must be a weft\.RetryPolicy"):
        task_options(retry="three times")
    with pytest.raises(weft.InvalidArgument, match="timeout"):
        task_options(timeout=0)
    with pytest.raises(weft.InvalidArgument, match="max_attempts"):
        task_options(retry={"max_attempts": 0})


@pytest.mark.django_db(transaction=True)  # after commits: the signal, the admission pass
def test_enqueue_logs(weft_env, caplog):
    """After django-tasks-db's test_enqueue_logs: the framework's own logger says so."""
    with caplog.at_level("DEBUG", logger=FRAMEWORK_LOGGER):
        result = tasks.add.enqueue(1, 2)
    assert any("enqueued" in record.getMessage() and result.id in record.getMessage() for record in caplog.records)


# --- running (django-tasks-db's DatabaseBackendWorkerTestCase) ----------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the framework's signals are sent after commits
def test_run_enqueued_task(weft_env):
    """After django-tasks-db's test_run_enqueued_task, with the framework's signals."""
    with Received() as received:
        result = tasks.add.enqueue(1, 2)
        weft_env.drive()
    result.refresh()
    assert result.status == api.TaskResultStatus.SUCCESSFUL and result.return_value == 3 and result.attempts == 1
    assert result.started_at >= result.enqueued_at and result.finished_at >= result.started_at
    assert received.seen == [("task_enqueued", WeftBackend, "READY", 0), ("task_started", WeftBackend, "RUNNING", 1),
                             ("task_finished", WeftBackend, "SUCCESSFUL", 1)]
    assert Workflow.objects.get(workflow_id=result.id).status == RunStatus.COMPLETED


def test_run_async_task(weft_env):
    result = tasks.async_add.enqueue(20, 22)
    weft_env.drive()
    result.refresh()
    assert (result.status, result.return_value) == (api.TaskResultStatus.SUCCESSFUL, 42)


@pytest.mark.django_db(transaction=True)  # the framework's signals are sent after commits
def test_failing_task(weft_env):
    """After django-tasks-db's test_failing_task: FAILED, the exception's class and traceback; no retry without a
    policy (Django's semantics), so one attempt."""
    with Received() as received:
        result = tasks.fail.enqueue("This task failed due to ValueError")
        weft_env.drive()
    result.refresh()
    assert result.status == api.TaskResultStatus.FAILED and result.attempts == 1
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert result.errors[0].traceback.endswith("ValueError: This task failed due to ValueError\n")
    assert result.finished_at >= result.started_at >= result.enqueued_at
    assert received.seen[-1] == ("task_finished", WeftBackend, "FAILED", 1)


def test_complex_return_value(weft_env):
    """After django-tasks-db's test_complex_return_value: a value JSON cannot hold fails the task (TypeError)."""
    result = tasks.returns_unserialisable.enqueue()
    weft_env.drive()
    result.refresh()
    assert result.status == api.TaskResultStatus.FAILED and result._return_value is None
    assert result.errors[0].exception_class is TypeError and "Unsupported type" in result.errors[0].traceback


def test_return_value_is_normalised_as_json(weft_env):
    """As the framework's ImmediateBackend: tuples come back as lists."""
    result = tasks.returns_tuple.enqueue()
    weft_env.drive()
    assert tasks.returns_tuple.get_result(result.id).return_value == [1, [2, 3], {"k": [4]}]


def test_run_after(weft_env):
    """After django-tasks-db's test_run_after: a deferred task waits for its time, durably."""
    result = tasks.add.using(run_after=weft_env.now() + timedelta(hours=10)).enqueue(1, 1)
    weft_env.drive()
    assert tasks.add.get_result(result.id).status == api.TaskResultStatus.READY
    weft_env.advance(timedelta(hours=9, minutes=59))
    assert tasks.add.get_result(result.id).status == api.TaskResultStatus.READY
    weft_env.advance(timedelta(minutes=1))
    assert tasks.add.get_result(result.id).return_value == 2


def test_a_run_after_in_the_past_runs_at_once(weft_env):
    result = tasks.add.using(run_after=weft_env.now() - timedelta(hours=2)).enqueue(2, 3)
    weft_env.drive()
    assert tasks.add.get_result(result.id).return_value == 5


@pytest.mark.django_db(transaction=True)  # after commits: the signal, the admission pass
def test_run_after_priority(weft_env):
    """After django-tasks-db's test_run_after_priority: of the tasks waiting on a queue, higher priority first (the
    framework's priority is the opposite of a weft queue's: the backend turns it round)."""
    weft.pause_type("task:tests.testapp.tasks.send_email")  # all three wait, then the queue (concurrency 2) picks
    low = tasks.send_email.using(priority=-5).enqueue("low@example.com")
    high = tasks.send_email.using(priority=50).enqueue("high@example.com")
    middle = tasks.send_email.enqueue("middle@example.com")
    assert {r.workflow_id: r.priority for r in Workflow.objects.all()} == {low.id: 5, high.id: -50, middle.id: 0}
    weft.resume_type("task:tests.testapp.tasks.send_email")
    admitted = set(Workflow.objects.filter(status__in=RunStatus.admitted_values()).values_list("workflow_id",
                                                                                                 flat=True))
    assert admitted == {high.id, middle.id}
    weft_env.drive()
    assert tasks.send_email.get_result(low.id).return_value == "sent to low@example.com"


def test_takes_context(weft_env):
    """The task context: its result as it runs (RUNNING, this attempt's worker) and the attempt number."""
    result = tasks.report_context.enqueue("hello")
    weft_env.drive()
    value = tasks.report_context.get_result(result.id).return_value
    assert value == {"attempt": 1, "id": result.id, "value": "hello", "workers": 1, "status": "RUNNING"}


# --- what a durable backend adds ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the framework's signals are sent after commits
def test_retries_by_the_backends_policy_keep_each_attempts_error(weft_env):
    tasks.CALLS.clear()
    with Received() as received:
        result = tasks.flaky.enqueue("options", 2)
        weft_env.advance_until_idle()
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (api.TaskResultStatus.SUCCESSFUL, 3, 3)
    assert [error.exception_class for error in result.errors] == [ConnectionError, ConnectionError]
    assert "attempt 2 of options failed" in result.errors[1].traceback
    assert [name for name, *_ in received.seen] == ["task_enqueued", "task_started", "task_started", "task_started",
                                                   "task_finished"]
    assert [attempts for name, _, _, attempts in received.seen if name == "task_started"] == [1, 2, 3]


def test_retries_give_up_after_max_attempts(weft_env):
    tasks.CALLS.clear()
    result = tasks.flaky.enqueue("gives-up", 5)
    weft_env.advance_until_idle()
    result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (api.TaskResultStatus.FAILED, 3, 3)
    assert tasks.CALLS["gives-up"] == 3


def test_a_task_with_its_own_retry_policy(weft_env):
    result = tasks.flaky_own_policy.enqueue("own")
    weft_env.drive()
    assert tasks.flaky_own_policy.get_result(result.id).status == api.TaskResultStatus.READY  # waiting to retry
    weft_env.advance_until_idle()
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (api.TaskResultStatus.SUCCESSFUL, 2, 2)


@pytest.mark.django_db(transaction=True)
def test_enqueue_is_part_of_the_callers_transaction(weft_env):
    """After django-tasks-db's test_doesnt_wait_until_transaction_commit: the run is written in the transaction,
    so a rollback takes the task with it and a commit keeps it."""
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.add.enqueue(1, 2)
        assert Workflow.objects.filter(workflow_id=rolled_back.id).exists()
        raise RuntimeError("the view failed")
    assert not Workflow.objects.filter(workflow_id=rolled_back.id).exists()
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 2)
    weft_env.drive()
    assert tasks.add.get_result(kept.id).return_value == 3


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_starts_the_run_after_the_commit(weft_env):
    with Received() as received, transaction.atomic():
        result = tasks.after_commit.enqueue("later")
        assert not Workflow.objects.exists() and received.seen == []
    assert Workflow.objects.get().workflow_id == result.id
    assert received.seen == [("task_enqueued", WeftBackend, "READY", 0)]
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.after_commit.enqueue("never")
        raise RuntimeError("rolled back")
    assert Workflow.objects.count() == 1


def test_a_cancelled_task_fails_with_the_reason(weft_env):
    result = tasks.add.using(run_after=weft_env.now() + timedelta(hours=1)).enqueue(1, 2)
    weft.get_handle(result.id).cancel(reason="not needed")
    weft_env.drive()
    result.refresh()
    assert result.status == api.TaskResultStatus.FAILED and result.attempts == 0
    assert result.errors[0].exception_class_path.startswith("django_weft.exceptions.")


def test_operators_see_tasks_in_the_admin_and_weft_runs(weft_env, staff_client):
    result = tasks.add.enqueue(1, 2)
    weft_env.drive()
    page = staff_client.get(reverse("admin:django_weft_workflow_changelist"), {"type": ADD_TYPE})
    assert [run.workflow_id for run in page.context["cl"].result_list] == [result.id]
    run = Workflow.objects.get(workflow_id=result.id)
    detail = staff_client.get(reverse("admin:django_weft_workflow_change", args=[run.pk])).content.decode()
    assert "tests.testapp.tasks.add" in detail
    out = StringIO()
    call_command("weft_runs", "list", "--type", ADD_TYPE, stdout=out)
    assert result.id in out.getvalue()
    listed = staff_client.get("/weft/api/runs", {"type": ADD_TYPE}).json()
    assert [run["workflow_id"] for run in listed["results"]] == [result.id]


def test_a_waiting_task_is_cancelled_through_the_http_api(weft_env, staff_client):
    result = tasks.add.using(run_after=weft_env.now() + timedelta(hours=1)).enqueue(2, 2)
    response = staff_client.post(f"/weft/api/runs/{result.id}/cancel", {"reason": "not needed"},
                                 content_type="application/json")
    assert response.status_code == 200, response.content
    weft_env.drive()
    result.refresh()
    assert result.status == api.TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == ["django_weft.exceptions.WorkflowCancelled"]


def test_results_are_kept_as_long_as_the_retention_policy_keeps_runs(weft_env):
    """WEFT_RETENTION: completed runs (so successful tasks) a week, failed ones a month."""
    succeeded, failed = tasks.add.enqueue(1, 1), tasks.fail.enqueue("kept longer")
    weft_env.drive()
    weft_env.advance(timedelta(days=7, minutes=1))
    with pytest.raises(api.TaskResultDoesNotExist):
        tasks.add.get_result(succeeded.id)
    assert tasks.fail.get_result(failed.id).status == api.TaskResultStatus.FAILED
    weft_env.advance(timedelta(days=23))
    with pytest.raises(api.TaskResultDoesNotExist):
        tasks.fail.get_result(failed.id)


def test_the_system_check_knows_task_types_with_open_runs(weft_env):
    tasks.add.enqueue(1, 2)
    out = StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "weft.W001" not in out.getvalue()


@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_a_task_whose_executor_is_killed_runs_again_and_its_result_is_recorded_once(row_locks, maintenance,
                                                                                       tmp_path):
    log = tmp_path / "task.log"
    result = tasks.slow_append.enqueue(str(log), "v", 3.0)
    first = maintenance("first", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: log.exists() and log.read_text().count("v:") == 1, "the task to start", 30, [first])
    first.popen.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert tasks.slow_append.get_result(result.id).status != api.TaskResultStatus.SUCCESSFUL
    second = maintenance("second", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: tasks.slow_append.get_result(result.id).is_finished, "the task to finish", 90, [second])

    final = tasks.slow_append.get_result(result.id)
    assert (final.status, final.return_value, final.attempts) == (api.TaskResultStatus.SUCCESSFUL, "v", 2)
    lines = log.read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["v", "v", "done"]  # begun twice, finished once
    assert lines[0].split(":")[1] == str(first.pid) and lines[1].split(":")[1] == str(second.pid)
    assert [row.outcome for row in StepAttempt.objects.filter(run__workflow_id=result.id).order_by("attempt")] == [
        "lost", "completed"]
    assert final.worker_ids[0].split(":")[1] == str(first.pid) and final.worker_ids[1].split(":")[1] == str(
        second.pid)
    assert Workflow.objects.filter(workflow_id=result.id).count() == 1
    # The lost attempt is the one error: of an importable class that says what happened.
    assert [error.exception_class for error in final.errors] == [weft.exceptions.AttemptLost]
