"""Read-only admin for runs: the engine owns every field, operators inspect.

Payloads are decoded from msgpack (which never executes anything) and shown escaped.
"""

from __future__ import annotations

import pprint
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from .codec import decode
from .models import AsyncActivity, Schedule, ScheduleOccurrence, Signal, Timer, Workflow, WorkflowStep

PREVIEW_CHARS = 120


def _pretty(data: bytes | None) -> str:
    try:
        value = decode(data)
    except Exception as exc:  # a payload this version cannot read is shown, not fatal
        return f"<undecodable payload: {exc}>"
    return pprint.pformat(value, width=100, sort_dicts=False)


def _pre(text: str) -> str:
    return format_html("<pre style='white-space: pre-wrap; margin: 0'>{}</pre>", text)


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WorkflowStepInline(ReadOnlyMixin, admin.TabularInline):
    model = WorkflowStep
    extra = 0
    can_delete = False
    fields = ("seq", "kind", "name", "status", "attempt", "started_at", "finished_at", "result_preview",
              "error_message")
    readonly_fields = fields
    ordering = ("seq",)

    @admin.display(description=_("result"))
    def result_preview(self, step: WorkflowStep) -> str:
        if step.result is None:
            return "—"
        text = _pretty(step.result)
        return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"

    @admin.display(description=_("error"))
    def error_message(self, step: WorkflowStep) -> str:
        return f"{step.error.get('type')}: {step.error.get('message')}" if step.error else "—"


class TimerInline(ReadOnlyMixin, admin.TabularInline):
    model = Timer
    extra = 0
    can_delete = False
    fields = ("seq", "purpose", "fire_at", "fired_at")
    readonly_fields = fields


class SignalInline(ReadOnlyMixin, admin.TabularInline):
    model = Signal
    extra = 0
    can_delete = False
    fields = ("sequence", "name", "signal_id", "payload_preview", "received_at", "consumed_at", "consumed_by_seq")
    readonly_fields = fields
    ordering = ("sequence",)

    @admin.display(description=_("payload"))
    def payload_preview(self, signal: Signal) -> str:
        text = _pretty(signal.payload)
        return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


class AsyncActivityInline(ReadOnlyMixin, admin.TabularInline):
    model = AsyncActivity
    extra = 0
    can_delete = False
    fields = ("seq", "attempt", "activity", "status", "token", "created_at", "resolved_at")
    readonly_fields = fields


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("workflow_id", "workflow_type", "status", "created_at", "updated_at", "finished_at")
    list_filter = ("status", "workflow_type", "created_at")
    search_fields = ("=workflow_id", "=run_id", "=idempotency_key")
    date_hierarchy = None
    show_full_result_count = False  # no COUNT(*) over the whole table
    list_per_page = 50
    inlines = (WorkflowStepInline, SignalInline, AsyncActivityInline, TimerInline)
    fieldsets = (
        (None, {"fields": ("workflow_id", "run_id", "workflow_type", "status", "wait_reason")}),
        (_("Payloads"), {"fields": ("input_pretty", "result_pretty", "error_pretty")}),
        (_("Timing"), {"fields": ("created_at", "started_at", "updated_at", "finished_at", "runnable_at",
                                  "execution_deadline")}),
        (_("Identity and lineage"), {"fields": ("idempotency_key", "parent", "restarted_from", "tags",
                                               "search_attributes")}),
        (_("Execution"), {"fields": ("lease_owner", "fence")}),
    )
    readonly_fields = ("workflow_id", "run_id", "workflow_type", "status", "wait_reason", "input_pretty",
                       "result_pretty", "error_pretty", "created_at", "started_at", "updated_at",
                       "finished_at", "runnable_at", "execution_deadline", "idempotency_key", "parent",
                       "restarted_from", "tags", "search_attributes", "lease_owner", "fence")

    def get_queryset(self, request: HttpRequest) -> Any:
        # The changelist never needs the payloads.
        qs = super().get_queryset(request)
        if getattr(request, "resolver_match", None) and request.resolver_match.url_name.endswith("changelist"):
            qs = qs.defer("input", "result", "error", "search_attributes")
        return qs

    @admin.display(description=_("input"))
    def input_pretty(self, run: Workflow) -> str:
        return _pre(_pretty(run.input))

    @admin.display(description=_("result"))
    def result_pretty(self, run: Workflow) -> str:
        return _pre(_pretty(run.result)) if run.result is not None else "—"

    @admin.display(description=_("error"))
    def error_pretty(self, run: Workflow) -> str:
        if not run.error:
            return "—"
        return _pre(f"{run.error.get('type')}: {run.error.get('message')}\n\n{run.error.get('traceback', '')}")


class ScheduleOccurrenceInline(ReadOnlyMixin, admin.TabularInline):
    model = ScheduleOccurrence
    extra = 0
    can_delete = False
    fields = ("scheduled_for", "outcome", "count", "run", "detail", "decided_at")
    readonly_fields = fields
    ordering = ("-scheduled_for", "-id")
    max_num = 0

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("run")


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("schedule_id", "workflow_type", "cron", "every", "timezone", "status", "next_fire_at",
                    "last_fire_at", "missed_fire_count", "overlap")
    list_filter = ("status", "overlap", "workflow_type")
    search_fields = ("=schedule_id", "workflow_type")
    show_full_result_count = False
    inlines = (ScheduleOccurrenceInline,)
    readonly_fields = [f.name for f in Schedule._meta.concrete_fields if f.name not in ("id", "input")]
    exclude = ("input",)
