"""The run page's inlines: its journal, timers, signals and async activities (tokens only for those who may
complete them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import (
    ReadOnlyInline,
    badge,
    choice_label,
    moment,
    preview,
    span,
)
from django_weft.common.positions import position_label
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    AttemptOutcome,
    RunAction,
    Signal,
    StepAttempt,
    StepStatus,
    StreamEntry,
    Timer,
    TimerPurpose,
    Workflow,
    WorkflowEvent,
    WorkflowStep,
)

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# Runs counted per status above the changelist; beyond it the count shows as "1000+".
STATUS_COUNT_CAP = 1000
# Children listed by name on a run's page.
MAX_CHILDREN_LISTED = 50


class PositionColumn:
    """A "step" column: the journal position as people read it (a branch's rows as "3.2", not 1000150002)."""

    @admin.display(description=_("step"), ordering="seq")
    def position(self, row: Any) -> str:
        return "—" if row.seq is None else position_label(row.seq)  # an action on the run as a whole has no step


class WorkflowStepInline(PositionColumn, ReadOnlyInline):
    model = WorkflowStep
    verbose_name = _("journal step")
    verbose_name_plural = _("journal (timeline)")
    fields = ("position", "kind", "name", "status_badge", "failure_category", "attempts", "started", "duration",
              "result_preview", "error_message")
    readonly_fields = fields
    ordering = ("seq",)

    @admin.display(description=_("status"))
    def status_badge(self, step: WorkflowStep) -> str:
        return badge(step.status, choice_label(StepStatus, step.status))

    @admin.display(description=_("attempt"))
    def attempts(self, step: WorkflowStep) -> str:
        """A step that took more than one attempt links to its rows in the attempt history (StepAttemptInline)."""
        if step.attempt <= 1:
            return str(step.attempt)
        return format_html('{} <a href="#weft-attempts-{}" title="{}">{}</a>', step.attempt, step.seq,
                           _t("Each attempt's start, end, outcome and error"), _t("history"))

    @admin.display(description=_("started"))
    def started(self, step: WorkflowStep) -> str:
        return moment(step.started_at, milliseconds=True)

    @admin.display(description=_("duration"))
    def duration(self, step: WorkflowStep) -> str:
        return span(step.started_at, step.finished_at)

    @admin.display(description=_("result"))
    def result_preview(self, step: WorkflowStep) -> str:
        return preview(step.result)

    @admin.display(description=_("error"))
    def error_message(self, step: WorkflowStep) -> str:
        return f"{step.error.get('type')}: {step.error.get('message')}" if step.error else "—"


# Why a timer of each purpose is cleared without firing.
CLEARED_BECAUSE: dict[str, StrOrPromise] = {
    TimerPurpose.WAIT_TIMEOUT: _("the signal arrived first"),
    TimerPurpose.ACTIVITY_TIMEOUT: _("the activity was completed or failed first"),
}


class TimerInline(PositionColumn, ReadOnlyInline):
    """A run's timers. The engine stamps ``fired_at`` both when a timer fires and when what it guarded came
    first (the signal arrived, the async activity was resolved), so the outcome column tells the two apart."""

    model = Timer
    fields = ("position", "purpose", "fire_at", "outcome")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        step = WorkflowStep.objects.filter(run_id=OuterRef("run_id"), seq=OuterRef("seq"))
        # Still in the one query of the inline: what the timer's step became, and whether its async attempt
        # timed out.
        return super().get_queryset(request).annotate(
            weft_step_status=Subquery(step.values("status")[:1]),
            weft_step_started_at=Subquery(step.values("started_at")[:1]),
            weft_async_timed_out=Exists(AsyncActivity.objects.filter(
                run_id=OuterRef("run_id"), seq=OuterRef("seq"), status=AsyncStatus.TIMED_OUT)),
            # An async activity's deadline moved on by a heartbeat: the timer fired and a later one replaced it.
            weft_renewed=Exists(Timer.objects.filter(
                run_id=OuterRef("run_id"), seq=OuterRef("seq"), purpose=TimerPurpose.ACTIVITY_TIMEOUT,
                pk__gt=OuterRef("pk"))),
        )

    @staticmethod
    def cleared(timer: Timer) -> bool:
        """Whether a stamped timer was cleared (what it guarded came first) rather than fired."""
        assert timer.fired_at is not None
        if timer.fired_at < timer.fire_at:  # nothing fires before it is due
            return True
        if timer.purpose == TimerPurpose.WAIT_TIMEOUT:
            # A late signal still wins if it is there when the run wakes: the wait completed instead of
            # failing. (A wait started after this timer's time is a retried run's new wait, not this one's.)
            started = getattr(timer, "weft_step_started_at", None)
            return (getattr(timer, "weft_step_status", None) == StepStatus.COMPLETED and started is not None
                    and started < timer.fire_at)
        if timer.purpose == TimerPurpose.ACTIVITY_TIMEOUT:
            return not getattr(timer, "weft_async_timed_out", False)
        return False

    @admin.display(description=_("outcome"))
    def outcome(self, timer: Timer) -> str:
        if timer.fired_at is None:
            return _t("pending")
        at = moment(timer.fired_at)
        if timer.purpose == TimerPurpose.ACTIVITY_TIMEOUT and getattr(timer, "weft_renewed", False) and \
                timer.fired_at >= timer.fire_at:
            return _t("renewed at %(moment)s: a heartbeat came in time") % {"moment": at}
        if not self.cleared(timer):
            return _t("fired at %(moment)s") % {"moment": at}
        why = CLEARED_BECAUSE.get(timer.purpose)
        if why is None:
            return _t("cleared at %(moment)s") % {"moment": at}
        return _t("cleared at %(moment)s: %(why)s") % {"moment": at, "why": why}


class StepAttemptInline(PositionColumn, ReadOnlyInline):
    """The attempts of the steps that took more than one (failed and retried, lost with their executor): an
    error stays visible here after its step succeeded, and a lost attempt says a side effect may have run twice."""

    model = StepAttempt
    verbose_name = _("step attempt")
    verbose_name_plural = _("attempt history (steps that took more than one attempt)")
    fields = ("anchored_position", "attempt", "outcome_badge", "executor", "started_at", "finished_at", "error_message")
    readonly_fields = fields
    ordering = ("seq", "attempt")

    @admin.display(description=_("step"), ordering="seq")
    def anchored_position(self, row: StepAttempt) -> str:
        """The first attempt of a step is where the journal's "history" link lands."""
        if row.attempt != 1:
            return self.position(row)
        return format_html('<span id="weft-attempts-{}">{}</span>', row.seq, self.position(row))

    @admin.display(description=_("outcome"))
    def outcome_badge(self, row: StepAttempt) -> str:
        return badge(row.outcome, choice_label(AttemptOutcome, row.outcome))

    @admin.display(description=_("error"))
    def error_message(self, row: StepAttempt) -> str:
        return f"{row.error.get('type')}: {row.error.get('message')}" if row.error else "—"


class SignalInline(ReadOnlyInline):
    model = Signal
    fields = ("sequence", "name", "signal_id", "payload_preview", "received_at", "consumed_at", "consumed_by_seq")
    readonly_fields = fields
    ordering = ("sequence",)

    @admin.display(description=_("payload"))
    def payload_preview(self, signal: Signal) -> str:
        return preview(signal.payload)


class EventInline(PositionColumn, ReadOnlyInline):
    """What the run published with ctx.set_event: each key's latest value."""

    model = WorkflowEvent
    verbose_name = _("event")
    verbose_name_plural = _("events (latest value per key)")
    fields = ("key", "value_preview", "position", "set_at")
    readonly_fields = fields
    ordering = ("key",)

    @admin.display(description=_("value"))
    def value_preview(self, event: WorkflowEvent) -> str:
        return preview(event.value)


class StreamEntryInline(PositionColumn, ReadOnlyInline):
    """What the run wrote with ctx.write_stream, in order (a closed stream ends with its close)."""

    model = StreamEntry
    verbose_name = _("stream entry")
    verbose_name_plural = _("streams")
    fields = ("key", "value_preview", "position", "written_at")
    readonly_fields = fields
    ordering = ("key", "id")

    @admin.display(description=_("value"))
    def value_preview(self, entry: StreamEntry) -> str:
        return _t("(stream closed)") if entry.closed else preview(entry.value)


class RunActionInline(PositionColumn, ReadOnlyInline):
    """What operators did to the run's steps (step controls), newest last."""

    model = RunAction
    verbose_name = _("operator action")
    verbose_name_plural = _("operator actions on steps")
    fields = ("at", "position", "action", "requested_by", "detail")
    readonly_fields = fields
    ordering = ("at", "id")


# A task token is a bearer credential: POSTed to the completion webhook it completes (or fails) its
# activity. So the admin shows tokens only to users who may complete async activities in the admin
# anyway, with the permission the "complete or fail an async activity" form requires.
COMPLETE_ASYNC_PERMISSION = "signal_workflow"


def may_complete_async(request: HttpRequest) -> bool:
    return request.user.has_perm(f"{Workflow._meta.app_label}.{COMPLETE_ASYNC_PERMISSION}")


def hidden_token() -> str:
    """What users without the permission see instead of a task token."""
    perm = f"{Workflow._meta.app_label}.{COMPLETE_ASYNC_PERMISSION}"
    return format_html("<span class='weft-token-hidden' title='{}'>{}</span>",
                       _t("Task tokens complete async activities; they are shown only to users who may do so."),
                       _t("hidden — needs the %(permission)s permission") % {"permission": perm})


class AsyncActivityInline(PositionColumn, ReadOnlyInline):
    model = AsyncActivity
    fields = ("position", "attempt", "activity", "status", "token_copy", "created_at", "resolved_at")
    readonly_fields = (*fields, "token_hidden")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if may_complete_async(request):
            return self.fields
        return tuple("token_hidden" if name == "token_copy" else name for name in self.fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.get_fields(request, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        return qs if may_complete_async(request) else qs.defer("token")

    @admin.display(description=_("task token"))
    def token_copy(self, record: AsyncActivity) -> str:
        # A read-only input: select-all and copy, without the token wrapping mid-way.
        return format_html("<input type='text' readonly value='{}' size='40' onclick='this.select()' "
                           "class='weft-token' aria-label='task token'>", record.token)

    @admin.display(description=_("task token"))
    def token_hidden(self, record: AsyncActivity) -> str:
        return hidden_token()
