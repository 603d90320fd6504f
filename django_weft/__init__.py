"""django_weft: durable workflows for Django.

Workflows are plain functions whose steps are recorded in your database and replayed after a crash.
Import the public API from here: ``import django_weft as weft``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .activities import (
    ActivityInfo,
    RetryPolicy,
    activity,
    activity_info,
    complete_async,
    complete_async_activity,
    fail_async_activity,
    heartbeat,
)
from .exceptions import (
    ActivityCancelled,
    ActivityError,
    ActivityTimeout,
    BranchCancelled,
    BulkConfirmationError,
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
    TransitionNotAllowed,
    UpdateFailed,
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
from .registry import workflow

if TYPE_CHECKING:
    from . import bulk
    from .bulk import BulkPreview, BulkResult
    from .client import WorkflowHandle, cancel, get_handle, signal, start, terminate
    from .finding import count_runs, list_runs
    from .maintenance import MaintenanceReport, run_maintenance
    from .models import Schedule
    from .runtime.context import ChildHandle, Context, Pending
    from .runtime.in_caller import run
    from .schedules import create_schedule, get_schedule
    from .updates import UpdateHandle
    from .with_start import StartOrSignalResult, StartOrUpdateResult, start_or_signal, start_or_update

__version__ = "0.1.0"

# Names that import models (and so need the app registry) load on first use.
_LAZY = {
    "start": "client",
    "run": "runtime.in_caller",
    "get_handle": "client",
    "cancel": "client",
    "terminate": "client",
    "WorkflowHandle": "client",
    "signal": "client",
    "start_or_signal": "with_start",
    "StartOrSignalResult": "with_start",
    "start_or_update": "with_start",
    "StartOrUpdateResult": "with_start",
    "UpdateHandle": "updates",
    "list_runs": "finding",
    "BulkPreview": "bulk",
    "BulkResult": "bulk",
    "count_runs": "finding",
    "ChildHandle": "runtime.context",
    "run_maintenance": "maintenance",
    "MaintenanceReport": "maintenance",
    "Context": "runtime.context",
    "Pending": "runtime.context",
    "create_schedule": "schedules",
    "get_schedule": "schedules",
    "Schedule": "models",
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name == "bulk":  # weft.bulk.cancel(...): the module, loaded on first use
        return import_module("django_weft.bulk")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_weft' has no attribute {name!r}")
    return getattr(import_module(f"django_weft.{module}"), name)


__all__ = [
    "ActivityCancelled",
    "ActivityError",
    "ActivityInfo",
    "ActivityTimeout",
    "BranchCancelled",
    "BulkConfirmationError",
    "BulkPreview",
    "BulkResult",
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
    "QueryFailed",
    "QueryNotFound",
    "RetryPolicy",
    "Schedule",
    "ScheduleAlreadyExists",
    "ScheduleNotFound",
    "StartOrSignalConflict",
    "StartOrSignalResult",
    "StartOrUpdateResult",
    "TaskTokenAlreadyUsed",
    "TransitionNotAllowed",
    "UpdateFailed",
    "UpdateHandle",
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
    "list_runs",
    "run",
    "run_maintenance",
    "signal",
    "start",
    "start_or_signal",
    "start_or_update",
    "terminate",
    "workflow",
]
