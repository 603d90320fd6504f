"""The choices of django_weft's records (statuses, kinds, categories). Re-exported by :mod:`django_weft.models`."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    # On a queue (WEFT_QUEUES), or of a paused type, or debounced: waits to be admitted (store/admissions.py).
    QUEUED = "queued", _("Queued")
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    WAITING = "waiting", _("Waiting")
    SUSPENDED = "suspended", _("Suspended")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")
    TIMED_OUT = "timed_out", _("Timed out")
    # Ended by ctx.continue_as_new(): the next run of its workflow id carries on (restarted_from names this one).
    CONTINUED = "continued", _("Continued as new")

    @classmethod
    def open_values(cls) -> list[str]:
        return [cls.QUEUED, cls.PENDING, cls.RUNNING, cls.WAITING, cls.SUSPENDED]

    @classmethod
    def admitted_values(cls) -> list[str]:
        """Open and past admission: a run in one of these holds a slot of its queue until it ends."""
        return [cls.PENDING, cls.RUNNING, cls.WAITING, cls.SUSPENDED]

    @classmethod
    def terminal_values(cls) -> list[str]:
        return [cls.COMPLETED, cls.FAILED, cls.CANCELLED, cls.TIMED_OUT, cls.CONTINUED]


class StepKind(models.TextChoices):
    ACTIVITY = "activity", _("Activity")
    SLEEP = "sleep", _("Sleep")
    SIDE_EFFECT = "side_effect", _("Side effect")
    NOW = "now", _("Clock reading")
    UUID = "uuid", _("UUID")
    RANDOM = "random", _("Random number")
    SIGNAL = "signal", _("Signal wait")
    CHILD = "child", _("Child start")
    CHILD_RESULT = "child_result", _("Child result")
    RACE = "race", _("Race winner")
    PATCH = "patch", _("Patch marker")
    # Applied between operations (the code's handlers, see runtime/replay/handlers.py): an update, a signal.
    UPDATE = "update", _("Update applied")
    SIGNAL_HANDLER = "signal_handler", _("Signal handled")
    CONDITION = "condition", _("Wait condition")
    # ctx.set_search_attributes: applied to the run's row in the commit that records it.
    ATTRIBUTES = "attributes", _("Search attributes")
    # ctx.signal_workflow: the signal is stored for the other run in the commit that records the step.
    SIGNAL_SENT = "signal_sent", _("Signal sent")
    # ctx.start_branch: the branch's result (its own rows sit in a block of positions, see code_branches).
    BRANCH = "branch", _("Branch of code")
    # @weft.transaction: the function's writes committed with this row (design 9.4).
    TRANSACTION = "transaction", _("Database transaction")
    # ctx.set_event, ctx.write_stream / ctx.close_stream: the value is in WorkflowEvent / StreamEntry.
    EVENT = "event", _("Event set")
    STREAM = "stream", _("Stream write")


class StepStatus(models.TextChoices):
    # Parked: a sleep whose timer has not fired, or an activity waiting out its retry backoff.
    WAITING = "waiting", _("Waiting")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    # A branch that lost a ctx.race: nothing it produced is used.
    CANCELLED = "cancelled", _("Cancelled")


class TimerPurpose(models.TextChoices):
    SLEEP = "sleep", _("Sleep")
    RETRY_BACKOFF = "retry_backoff", _("Retry backoff")
    DELAYED_START = "delayed_start", _("Delayed start")
    WAIT_TIMEOUT = "wait_timeout", _("Signal wait timeout")
    # An async activity's deadline: its schedule_to_close_timeout, or its heartbeat_timeout since the last beat.
    ACTIVITY_TIMEOUT = "activity_timeout", _("Async activity timeout")


class AttemptOutcome(models.TextChoices):
    """How one attempt of an activity step ended (a StepAttempt row)."""

    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    TIMED_OUT = "timed_out", _("Timed out")
    # Its executor stopped holding the run while it ran (died, or its lease expired): it may have done its
    # work, or part of it; the run was taken over and the next attempt counts from it.
    LOST = "lost", _("Lost")
    # The branch lost a ctx.race while the attempt ran.
    CANCELLED = "cancelled", _("Cancelled")


class FailureCategory(models.TextChoices):
    APPLICATION = "application", _("Application")
    TIMEOUT = "timeout", _("Timeout")
    CANCELLATION = "cancellation", _("Cancellation")
    RESOURCE = "resource", _("Resource")
    SYSTEM = "system", _("System")


class ParentClosePolicy(models.TextChoices):
    TERMINATE = "terminate", _("Terminate")
    REQUEST_CANCEL = "request_cancel", _("Request cancel")
    ABANDON = "abandon", _("Abandon")


class UpdateStatus(models.TextChoices):
    # Accepted (its validator passed) and waiting for the run to apply it.
    PENDING = "pending", _("Pending")
    # Its handler runs and waits (it calls durable operations): the reply comes when it returns.
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    # Its handler raised, or the run closed before applying it.
    FAILED = "failed", _("Failed")

    @classmethod
    def open_values(cls) -> list[str]:
        """Not answered yet: its caller still waits."""
        return [cls.PENDING, cls.RUNNING]


class AsyncStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    TIMED_OUT = "timed_out", _("Timed out")
    CANCELLED = "cancelled", _("Cancelled")


class ScheduleStatus(models.TextChoices):
    ACTIVE = "active", _("Active")
    PAUSED = "paused", _("Paused")
    CANCELLED = "cancelled", _("Cancelled")


class OverlapPolicy(models.TextChoices):
    SKIP = "skip", _("Skip while a run is open")
    BUFFER_ONE = "buffer_one", _("Buffer one")
    BUFFER_ALL = "buffer_all", _("Buffer all")
    CANCEL_OTHER = "cancel_other", _("Cancel the open run")
    ALLOW_ALL = "allow_all", _("Allow all")


class OccurrenceOutcome(models.TextChoices):
    STARTED = "started", _("Started a run")
    SKIPPED = "skipped", _("Skipped: a run was still open")
    BUFFERED = "buffered", _("Buffered until the open run finishes")
    BUFFER_FULL = "buffer_full", _("Dropped: the buffer was full")
    MISSED = "missed", _("Missed: the tick came too late")
    OUTSIDE_CATCHUP = "outside_catchup", _("Missed: outside the catch-up window")
    PAUSED = "paused", _("Not started: the schedule was paused")
    ERROR = "error", _("Error: the schedule was paused")


class ExecutorKind(models.TextChoices):
    LOOP = "loop", _("weft_maintenance")
    CELERY = "celery", _("Celery worker process")


class BulkOperationStatus(models.TextChoices):
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
