"""django_weft's records, all importable from here (``from django_weft.models import Workflow, RunStatus``).

Data only: every write of a run's status, lease or fence goes through :mod:`django_weft.store`. One module per
family of records; every choice (status, kind, outcome) is in :mod:`.choices`.
"""

from __future__ import annotations

from django_weft.models.api_keys import ApiKey
from django_weft.models.audit import BulkOperation, SpentIdempotencyKey
from django_weft.models.choices import (
    AsyncStatus,
    AttemptOutcome,
    BulkOperationStatus,
    ExecutorKind,
    FailureCategory,
    OccurrenceOutcome,
    OverlapPolicy,
    ParentClosePolicy,
    RunStatus,
    ScheduleStatus,
    StepKind,
    StepStatus,
    TimerPurpose,
    UpdateStatus,
)
from django_weft.models.controls import RunAction, StepControl
from django_weft.models.events import StreamEntry, WorkflowEvent
from django_weft.models.executors import ActivityHeartbeat, Executor
from django_weft.models.in_flight import AttemptInFlight
from django_weft.models.queues import (
    ActivityGrant,
    ActivityLimitState,
    ActivitySlot,
    ActivitySlotState,
    PausedType,
    QueueState,
)
from django_weft.models.runs import AsyncActivity, Signal, StepAttempt, Timer, Workflow, WorkflowStep
from django_weft.models.schedules import Schedule, ScheduleOccurrence
from django_weft.models.search import SearchAttributeValue
from django_weft.models.updates import WorkflowUpdate

__all__ = [
    "ActivityGrant",
    "ActivityHeartbeat",
    "ActivityLimitState",
    "ActivitySlot",
    "ActivitySlotState",
    "ApiKey",
    "AsyncActivity",
    "AsyncStatus",
    "AttemptInFlight",
    "AttemptOutcome",
    "BulkOperation",
    "BulkOperationStatus",
    "Executor",
    "ExecutorKind",
    "FailureCategory",
    "OccurrenceOutcome",
    "OverlapPolicy",
    "ParentClosePolicy",
    "PausedType",
    "QueueState",
    "RunAction",
    "RunStatus",
    "Schedule",
    "ScheduleOccurrence",
    "ScheduleStatus",
    "SearchAttributeValue",
    "Signal",
    "SpentIdempotencyKey",
    "StepAttempt",
    "StepControl",
    "StepKind",
    "StepStatus",
    "StreamEntry",
    "Timer",
    "TimerPurpose",
    "UpdateStatus",
    "Workflow",
    "WorkflowEvent",
    "WorkflowStep",
    "WorkflowUpdate",
]
