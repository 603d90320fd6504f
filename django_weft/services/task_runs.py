"""Tasks of Django's tasks framework run as one-activity runs (the engine side of
:class:`django_weft.tasks_backend.WeftBackend`).

An enqueued task is a run of type ``task:<module path of the task>`` whose input is the task's call (its
arguments, backend, queue, priority and ``run_after``) and whose workflow runs the task's function as its one
activity, retried by the task's policy; its ``workflow_id`` is the task result's id. Each ``task:`` type is
registered when first asked for (:func:`resolve_task_type`), so any ``@task`` function is a type every executor
knows once its module imports. A :class:`TaskResult` is read back from the run, its step and its attempt history.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils.module_loading import import_string

from django_weft import exceptions as weft_exceptions
from django_weft import signals
from django_weft.common import clock
from django_weft.common import tasks_api as api
from django_weft.common.codec import decode
from django_weft.common.durations import to_seconds
from django_weft.common.registry import WorkflowDefinition, add_resolver
from django_weft.exceptions import InvalidArgument
from django_weft.models import RunStatus, StepAttempt, StepStatus, Workflow, WorkflowStep
from django_weft.runtime.activities import ActivityDefinition, RetryPolicy, activity_info
from django_weft.services import client

TYPE_PREFIX = "task:"
OPTION_KEYS = ("retry", "timeout", "queue_map", "enqueue_on_commit")
# Without a policy of its own a task is run as Django's framework runs it: an exception fails it, no retry. An
# attempt lost with its executor (killed mid-task) is not the task's failure: it runs again, up to three attempts.
DEFAULT_RETRY = RetryPolicy(max_attempts=3, non_retryable=(Exception,))
FAILED_STATUSES = {RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT, RunStatus.CONTINUED}


def task_type(module_path: str) -> str:
    return TYPE_PREFIX + module_path


def load_task(module_path: str) -> api.Task:
    """The ``@task`` object at ``module_path``; InvalidArgument when there is none."""
    try:
        found = import_string(module_path)
    except ImportError as exc:
        raise InvalidArgument(f"no task at {module_path!r}: {exc}") from None
    if not isinstance(found, api.Task):
        raise InvalidArgument(f"{module_path!r} is not a task (decorate the function with @task)")
    return found


# --- options ---------------------------------------------------------------------------------------------------


def retry_policy(value: Any) -> RetryPolicy:
    """A RetryPolicy given as one, or as a dict of its fields (``non_retryable`` as dotted paths allowed)."""
    if isinstance(value, RetryPolicy):
        return value
    if not isinstance(value, dict):
        raise InvalidArgument(f"retry must be a weft.RetryPolicy or a dict of its fields, got {value!r}")
    fields = dict(value)
    kinds = fields.get("non_retryable")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str | type) else list(kinds)
        try:
            fields["non_retryable"] = tuple(import_string(k) if isinstance(k, str) else k for k in kinds)
        except ImportError as exc:
            raise InvalidArgument(f"retry non_retryable: {exc}") from None
    try:
        return RetryPolicy(**fields)
    except TypeError as exc:
        raise InvalidArgument(f"retry: {exc}") from None


def option_problems(options: Any, queues: set[str]) -> list[str]:
    """What is wrong with a backend's OPTIONS and QUEUES (the backend's system check), one message each."""
    if not isinstance(options, dict):
        return [f"OPTIONS must be a dict, got {type(options).__name__}"]
    problems = [f"unknown option {key!r} (known: {', '.join(OPTION_KEYS)})" for key in options
                if key not in OPTION_KEYS]
    try:
        if options.get("retry") is not None:
            retry_policy(options["retry"])
        if options.get("timeout") is not None:
            to_seconds(options["timeout"], "timeout", allow_zero=False)
    except InvalidArgument as exc:
        problems.append(str(exc))
    queue_map = options.get("queue_map", {})
    if not isinstance(queue_map, dict):
        return [*problems, f"queue_map must be a dict of task queue -> queue of WEFT_QUEUES, got {queue_map!r}"]
    from django_weft.common.queues import check_queue_name

    for name in sorted(queues | set(queue_map)):
        target = weft_queue(name, options)
        if target is not None:
            try:
                check_queue_name(target, f"the queue of task queue {name!r}")
            except InvalidArgument as exc:
                problems.append(f"{exc}; add it to WEFT_QUEUES or map it with OPTIONS['queue_map']")
    return problems


def weft_queue(queue_name: str, options: dict) -> str | None:
    """The queue of WEFT_QUEUES that admits tasks of ``queue_name``: ``queue_map``'s, else the queue of that name;
    tasks of the framework's default queue (unmapped) start on none, runnable at once."""
    mapped = (options.get("queue_map") or {}).get(queue_name)
    if mapped is not None:
        return mapped or None
    return None if queue_name == api.DEFAULT_TASK_QUEUE_NAME else queue_name


# --- enqueue -----------------------------------------------------------------------------------------------------


def enqueue(backend: api.BaseTaskBackend, task: api.Task, args: Any, kwargs: Any) -> api.TaskResult:
    """Start the run of ``task(*args, **kwargs)``: inside the caller's transaction (it commits with it), or after
    it commits with OPTIONS ``enqueue_on_commit``. Bad arguments are refused before anything is written."""
    call: dict[str, Any] = api.normalize_json({"args": list(args), "kwargs": dict(kwargs)})  # TypeError: not JSON
    now = clock.now()
    spec = {"task": task.module_path, "backend": backend.alias, "args": call["args"], "kwargs": call["kwargs"],
            "priority": task.priority, "queue_name": task.queue_name, "run_after": task.run_after,
            "enqueued_at": now}
    queue = weft_queue(task.queue_name, backend.options)

    def ready(result_id: str) -> api.TaskResult:
        return api.TaskResult(task=task, id=result_id, status=api.TaskResultStatus.READY, enqueued_at=now,
                              started_at=None, finished_at=None, last_attempted_at=None, args=call["args"],
                              kwargs=call["kwargs"], backend=backend.alias, errors=[], worker_ids=[])

    def start(workflow_id: str | None = None) -> api.TaskResult:
        # The framework's priority: higher first; a queue's: lower first. Without a workflow_id the start is one
        # INSERT (a new UUID, as the result's id); a given one is checked against open runs first.
        handle = client.start(task_type(task.module_path), spec, workflow_id=workflow_id, start_at=task.run_after,
                              queue=queue, priority=-task.priority)
        result = ready(handle.workflow_id)
        transaction.on_commit(lambda: api.task_enqueued.send_robust(type(backend), task_result=result))
        return result

    if not backend.options.get("enqueue_on_commit"):
        return start()
    result_id = str(uuid.uuid4())
    transaction.on_commit(lambda: start(result_id))  # at once outside a transaction
    return ready(result_id)


# --- the run -----------------------------------------------------------------------------------------------------


def run_task(ctx: Any, spec: dict) -> Any:
    """The workflow of every ``task:`` type: the task as one activity."""
    return ctx.run(attempt_function(spec), spec)


def attempt_function(spec: dict) -> Callable[[dict], dict]:
    """What an attempt of the task of ``spec`` calls, with its activity definition: the task's path as its name,
    its retry policy and timeout (the task's ``retry``/``timeout``, else its backend's OPTIONS)."""
    task = load_task(spec["task"])
    backend = api.task_backends[spec["backend"]]
    own = getattr(task.func, "__weft_task_options__", None) or {}  # tasks_backend.task_options
    retry = own.get("retry") or backend.options.get("retry")
    timeout = own.get("timeout") or backend.options.get("timeout")

    def attempt(spec: dict) -> dict:
        return run_attempt(task, backend, spec)

    attempt.__weft_activity__ = ActivityDefinition(  # type: ignore[attr-defined]
        name=spec["task"], fn=attempt, retry=DEFAULT_RETRY if retry is None else retry_policy(retry),
        timeout=None if timeout is None else to_seconds(timeout, "timeout", allow_zero=False))
    return attempt


def run_attempt(task: api.Task, backend: api.BaseTaskBackend, spec: dict) -> dict:
    """One attempt: the framework's ``task_started``, then the task (with its context when it takes one). Its
    value, normalised as the framework does, is recorded with the executor that ran it."""
    info = activity_info()
    now = clock.now()
    earlier = list(StepAttempt.objects.filter(run_id=info.run_id, seq=info.seq, attempt__lt=info.attempt)
                   .order_by("attempt").values_list("executor", "started_at")) if info.attempt > 1 else []
    result = api.TaskResult(
        task=task, id=info.workflow_id, status=api.TaskResultStatus.RUNNING, enqueued_at=spec.get("enqueued_at"),
        started_at=next((began for _, began in earlier if began is not None), now), finished_at=None,
        last_attempted_at=now, args=spec["args"], kwargs=spec["kwargs"], backend=backend.alias, errors=[],
        worker_ids=[executor for executor, _ in earlier] + [info.executor])
    api.task_started.send_robust(type(backend), task_result=result)
    if task.takes_context:
        value = task.call(api.TaskContext(task_result=result), *spec["args"], **spec["kwargs"])
    else:
        value = task.call(*spec["args"], **spec["kwargs"])
    return {"value": api.normalize_json(value), "worker": info.executor}


def resolve_task_type(name: str) -> WorkflowDefinition | None:
    """The definition of type ``task:<path>`` when ``path`` is a task (registry hook)."""
    if not name.startswith(TYPE_PREFIX):
        return None
    try:
        load_task(name[len(TYPE_PREFIX):])
    except InvalidArgument:
        return None
    return WorkflowDefinition(name=name, fn=run_task, takes_input=True)


add_resolver(resolve_task_type)


# --- results -----------------------------------------------------------------------------------------------------


def get_result(result_id: str) -> api.TaskResult:
    run = (Workflow.objects.filter(workflow_id=result_id, workflow_type__startswith=TYPE_PREFIX)
           .order_by("-created_at").first()) if isinstance(result_id, str) else None
    if run is None:
        raise api.TaskResultDoesNotExist(result_id)
    return result_of(run)


def result_of(run: Workflow) -> api.TaskResult:
    """The framework's view of a task's run: its status, times, attempts (``worker_ids``, one per attempt, lost
    ones included), errors (one per failed attempt) and value."""
    spec = decode(run.input)
    try:
        task = load_task(spec["task"])
    except InvalidArgument as exc:
        raise api.TaskResultDoesNotExist(f"{run.workflow_id}: {exc}") from None
    try:
        task = task.using(priority=spec["priority"], queue_name=spec["queue_name"], run_after=spec["run_after"],
                          backend=spec["backend"])
    except api.InvalidTask:
        pass  # the backend's configuration changed since: the task as its code declares it
    step = WorkflowStep.objects.filter(run=run).order_by("seq").first()
    attempts = list(StepAttempt.objects.filter(run=run).order_by("attempt")) if step is not None else []
    status = status_of(run)
    value = decode(run.result) if run.status == RunStatus.COMPLETED else None
    workers = [row.executor for row in attempts]
    if not attempts and step is not None and step.status != StepStatus.WAITING:  # one attempt, settled
        workers.append(value["worker"] if value else str((step.error or {}).get("executor", "")))
    if status == api.TaskResultStatus.RUNNING and (step is None or step.status == StepStatus.WAITING):
        workers.append(run.lease_owner)  # the attempt under way
    first_start = step.started_at if step is not None else run.started_at if workers else None
    starts = [row.started_at for row in attempts if row.started_at is not None]
    result = api.TaskResult(
        task=task, id=run.workflow_id, status=status, enqueued_at=spec.get("enqueued_at", run.created_at),
        started_at=first_start,
        finished_at=run.finished_at if status in (api.TaskResultStatus.SUCCESSFUL, api.TaskResultStatus.FAILED)
        else None,
        last_attempted_at=max(starts) if starts else first_start,
        args=spec["args"], kwargs=spec["kwargs"], backend=spec["backend"],
        errors=errors_of(run, step, attempts), worker_ids=workers)
    if value is not None:
        object.__setattr__(result, "_return_value", value["value"])
    return result


def status_of(run: Workflow) -> api.TaskResultStatus:
    if run.status == RunStatus.COMPLETED:
        return api.TaskResultStatus.SUCCESSFUL
    if run.status in FAILED_STATUSES:
        return api.TaskResultStatus.FAILED
    if run.status == RunStatus.RUNNING and run.lease_owner:
        return api.TaskResultStatus.RUNNING
    return api.TaskResultStatus.READY  # queued, waiting to start or for a retry, suspended


def errors_of(run: Workflow, step: WorkflowStep | None, attempts: list[StepAttempt]) -> list[api.TaskError]:
    errors = [row.error for row in attempts if row.error]
    if not attempts and step is not None and step.error and step.status == StepStatus.FAILED:
        errors.append(step.error)
    if not errors and run.status in FAILED_STATUSES and run.error:
        errors.append(run.error)  # ended without a failed attempt: cancelled, timed out
    return [api.TaskError(exception_class_path=exception_path(str(error.get("type", ""))),
                          traceback=str(error.get("traceback") or error.get("message") or ""))
            for error in errors]


# The engine's own short names for how a run or attempt ended, as the exception a caller of weft would see.
ENGINE_ERRORS = {"Cancelled": "WorkflowCancelled", "Terminated": "WorkflowCancelled", "TimedOut": "WorkflowTimedOut",
                 "RecoveryLimit": "WorkflowFailed", "HistoryLimit": "WorkflowFailed"}


def exception_path(name: str) -> str:
    """A recorded error's type as an importable path (built-ins are recorded by bare name)."""
    if "." in name:
        return name
    name = ENGINE_ERRORS.get(name, name)
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    if isinstance(getattr(weft_exceptions, name, None), type):
        return f"django_weft.exceptions.{name}"
    return name


# --- the framework's task_finished -------------------------------------------------------------------------------


def send_task_finished(sender: Any, run: Workflow, **_: Any) -> None:
    """After the commit that ended a task's run (weft's run signals): the framework's ``task_finished``."""
    if not run.workflow_type.startswith(TYPE_PREFIX):
        return
    try:
        result = get_result(run.workflow_id)
    except api.TaskResultDoesNotExist:
        return  # its task's code is gone: nothing to describe it with
    backend = api.task_backends[result.backend]
    api.task_finished.send_robust(type(backend), task_result=result)


for _signal in (signals.workflow_completed, signals.workflow_failed, signals.workflow_cancelled,
                signals.workflow_timed_out):
    _signal.connect(send_task_finished, dispatch_uid="django_weft.task_finished")
