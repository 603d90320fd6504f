"""django_weft: durable workflows for Django.

Import the public API from here: ``import django_weft as weft``.

The import paths you may rely on (each keeps working across minor releases; a path that moves keeps an alias
that warns for a release):

- ``django_weft`` (``__all__``), ``django_weft.models`` (the records and their choices),
  ``django_weft.exceptions``, ``django_weft.signals`` (Django signals), ``django_weft.testing``,
  ``django_weft.urls`` and ``django_weft.api.urls`` (to ``include()``), ``django_weft.conf.weft_settings``,
  ``django_weft.tasks`` (the Celery tasks), ``django_weft.observability`` (metrics and tracing hooks),
  ``django_weft.services.liveness`` (``live_executors``, ``stalled_hint``) and ``django_weft.common.codec``
  (``MAX_DEPTH``).

Everything else is internal, laid out by layer, bottom first: ``common/`` (values and rules), ``models/``
(the records), ``observability/``, ``store/`` (the state writer, the one door for a run's status, lease and
fence), ``runtime/`` (one run: replay, executor, activities), ``services/`` (the operations people call),
``worker/`` (the loops), and the faces: ``admin/``, ``api/``, ``management/``, ``checks``, ``views``,
``testing``, ``tasks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_weft.common.moved_paths import install as _install_moved_paths
from django_weft.common.registry import workflow
from django_weft.exceptions import (
    ActivityCancelled,
    ActivityError,
    ActivityTimeout,
    ApplicationError,
    BranchCancelled,
    BulkConfirmationError,
    CancelledError,
    ChildWorkflowFailed,
    ConfigurationError,
    FencingError,
    IdempotencyKeyPurged,
    InvalidArgument,
    InvalidTaskToken,
    NonDeterminismError,
    PayloadError,
    PayloadNotSerializable,
    PayloadTooDeep,
    PayloadTooLarge,
    QueryFailed,
    QueryNotFound,
    ScheduleAlreadyExists,
    ScheduleNotFound,
    StartOrSignalConflict,
    TaskTokenAlreadyUsed,
    TransactionRoutingError,
    TransitionNotAllowed,
    UpdateFailed,
    UpdateNotHandled,
    UpdateRejected,
    WaitTimeout,
    WeftError,
    WorkflowAlreadyExists,
    WorkflowAlreadyRegistered,
    WorkflowCancelled,
    WorkflowClosed,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowNotRegistered,
    WorkflowTimedOut,
)
from django_weft.runtime.activities import (
    ActivityInfo,
    RetryPolicy,
    activity,
    activity_info,
    complete_async,
    complete_async_activity,
    fail_async_activity,
    heartbeat,
)
from django_weft.runtime.transactions import transaction

_install_moved_paths()

if TYPE_CHECKING:
    from django_weft.models import Schedule
    from django_weft.runtime.context import ChildHandle, Context, Pending
    from django_weft.runtime.heartbeats import heartbeat_async
    from django_weft.services import bulk
    from django_weft.services.bulk import BulkPreview, BulkResult
    from django_weft.services.client import WorkflowHandle, cancel, get_handle, signal, start, terminate
    from django_weft.services.maintenance import MaintenanceReport, run_maintenance
    from django_weft.services.pending_activities import PendingActivity
    from django_weft.services.queues import (
        QueueInfo,
        list_queues,
        pause_type,
        paused_types,
        queue_info,
        resume_type,
        set_queue_limits,
    )
    from django_weft.services.schedules import create_schedule, get_schedule
    from django_weft.services.updates import UpdateHandle
    from django_weft.services.visibility import count_runs, list_runs
    from django_weft.services.with_start import (
        StartOrSignalResult,
        StartOrUpdateResult,
        start_or_signal,
        start_or_update,
    )
    from django_weft.worker.in_caller import run

__version__ = "0.1.0"

# Names that import models (and so need the app registry) load on first use.
_LAZY = {
    "start": "services.client",
    "run": "worker.in_caller",
    "get_handle": "services.client",
    "cancel": "services.client",
    "terminate": "services.client",
    "WorkflowHandle": "services.client",
    "signal": "services.client",
    "start_or_signal": "services.with_start",
    "StartOrSignalResult": "services.with_start",
    "start_or_update": "services.with_start",
    "StartOrUpdateResult": "services.with_start",
    "UpdateHandle": "services.updates",
    "list_runs": "services.visibility",
    "BulkPreview": "services.bulk",
    "BulkResult": "services.bulk",
    "count_runs": "services.visibility",
    "ChildHandle": "runtime.context",
    "run_maintenance": "services.maintenance",
    "MaintenanceReport": "services.maintenance",
    "Context": "runtime.context",
    "Pending": "runtime.context",
    "create_schedule": "services.schedules",
    "get_schedule": "services.schedules",
    "Schedule": "models",
    "QueueInfo": "services.queues",
    "PendingActivity": "services.pending_activities",
    "list_queues": "services.queues",
    "queue_info": "services.queues",
    "set_queue_limits": "services.queues",
    "pause_type": "services.queues",
    "resume_type": "services.queues",
    "paused_types": "services.queues",
    "heartbeat_async": "runtime.heartbeats",
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name == "bulk":  # weft.bulk.cancel(...): the module, loaded on first use
        return import_module("django_weft.services.bulk")
    module = _LAZY.get(name)
    if module is None:
        from django_weft.common.moved_paths import MOVED

        if f"django_weft.{name}" in MOVED:  # weft.codec and the like: the flat layout's submodules, aliased
            return import_module(f"django_weft.{name}")
        raise AttributeError(f"module 'django_weft' has no attribute {name!r}")
    return getattr(import_module(f"django_weft.{module}"), name)


__all__ = [
    "ActivityCancelled",
    "ActivityError",
    "ActivityInfo",
    "ActivityTimeout",
    "ApplicationError",
    "BranchCancelled",
    "BulkConfirmationError",
    "BulkPreview",
    "BulkResult",
    "CancelledError",
    "ChildHandle",
    "ChildWorkflowFailed",
    "ConfigurationError",
    "Context",
    "FencingError",
    "IdempotencyKeyPurged",
    "InvalidArgument",
    "InvalidTaskToken",
    "MaintenanceReport",
    "NonDeterminismError",
    "PayloadError",
    "PayloadNotSerializable",
    "PayloadTooDeep",
    "PayloadTooLarge",
    "Pending",
    "PendingActivity",
    "QueryFailed",
    "QueryNotFound",
    "QueueInfo",
    "RetryPolicy",
    "Schedule",
    "ScheduleAlreadyExists",
    "ScheduleNotFound",
    "StartOrSignalConflict",
    "StartOrSignalResult",
    "StartOrUpdateResult",
    "TaskTokenAlreadyUsed",
    "TransactionRoutingError",
    "TransitionNotAllowed",
    "UpdateFailed",
    "UpdateHandle",
    "UpdateNotHandled",
    "UpdateRejected",
    "WaitTimeout",
    "WeftError",
    "WorkflowAlreadyExists",
    "WorkflowAlreadyRegistered",
    "WorkflowCancelled",
    "WorkflowClosed",
    "WorkflowFailed",
    "WorkflowHandle",
    "WorkflowNotFound",
    "WorkflowNotRegistered",
    "WorkflowTimedOut",
    "activity",
    "activity_info",
    "bulk",
    "cancel",
    "complete_async",
    "complete_async_activity",
    "count_runs",
    "create_schedule",
    "fail_async_activity",
    "get_handle",
    "get_schedule",
    "heartbeat",
    "heartbeat_async",
    "list_queues",
    "list_runs",
    "pause_type",
    "paused_types",
    "queue_info",
    "resume_type",
    "run",
    "run_maintenance",
    "set_queue_limits",
    "signal",
    "start",
    "start_or_signal",
    "start_or_update",
    "terminate",
    "transaction",
    "workflow",
]
