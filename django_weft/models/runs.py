"""The records of runs: the run, its journal steps and their attempts, timers, signals and async activities."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.utils.translation import gettext_lazy as _

from django_weft.common.codec import decode
from django_weft.fields import IdentifierField
from django_weft.models.choices import (
    AsyncStatus,
    AttemptOutcome,
    FailureCategory,
    ParentClosePolicy,
    RunStatus,
    StepKind,
    StepStatus,
    TimerPurpose,
)
from django_weft.models.querysets import WorkflowQuerySet


class Workflow(models.Model):
    """One run of a workflow.

    ``runnable_at`` is when the run should next be looked at by an executor: the start time of a
    pending run, the earliest timer of a waiting one, and, while an executor holds the run, the expiry
    of its lease. The claim query (``runnable_at <= now``) is therefore also crash recovery: a dead
    executor's run becomes claimable when its lease runs out. Finished and suspended runs have none.
    """

    run_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow_id = IdentifierField(max_length=255, help_text=_("Business id; at most one open run per id."))
    # The workflow_id while the run is open, NULL once it is finished; kept by the database, so no transition
    # writes it. Its plain unique constraint (NULLs are distinct) is "one open run per workflow_id" on every
    # backend: MySQL and MariaDB have no partial unique indexes, and Django skips conditional constraints there.
    open_workflow_id = models.GeneratedField(
        expression=Case(When(status__in=RunStatus.open_values(), then=F("workflow_id")), default=Value(None)),
        output_field=IdentifierField(max_length=255, null=True),
        db_persist=True,
    )
    workflow_type = IdentifierField(max_length=200)
    # The version of the workflow's code the run started on and always executes with.
    version = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    input = models.BinaryField(null=True, blank=True)
    result = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    failure_category = models.CharField(max_length=16, choices=FailureCategory.choices, blank=True)
    # Why the engine ended the run, where it did (e.g. "history_limit", "cancel_requested"); while a requested
    # cancel is delivered to its code and it cleans up (cancel_requested_at), why it will be cancelled.
    termination_reason = models.CharField(max_length=64, blank=True)
    idempotency_key = IdentifierField(max_length=255, null=True, blank=True, unique=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    restarted_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="restarts"
    )
    tags = models.JSONField(default=list, blank=True)
    search_attributes = models.JSONField(default=dict, blank=True)
    # The W3C trace context (traceparent...) of the code that started the run: its execution spans link to it.
    trace_context = models.JSONField(null=True, blank=True)
    runnable_at = models.DateTimeField(null=True, blank=True)
    wait_reason = models.CharField(max_length=255, blank=True)
    lease_owner = models.CharField(max_length=255, blank=True)
    # Bumped on every claim and on every transition that takes the run from its executor.
    fence = models.BigIntegerField(default=0)
    # Bumped by every external event for the run (signal, async completion, child finished). Signals
    # take it as their arrival sequence; an executor parking the run compares it with the value it
    # claimed, so an event that landed while it was replaying wakes the run instead of being missed.
    inbox_seq = models.BigIntegerField(default=0)
    # How often an operator retried the run after it failed. Part of every task token, so a token handed
    # out before a retry resolves nothing after it.
    retries = models.PositiveIntegerField(default=0)
    # Takeovers of the run (its executor died) in a row without the journal growing, and the journal
    # length they saw: a run whose executors keep dying at one step is failed, not re-claimed forever.
    recoveries = models.PositiveIntegerField(default=0)
    # Times the run's own code raised and the run was held (on_error="hold"): its backoff grows with it.
    code_errors = models.PositiveIntegerField(default=0)
    recovery_mark = models.PositiveIntegerField(default=0)
    # Signal names the parked run waits for: a signal with one of them wakes it.
    awaiting_signals = models.JSONField(default=list, blank=True)
    schedule = models.ForeignKey("Schedule", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="runs")
    scheduled_for = models.DateTimeField(null=True, blank=True, help_text=_("The schedule occurrence it runs for."))
    parent_close_policy = models.CharField(max_length=16, choices=ParentClosePolicy.choices,
                                           default=ParentClosePolicy.TERMINATE)
    # Set by a cancel request (handle.cancel, a parent's request_cancel, a lost race): the run's code sees
    # weft.CancelledError and may clean up until execution_deadline (the request + cleanup_timeout).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Flow control (store/admissions.py): the queue (WEFT_QUEUES) that admits the run, "" for none; the key its
    # concurrency_per_key counts; lower priority first; a queued run is not admitted before admit_at (a delayed
    # start, a debounce window); admitted_at is when its queue admitted it (its rate limits count these).
    queue = models.CharField(max_length=100, blank=True, default="", db_default="")
    concurrency_key = IdentifierField(max_length=255, null=True, blank=True)
    priority = models.IntegerField(default=0, db_default=0)
    admit_at = models.DateTimeField(null=True, blank=True)
    # Start order among runs queued in one process at the same instant (a test's frozen clock, a burst within a
    # microsecond): FIFO breaks ties of admit_at and created_at by it.
    queue_order = models.BigIntegerField(default=0, db_default=0)
    admitted_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True, default="")
    # An operator controlled one of its steps (models.StepControl): the replay reads those controls.
    has_step_controls = models.BooleanField(default=False, db_default=False)
    execution_deadline = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = WorkflowQuerySet.as_manager()

    class Meta:
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        ordering = ["-created_at"]
        permissions = [
            ("cancel_workflow", "Can cancel workflow runs"),
            ("retry_workflow", "Can retry failed workflow runs"),
            ("suspend_workflow", "Can suspend and resume workflow runs"),
            ("purge_workflow", "Can purge finished workflow runs"),
            ("signal_workflow", "Can signal workflow runs and complete their async activities"),
            ("view_payloads", "Can see payloads: inputs, results, signal and update payloads, query answers, events "
                              "and streams, heartbeat details"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["open_workflow_id"], name="weft_one_open_run_per_workflow_id"),
            # What makes any number of maintenance processes safe: one run per schedule occurrence. Plain, not
            # partial: a unique index holds NULLs distinct on every backend, so runs of no schedule never clash.
            models.UniqueConstraint(fields=["schedule", "scheduled_for"], name="weft_one_run_per_occurrence"),
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.open_values()) | Q(finished_at__isnull=False),
                name="weft_finished_runs_have_finished_at",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=[*RunStatus.terminal_values(), RunStatus.SUSPENDED])
                | Q(runnable_at__isnull=True),
                name="weft_only_open_runs_are_runnable",
            ),
        ]
        indexes = [
            # The claim query: runnable runs by runnable_at.
            models.Index(
                fields=["runnable_at"], condition=Q(runnable_at__isnull=False), name="weft_runnable_idx"
            ),
            # Execution timeouts of open runs.
            models.Index(
                fields=["execution_deadline"],
                condition=Q(execution_deadline__isnull=False, finished_at__isnull=True),
                name="weft_deadline_idx",
            ),
            # Retention: finished runs by age.
            models.Index(
                fields=["status", "finished_at"], condition=Q(finished_at__isnull=False),
                name="weft_finished_idx",
            ),
            models.Index(fields=["workflow_id", "-created_at"], name="weft_workflow_id_idx"),
            models.Index(fields=["workflow_type", "-created_at"], name="weft_type_idx"),
            # The admin's status filter and per-status counts, newest first.
            models.Index(fields=["status", "-created_at"], name="weft_status_idx"),
            models.Index(fields=["-created_at"], name="weft_created_idx"),
            models.Index(fields=["parent"], condition=Q(parent__isnull=False), name="weft_children_idx"),
            models.Index(fields=["failure_category", "-created_at"], condition=~Q(failure_category=""),
                         name="weft_failure_category_idx"),
            # weft.count_runs(group_by="type" | "status" | "failure_category") over many runs, also of one type:
            # an index-only scan of a small index (few distinct keys, deduplicated).
            models.Index(fields=["workflow_type", "status", "failure_category"], name="weft_group_idx"),
            # Admission: a queue's queued runs in order, its admitted runs counted (per key), its recent admissions.
            models.Index(fields=["queue", "status", "priority", "admit_at"], name="weft_queue_idx"),
            models.Index(fields=["queue", "concurrency_key", "status"], name="weft_queue_key_idx"),
            models.Index(fields=["queue", "admitted_at"], condition=Q(admitted_at__isnull=False),
                         name="weft_admitted_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_type} {self.workflow_id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in RunStatus.terminal_values()

    # ``input`` and ``result`` hold msgpack bytes; these are the Python values (for shells and scripts).
    @property
    def decoded_input(self) -> Any:
        """The run's input as the workflow received it."""
        return decode(self.input)

    @property
    def decoded_result(self) -> Any:
        """The run's return value (None until it completes)."""
        return decode(self.result)


class WorkflowStep(models.Model):
    """One journal entry: a durable operation of a run, keyed by its position ``seq``."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steps")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    name = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=StepStatus.choices)
    result = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    # Why a failed step failed (application, timeout, ...), "cancellation" for a branch that lost a race;
    # empty for the others.
    failure_category = models.CharField(max_length=16, choices=FailureCategory.choices, blank=True, default="",
                                        db_default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("workflow step")
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="weft_step_unique_seq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.name} ({self.status})"

    @property
    def decoded_result(self) -> Any:
        """The step's recorded result (an activity's return value, a side effect's value...)."""
        return decode(self.result)


class StepAttempt(models.Model):
    """One attempt of an activity step that took more than one: a failed attempt that was retried, an attempt
    lost with its executor (the run was taken over after its lease expired), and the attempt that ended the
    step. A step that finished on its first attempt has none (its row says it all), so recording them costs
    the common case nothing; errors of earlier attempts stay visible here after the step succeeds."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="attempts")
    seq = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    error = models.JSONField(null=True, blank=True)
    executor = models.CharField(max_length=255, blank=True, help_text=_("The executor that ran it."))
    # Unknown for a lost attempt: its executor died without saying when it began.
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(help_text=_("When it ended, or, for a lost attempt, when the loss was found."))

    class Meta:
        verbose_name = _("step attempt")
        ordering = ["run", "seq", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq", "attempt"], name="weft_attempt_unique"),
        ]

    def __str__(self) -> str:
        return f"step {self.seq} attempt {self.attempt} ({self.outcome})"


class Timer(models.Model):
    """A durable timer a run waits on. The run's ``runnable_at`` carries the wake-up; this row says why."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="timers")
    seq = models.PositiveIntegerField(null=True, blank=True, help_text=_("Journal position it belongs to."))
    purpose = models.CharField(max_length=16, choices=TimerPurpose.choices)
    fire_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("timer")
        ordering = ["fire_at"]
        indexes = [
            models.Index(fields=["fire_at"], condition=Q(fired_at__isnull=True), name="weft_due_timer_idx"),
            models.Index(fields=["run", "seq"], name="weft_timer_run_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} at {self.fire_at:%Y-%m-%d %H:%M:%S}"


class Signal(models.Model):
    """A signal delivered to a run; buffered until the workflow consumes it, in arrival order."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="signals")
    name = IdentifierField(max_length=255)
    payload = models.BinaryField(null=True, blank=True)
    # NULL, not "", means "no id": the unique constraint below then ignores the row (NULLs are distinct).
    signal_id = IdentifierField(max_length=128, null=True, blank=True,
                                 help_text=_("Sender's deduplication id; unique per run and name."))
    sequence = models.BigIntegerField(help_text=_("Arrival order within the run."))
    received_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by_seq = models.PositiveIntegerField(null=True, blank=True)
    trace_context = models.JSONField(null=True, blank=True, help_text=_("The sender's W3C trace context."))

    class Meta:
        verbose_name = _("signal")
        ordering = ["run", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name", "signal_id"], name="weft_signal_unique_id"),
            models.UniqueConstraint(fields=["run", "sequence"], name="weft_signal_unique_sequence"),
        ]
        indexes = [
            models.Index(fields=["run", "name", "sequence"], condition=Q(consumed_at__isnull=True),
                         name="weft_pending_signal_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.sequence}"

    @property
    def decoded_payload(self) -> Any:
        return decode(self.payload)


class AsyncActivity(models.Model):
    """An activity attempt parked until an outside system completes it with its task token."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="async_activities")
    seq = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    activity = models.CharField(max_length=255)
    token = IdentifierField(max_length=512, unique=True)
    status = models.CharField(max_length=16, choices=AsyncStatus.choices, default=AsyncStatus.PENDING)
    result = models.BinaryField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("async activity")
        verbose_name_plural = _("async activities")
        ordering = ["run", "seq", "attempt"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq", "attempt"], name="weft_async_unique_attempt"),
        ]
        indexes = [
            models.Index(fields=["run", "seq"], name="weft_async_run_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.activity} step {self.seq} attempt {self.attempt} ({self.status})"

    @property
    def decoded_result(self) -> Any:
        """The result the outside system completed the activity with (None until then)."""
        return decode(self.result)
