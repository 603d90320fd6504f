"""The schedule admin: create and edit through the engine's API; pause, resume, trigger, cancel."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import Operation, OperationsMixin, PayloadPrivacyMixin, badge, moment, pre, pretty
from django_weft.admin.describe import describe_cron, describe_interval
from django_weft.admin.forms import SETTINGS_NOTE, ScheduleForm, defined_in_settings
from django_weft.exceptions import WeftError
from django_weft.models import Schedule, ScheduleOccurrence, ScheduleStatus
from django_weft.services import schedules

PREVIEW_COUNT = 10
RECENT_OCCURRENCES = 50


def describe(schedule: Schedule) -> str:
    if schedule.cron:
        return describe_cron(schedule.cron) or _t("custom cron expression")
    if schedule.every is not None:
        return describe_interval(schedule.every)
    return "—"


def _local(moment: datetime | None, zone: str) -> str:
    if moment is None:
        return "—"
    try:
        local = moment.astimezone(ZoneInfo(zone))
    except Exception:
        local = moment
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def _who(request: HttpRequest) -> str:
    return f"by {request.user.get_username()} in the admin"


def _pause(request: HttpRequest, schedule: Schedule) -> str:
    schedules.pause(schedule, f"paused {_who(request)}")
    return ""


def _resume(request: HttpRequest, schedule: Schedule) -> str:
    schedules.resume(schedule)
    return ""


def _trigger(request: HttpRequest, schedule: Schedule) -> str:
    run = schedules.trigger(schedule)
    if run is None:
        return _t("%(schedule)s: no run started (overlap policy %(policy)s).") % {
            "schedule": schedule.schedule_id, "policy": schedule.overlap}
    return _t("%(schedule)s started run %(run)s.") % {"schedule": schedule.schedule_id, "run": run.pk}


def _cancel(request: HttpRequest, schedule: Schedule) -> str:
    schedules.cancel(schedule)
    return ""


SCHEDULE_OPERATIONS = {
    "pause": Operation("pause", _("Pause"), _("paused"), "operate",
                       lambda qs: qs.filter(status=ScheduleStatus.ACTIVE), _pause,
                       explanation=_("Paused schedules start no runs until resumed; buffered occurrences are "
                                     "dropped.")),
    "resume": Operation("resume", _("Resume"), _("resumed"), "operate",
                        lambda qs: qs.filter(status=ScheduleStatus.PAUSED), _resume,
                        explanation=_("Resumed schedules fire from their next occurrence; the paused window is "
                                      "not caught up.")),
    "trigger": Operation("trigger", _("Trigger now"), _("triggered"), "operate",
                         lambda qs: qs.exclude(status=ScheduleStatus.CANCELLED), _trigger,
                         explanation=_("Each schedule fires once now, as an extra occurrence under its overlap "
                                       "policy.")),
    "cancel": Operation("cancel", _("Cancel"), _("cancelled"), "operate",
                        lambda qs: qs.exclude(status=ScheduleStatus.CANCELLED), _cancel,
                        explanation=_("Cancelled schedules never fire again; their record and history stay."),
                        destructive=True),
}


@admin.register(Schedule)
class ScheduleAdmin(PayloadPrivacyMixin, OperationsMixin, admin.ModelAdmin):
    class Media:
        css = {"all": ("django_weft/admin.css",)}  # cells wrap: the list fits the screen

    operations = SCHEDULE_OPERATIONS
    form = ScheduleForm
    list_display = ("schedule_id", "workflow_type", "spec", "timezone", "status_badge", "next_fire_shown",
                    "last_fire_shown", "missed_shown", "overlap")
    list_filter = ("status", "overlap", "workflow_type")
    search_fields = ("=schedule_id", "workflow_type")
    show_full_result_count = False
    actions = ("pause_selected", "resume_selected", "trigger_selected", "cancel_selected")
    change_form_template = "admin/django_weft/schedule/change_form.html"
    cadence_fields = ("cron", "every", "timezone", "description", "overlap", "backfill_missed", "catchup_window",
                      "jitter", "start_at", "end_at", "queue", "priority", "pause_on_failure")
    state_fields = ("status_badge", "note", "next_fire_local", "last_fire_local", "missed_fire_count",
                    "last_missed_fire_at", "queued_runs", "current_run_link", "from_settings", "created_at",
                    "updated_at")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return self.has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cancel instead: runs and history keep pointing at the schedule

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # WEFT_SCHEDULES owns every field of its schedules: the next sync would silently revert an edit made
        # here, so their page is view-only (the operations, pause and trigger among them, stay available).
        if obj is not None and defined_in_settings(obj.schedule_id):
            return False
        return super().has_change_permission(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> tuple:
        if obj is not None and defined_in_settings(obj.schedule_id):
            # input_json too: a declared form field leaves the form only when it is listed here.
            return (*self._definition_fields(obj), "input_json", *self.cadence_fields, *self.state_fields,
                    "upcoming", "recent_occurrences")
        fixed = ("schedule_id", "workflow_type") if obj is not None else ()
        return (*fixed, "description", *self.state_fields, "upcoming", "recent_occurrences")

    @staticmethod
    def _definition_fields(obj: Schedule | None) -> tuple[str, ...]:
        from_settings = obj is not None and defined_in_settings(obj.schedule_id)
        return ("schedule_id", "workflow_type", "input_display" if from_settings else "input_json")

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> list:
        definition: dict[str, Any] = {"fields": self._definition_fields(obj)}
        if obj is not None and defined_in_settings(obj.schedule_id):
            definition["description"] = SETTINGS_NOTE  # at the top of the page, above every synced field
        head = [(None, definition), (_("Cadence"), {"fields": self.cadence_fields})]
        if obj is None:
            return head
        return [
            *head,
            (_("State"), {"fields": self.state_fields}),
            (_("Next occurrences"), {"fields": ("upcoming",)}),
            (_("Recent occurrences"), {"fields": ("recent_occurrences",)}),
        ]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        schedule = self.get_object(request, object_id)
        extra_context = dict(extra_context or {})
        if schedule is not None:
            extra_context["weft_buttons"] = self.available_operations(request, schedule)
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request: HttpRequest, obj: Schedule, form: ScheduleForm, change: bool) -> None:
        spec = form.spec
        assert spec is not None
        options: dict[str, Any] = {"cron": spec.cron or None, "every": spec.every, "timezone": spec.timezone,
                   "overlap": spec.overlap, "backfill": spec.backfill, "catchup_window": spec.catchup_window,
                   "jitter": spec.jitter, "start_at": spec.start_at, "end_at": spec.end_at,
                   "queue": spec.queue or None, "priority": spec.priority,
                   "pause_on_failure": spec.pause_on_failure}
        if not form.fields["input_json"].disabled:
            options["input"] = form.cleaned_data.get("input_json")
        if change:
            schedules.update(obj, **options)
            return
        created = schedules.create_schedule(obj.schedule_id, form.cleaned_data["workflow_type"],
                                            options.pop("input", None), **options)
        for field in Schedule._meta.concrete_fields:
            setattr(obj, field.attname, getattr(created, field.attname))
        obj._state.adding = False

    # --- actions ----------------------------------------------------------------------------------

    @admin.action(description=_("Pause selected schedules"), permissions=["operate"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "pause")

    @admin.action(description=_("Resume selected schedules"), permissions=["operate"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "resume")

    @admin.action(description=_("Trigger selected schedules now"), permissions=["operate"])
    def trigger_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "trigger")

    @admin.action(description=_("Cancel selected schedules"), permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "cancel")

    # --- fields -----------------------------------------------------------------------------------

    @admin.display(description=_("spec"))
    def spec(self, schedule: Schedule) -> str:
        text = schedule.cron or (f"every {schedule.every}" if schedule.every is not None else "—")
        return format_html("<code>{}</code><br><small>{}</small>", text, describe(schedule))

    @admin.display(description=_("input"))
    def input_display(self, schedule: Schedule) -> str:
        return pre(pretty(schedule.input))

    @admin.display(description=_("in words"))
    def description(self, schedule: Schedule) -> str:
        return describe(schedule)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, schedule: Schedule) -> str:
        return badge(schedule.status, schedule.get_status_display())

    # The list's columns: compact times (the admin's zone, named) and short headers, so that the list fits.
    @admin.display(description=_("next fire"), ordering="next_fire_at")
    def next_fire_shown(self, schedule: Schedule) -> str:
        return moment(schedule.next_fire_at)

    @admin.display(description=_("last fire"), ordering="last_fire_at")
    def last_fire_shown(self, schedule: Schedule) -> str:
        return moment(schedule.last_fire_at)

    @admin.display(description=_("missed"), ordering="missed_fire_count")
    def missed_shown(self, schedule: Schedule) -> int:
        return schedule.missed_fire_count

    @admin.display(description=_("next fire"))
    def next_fire_local(self, schedule: Schedule) -> str:
        return _local(schedule.next_fire_at, schedule.timezone)

    @admin.display(description=_("last fire"))
    def last_fire_local(self, schedule: Schedule) -> str:
        return _local(schedule.last_fire_at, schedule.timezone)

    @admin.display(description=_("queued occurrences"))
    def queued_runs(self, schedule: Schedule) -> int:
        return schedule.queued_runs

    @admin.display(description=_("current run"))
    def current_run_link(self, schedule: Schedule) -> str:
        if schedule.current_run_id is None:
            return "—"
        return format_html("<a href='{}'>{}</a>", reverse("admin:django_weft_workflow_change",
                                                         args=[schedule.current_run_id]), schedule.current_run)

    @admin.display(description=_("next occurrences"))
    def upcoming(self, schedule: Schedule) -> str:
        if schedule.status == ScheduleStatus.CANCELLED:
            return _t("none: the schedule is cancelled")
        try:
            moments = schedules.next_occurrences(schedule, PREVIEW_COUNT)
        except WeftError as exc:
            return str(exc)
        if not moments:
            return _t("none: the schedule has ended")
        note = _t(" (paused: none of these fires until it is resumed)") \
            if schedule.status == ScheduleStatus.PAUSED else ""
        items = format_html_join("", "<li>{}</li>", ((_local(m, schedule.timezone),) for m in moments))
        return format_html("<ol style='margin:0;padding-left:1.5em'>{}</ol>{}", items, note)

    @admin.display(description=_("recent occurrences"))
    def recent_occurrences(self, schedule: Schedule) -> str:
        rows = list(ScheduleOccurrence.objects.filter(schedule=schedule).select_related("run")
                    .order_by("-scheduled_for", "-id")[:RECENT_OCCURRENCES])
        if not rows:
            return "—"

        def run_cell(occurrence: ScheduleOccurrence) -> str:
            if occurrence.run_id is None:
                return "—"
            return format_html("<a href='{}'>{}</a>", reverse("admin:django_weft_workflow_change",
                                                             args=[occurrence.run_id]), occurrence.run_id)

        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (_local(o.scheduled_for, schedule.timezone), o.get_outcome_display(), o.count, run_cell(o),
             o.detail or "—") for o in rows))
        head = format_html("<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>", _t("occurrence"),
                           _t("outcome"), _t("count"), _t("run"), _t("detail"))
        return format_html("<table class='weft-occurrences'><thead>{}</thead><tbody>{}</tbody></table>", head, body)
