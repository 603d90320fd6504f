"""django_weft: durable workflows for Django.

Workflows are plain functions whose steps are recorded in your database and replayed after a crash.
Import the public API from here: ``import django_weft as weft``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .activities import RetryPolicy, activity
from .exceptions import (
    ActivityError,
    ActivityTimeout,
    ConfigurationError,
    FencingError,
    InvalidArgument,
    NonDeterminismError,
    PayloadError,
    PayloadNotSerializable,
    PayloadTooLarge,
    TransitionNotAllowed,
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
    from .client import WorkflowHandle, cancel, get_handle, start
    from .maintenance import MaintenanceReport, run_maintenance
    from .runtime.context import Context

__version__ = "0.1.0"

# Names that import models (and so need the app registry) load on first use.
_LAZY = {
    "start": "client",
    "get_handle": "client",
    "cancel": "client",
    "WorkflowHandle": "client",
    "run_maintenance": "maintenance",
    "MaintenanceReport": "maintenance",
    "Context": "runtime.context",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_weft' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"django_weft.{module}"), name)


__all__ = [
    "ActivityError",
    "ActivityTimeout",
    "ConfigurationError",
    "Context",
    "FencingError",
    "InvalidArgument",
    "MaintenanceReport",
    "NonDeterminismError",
    "PayloadError",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "RetryPolicy",
    "TransitionNotAllowed",
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
    "cancel",
    "get_handle",
    "run_maintenance",
    "start",
    "workflow",
]
