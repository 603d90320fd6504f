"""The run admin: browse runs and their journals; cancel, retry, suspend, resume, purge, signal, query, update,
complete."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.admin.bulk import bulk_context, bulk_urls
from django_weft.admin.common import (
    BoundedPaginator,
    Operation,
    OperationsMixin,
    PayloadPrivacyMixin,
    ReadOnlyMixin,
    badge,
    moment,
    pre,
    pretty,
    span,
)
from django_weft.admin.filters import LineageFilter, TagFilter, VersionFilter, attribute_filters, attribute_listing
from django_weft.admin.forms import AsyncCompletionForm, SignalForm, StepControlForm
from django_weft.admin.in_flight import in_flight_rows
from django_weft.admin.run_inlines import (
    AsyncActivityInline,
    EventInline,
    RunActionInline,
    SignalInline,
    StepAttemptInline,
    StreamEntryInline,
    TimerInline,
    WorkflowStepInline,
    hidden_token,
    may_complete_async,
)
from django_weft.admin.talk import UpdateInline, send_update_view, talk_panel
from django_weft.admin.timeline import build_timeline, journal_rows
from django_weft.common import clock
from django_weft.common.registry import registered_workflow_names
from django_weft.common.tokens import read_task_token
from django_weft.conf import weft_settings
from django_weft.exceptions import WeftError
from django_weft.models import (
    AsyncActivity,
    AsyncStatus,
    RunStatus,
    Workflow,
    WorkflowStep,
)
from django_weft.runtime.activities import complete_async_activity, fail_async_activity
from django_weft.services import liveness, step_controls
from django_weft.services.client import WorkflowHandle
from django_weft.services.maintenance import delete_finished_runs
from django_weft.store import repairs, transitions

if TYPE_CHECKING:
    pass

# Runs counted per status above the changelist; beyond it the count shows as "1000+".
STATUS_COUNT_CAP = 1000
# Children listed by name on a run's page.
MAX_CHILDREN_LISTED = 50


class WorkflowTypeFilter(admin.SimpleListFilter):
    """Workflow types from the registry: no SELECT DISTINCT over the runs table."""

    title = _("workflow type")
    parameter_name = "type"  # as the API's and weft_runs' filter is named
    # More types than this are offered in one select: a project with many types keeps a sidebar one screen tall.
    MAX_LINKS = 12

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if len(self.lookup_choices) > self.MAX_LINKS:
            self.template = "admin/django_weft/select_filter.html"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(registered_workflow_names())]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(workflow_type=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    """Queues from WEFT_QUEUES and the queues operators gave limits (QueueState): no SELECT DISTINCT over the runs
    table (70-110 ms at a million runs), and "default" for runs started on none, as ``--queues`` names them."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from django_weft.common.queues import NO_QUEUE, configured
        from django_weft.models import QueueState

        names = set(configured()) | set(QueueState.objects.values_list("name", flat=True))
        return [(NO_QUEUE, _t("%(name)s (no queue)") % {"name": NO_QUEUE}), *((n, n) for n in sorted(names))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        from django_weft.common.queues import NO_QUEUE

        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(queue="" if value == NO_QUEUE else value)


def _purge(request: HttpRequest, runs: list[Workflow]) -> list[Workflow]:
    """Delete finished runs with their journal, timers, signals and async records (as retention does)."""
    deleted = set(delete_finished_runs([r.pk for r in runs]))
    return [r for r in runs if r.pk in deleted]


def _who(request: HttpRequest) -> str:
    reason = " ".join(str(request.POST.get("reason", "")).split())[:500]
    return f"by {request.user.get_username()} in the admin" + (f": {reason}" if reason else "")


def _cancel(request: HttpRequest, run: Workflow) -> str:
    if not transitions.cancel(run.pk, clock.now(), f"cancelled {_who(request)}"):
        raise WeftError(_t("already finished"))
    return ""


def _retry(request: HttpRequest, run: Workflow) -> str:
    repairs.retry_failed(run.pk, clock.now())
    return ""


def _suspend(request: HttpRequest, run: Workflow) -> str:
    repairs.suspend(run.pk, clock.now(), f"suspended {_who(request)}")
    return ""


def _resume(request: HttpRequest, run: Workflow) -> str:
    repairs.resume(run.pk, clock.now())
    return ""


RUN_OPERATIONS = {
    "cancel": Operation(
        "cancel", _("Cancel"), _("cancelled"), "cancel", lambda qs: qs.open(), _cancel,
        explanation=_("Open runs end as cancelled; an executor holding one loses it. Finished runs are left "
                      "alone."), destructive=True, takes_reason=True),
    "retry": Operation(
        "retry", _("Retry"), _("retried"), "retry", lambda qs: qs.filter(status=RunStatus.FAILED), _retry,
        explanation=_("Failed runs run again from their failed step (which starts over at attempt 1); the "
                      "steps before it are kept and replay.")),
    "suspend": Operation(
        "suspend", _("Suspend"), _("suspended"), "suspend",
        lambda qs: qs.filter(status__in=[RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING]), _suspend,
        explanation=_("Nothing executes a suspended run until it is resumed; an executor holding it loses "
                      "it."), takes_reason=True),
    "resume": Operation(
        "resume", _("Resume"), _("resumed"), "suspend", lambda qs: qs.filter(status=RunStatus.SUSPENDED),
        _resume, explanation=_("Suspended runs become runnable and continue where they were.")),
    "purge": Operation(
        "purge", _("Purge"), _("purged"), "purge", lambda qs: qs.finished(), apply_many=_purge,
        explanation=_("Finished runs are deleted with their journal, timers, signals and async records. "
                      "Open runs are left alone. This cannot be undone."), destructive=True),
}


# The statuses each action of the list applies to: with a status filter, only the actions that apply are offered.
ACTION_STATUSES: dict[str, frozenset[str]] = {
    "cancel_selected": frozenset(RunStatus.open_values()),
    "retry_selected": frozenset({RunStatus.FAILED}),
    "suspend_selected": frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING}),
    "resume_selected": frozenset({RunStatus.SUSPENDED}),
    "purge_selected": frozenset(RunStatus.terminal_values()),
}


def filtered_statuses(request: HttpRequest) -> set[str] | None:
    """The statuses the changelist is filtered to (None: not filtered by status)."""
    chosen = [value for key in ("status__exact", "status") for value in request.GET.getlist(key)]
    chosen += [part for value in request.GET.getlist("status__in") for part in value.split(",")]
    return {value for value in chosen if value} or None


@admin.register(Workflow)
class WorkflowAdmin(PayloadPrivacyMixin, OperationsMixin, ReadOnlyMixin, admin.ModelAdmin):
    operations = RUN_OPERATIONS
    list_display = ("workflow_id", "workflow_type", "version", "status_badge", "started_shown", "updated_shown",
                    "duration", "parent_column", "schedule_link")
    list_filter = ("status", "failure_category", WorkflowTypeFilter, VersionFilter, TagFilter, QueueFilter, "schedule",
                   LineageFilter, "created_at")
    search_fields = ("=workflow_id", "=run_id", "=idempotency_key")
    search_help_text = _("An exact workflow id, run id or idempotency key; end it with * for the workflow ids that "
                         "start with it (order-*).")
    show_full_result_count = False  # no COUNT(*) over the whole table
    paginator = BoundedPaginator  # nor over a filter's matches: counted up to a cap
    list_per_page = 50
    list_select_related = ("schedule", "parent")
    actions = ("cancel_selected", "retry_selected", "suspend_selected", "resume_selected", "purge_selected")
    inlines = (WorkflowStepInline, StepAttemptInline, SignalInline, UpdateInline, EventInline, StreamEntryInline,
               AsyncActivityInline, TimerInline, RunActionInline)
    change_list_template = "admin/django_weft/workflow/change_list.html"
    change_form_template = "admin/django_weft/workflow/change_form.html"

    class Media:
        css = {"all": ("django_weft/admin.css",)}  # the status-count chips

    fieldsets = (
        (None, {"fields": ("workflow_id", "run_id", "workflow_type", "version", "status_badge", "wait_reason",
                           "failure_category", "termination_reason", "history_length")}),
        (_("Payloads"), {"fields": ("input_pretty", "result_pretty", "error_pretty")}),
        (_("Timing"), {"fields": ("created_shown", "started_shown", "updated_shown", "finished_shown", "duration",
                                  "runnable_shown", "execution_deadline_shown")}),
        (_("Lineage"), {"fields": ("parent_link", "children_links", "schedule_link", "scheduled_for",
                                   "restarted_from", "idempotency_key", "tags", "attributes_listing")}),
        (_("Execution"), {"fields": ("lease_owner", "fence", "awaiting_signals", "cancel_requested_at"),
                           "classes": ("collapse",)}),  # folded: the engine's bookkeeping, rarely what is wanted
        (_("Flow control"), {"fields": ("queue", "concurrency_key", "priority", "admit_at", "admitted_at"),
                              "classes": ("collapse",)}),
    )
    readonly_fields = ("workflow_id", "run_id", "workflow_type", "version", "status_badge", "wait_reason",
                       "failure_category", "termination_reason", "history_length", "input_pretty",
                       "result_pretty", "error_pretty", "created_shown", "started_shown", "updated_shown",
                       "finished_shown", "duration", "runnable_shown", "execution_deadline_shown", "parent_link",
                       "children_links", "schedule_link", "scheduled_for", "restarted_from", "idempotency_key",
                       "tags", "attributes_listing", "lease_owner", "fence", "awaiting_signals",
                       "cancel_requested_at", "queue", "concurrency_key", "priority", "admit_at", "admitted_at")

    # --- permissions ------------------------------------------------------------------------------

    def _has(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel_workflow")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "retry_workflow")

    def has_suspend_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "suspend_workflow")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "purge_workflow")

    def has_signal_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "signal_workflow")

    def has_complete_async_permission(self, request: HttpRequest) -> bool:
        """Completing or failing an async activity, and seeing the task tokens that would do it."""
        return may_complete_async(request)

    # --- queries ----------------------------------------------------------------------------------

    def get_list_filter(self, request: HttpRequest) -> Any:
        return (*self.list_filter, *attribute_filters())  # one per declared search attribute

    def get_queryset(self, request: HttpRequest) -> Any:
        # The changelist never needs the payloads.
        qs = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        if match and match.url_name and match.url_name.endswith("changelist"):
            qs = qs.defer("input", "result", "error", "search_attributes")
        return qs

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        statuses = filtered_statuses(request)
        if statuses is None or request.method != "GET":  # a POST carries the chosen action: leave them all
            return actions
        return {name: action for name, action in actions.items()
                if name not in ACTION_STATUSES or ACTION_STATUSES[name] & statuses}

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        # Links made before the type filter was named "type" still work.
        return lookup == "workflow_type" or super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        """Exact (case-sensitive) matches on the indexed ids; ``search_fields``' ``=`` would be ``UPPER() =``."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.endswith("*") and len(term) > 1:  # "order-*": the runs whose workflow id starts with "order-"
            return queryset.filter(workflow_id__startswith=term[:-1]), False
        match = Q(workflow_id=term) | Q(idempotency_key=term)
        try:
            match |= Q(run_id=uuid.UUID(term))
        except ValueError:
            pass
        return queryset.filter(match), False

    def status_counts(self, request: HttpRequest) -> list[dict]:
        """Runs per status, each count bounded (LIMIT) so a huge table costs no full COUNT(*)."""
        counts = []
        url = reverse("admin:django_weft_workflow_changelist")
        for value, label in RunStatus.choices:
            count = Workflow.objects.filter(status=value).order_by()[:STATUS_COUNT_CAP + 1].count()
            counts.append({"value": value, "label": label, "badge": badge(value, label),
                           "count": f"{STATUS_COUNT_CAP}+" if count > STATUS_COUNT_CAP else str(count),
                           "url": f"{url}?status__exact={value}"})
        return counts

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        extra_context = {**(extra_context or {}), "status_counts": self.status_counts(request),
                         **bulk_context(self, request)}
        if request.method == "GET":
            # Where a new user looks first: runs waiting for an executor that is not there.
            hint = liveness.stalled_hint()
            if hint:
                self.message_user(request, hint, messages.WARNING)
        return super().changelist_view(request, extra_context)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        extra_context = dict(extra_context or {})
        run = self.get_object(request, object_id)
        if run is not None:
            buttons = self.available_operations(request, run)
            if self.has_signal_permission(request) and not run.is_finished:
                buttons.append({"label": _("Send signal"), "name": "signal",
                                "url": reverse("admin:django_weft_workflow_signal", args=[run.pk])})
                buttons.append({"label": _("Send update"), "name": "update",
                                "url": reverse("admin:django_weft_workflow_update", args=[run.pk])})
            if (self.has_complete_async_permission(request) and not run.is_finished
                    and AsyncActivity.objects.filter(run=run, status=AsyncStatus.PENDING).exists()):
                buttons.append({"label": _("Complete or fail async activity"), "name": "async",
                                "url": reverse("admin:django_weft_workflow_async", args=[run.pk])})
            if self.has_retry_permission(request) and not run.is_finished:
                buttons.append({"label": _("Control a step"), "name": "step-control",
                                "url": reverse("admin:django_weft_workflow_step_control", args=[run.pk])})
            extra_context["weft_buttons"] = buttons
        return super().change_view(request, object_id, form_url, extra_context)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False,
                           change: bool = False, form_url: str = "", obj: Workflow | None = None) -> HttpResponse:
        if obj is not None:
            control_url = (reverse("admin:django_weft_workflow_step_control", args=[obj.pk])
                           if self.has_retry_permission(request) and not obj.is_finished else "")
            context["weft_in_flight"] = in_flight_rows(obj, control_url)  # first: what a stuck-looking run does
            # A run shown as running with nothing in flight looks stuck: say what it does.
            context["weft_in_flight_idle"] = obj.status == RunStatus.RUNNING and not context["weft_in_flight"]
        if obj is not None:  # the branch timeline, from the rows the journal inline loaded
            context["weft_timeline"] = build_timeline(obj, journal_rows(context, obj))
            # The Queries panel (read-only: whoever may view the run), and links to send updates.
            context["weft_talk"] = talk_panel(request, obj, context, may_send=self.has_signal_permission(request)
                                              and not obj.is_finished)
        return super().render_change_form(request, context, add, change, form_url, obj)

    # --- actions ----------------------------------------------------------------------------------

    @admin.action(description=_("Cancel selected runs"), permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "cancel")

    @admin.action(description=_("Retry selected failed runs from their failed step"), permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "retry")

    @admin.action(description=_("Suspend selected runs"), permissions=["suspend"])
    def suspend_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "suspend")

    @admin.action(description=_("Resume selected suspended runs"), permissions=["suspend"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "resume")

    @admin.action(description=_("Purge selected finished runs"), permissions=["purge"])
    def purge_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "purge")

    # --- signal, update and async completion forms ------------------------------------------------

    def get_urls(self) -> list:
        return [
            *bulk_urls(self),
            path("<path:object_id>/signal/", self.admin_site.admin_view(self.signal_view),
                 name="django_weft_workflow_signal"),
            path("<path:object_id>/async/", self.admin_site.admin_view(self.async_view),
                 name="django_weft_workflow_async"),
            path("<path:object_id>/update/", self.admin_site.admin_view(self.update_view),
                 name="django_weft_workflow_update"),
            path("<path:object_id>/step-control/", self.admin_site.admin_view(self.step_control_view),
                 name="django_weft_workflow_step_control"),
            *super().get_urls(),
        ]

    def _form_page(self, request: HttpRequest, run: Workflow, form: Any, title: str, extra: dict) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "title": title, "form": form, "run": run,
                   "opts": self.opts, "app_label": self.opts.app_label, "original": run, **extra}
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_weft/workflow/run_form.html", context)

    def _run_for_form(self, request: HttpRequest, object_id: str, *, allowed: bool) -> Workflow | HttpResponse:
        if not allowed:  # before the lookup: nothing about the run (not even whether it exists) without it
            raise PermissionDenied
        run = self.get_object(request, object_id)
        if run is None:
            return self.missing_object_redirect(request, object_id)
        return run

    def _back(self, run: Workflow) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:django_weft_workflow_change", args=[run.pk]))

    def signal_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run_for_form(request, object_id, allowed=self.has_signal_permission(request))
        if isinstance(run, HttpResponse):
            return run
        form = SignalForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                stored = WorkflowHandle(run.workflow_id, run.pk).signal(
                    data["name"], data["payload"], signal_id=data["signal_id"] or None)
            except WeftError as exc:
                form.add_error(None, str(exc))
            else:
                if stored:
                    note = _t("Signal %(name)r delivered.") % {"name": data["name"]}
                else:
                    note = _t("Signal %(name)r with id %(id)r was delivered before; stored once.") % {
                        "name": data["name"], "id": data["signal_id"]}
                self.log_change(request, run, f"{note} (signal id {data['signal_id'] or '—'})")
                self.message_user(request, note, messages.SUCCESS if stored else messages.WARNING)
                return self._back(run)
        return self._form_page(request, run, form, _t("Send a signal to %(run)s") % {"run": run.workflow_id},
                               {"submit_label": _t("Send signal")})

    def step_control_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """A step control on this run (fire now, reset attempts, pause, unpause, options): audited as a RunAction
        and in the admin's change log."""
        run = self._run_for_form(request, object_id, allowed=self.has_retry_permission(request))
        if isinstance(run, HttpResponse):
            return run
        form = StepControlForm(request.POST or None, initial={k: request.GET.get(k) for k in ("seq", "control")})
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            current = Workflow.objects.end_of_chain(run)
            try:
                if data["control"] == "set_activity_options":
                    given = {k: data[k] for k in form.RETRY if data.get(k) is not None}
                    retry = None
                    if given:
                        declared = step_controls.declared_retry(current, data["seq"])
                        retry = {**{k: getattr(declared, k) for k in step_controls.RETRY_FIELDS}, **given}
                    step_controls.set_activity_options(
                        current, data["seq"], retry=retry, timeout=data.get("timeout"),
                        schedule_to_close_timeout=data.get("schedule_to_close_timeout"),
                        requested_by=request.user.get_username())
                else:
                    step_controls.perform(current, data["control"], data["seq"],
                                          requested_by=request.user.get_username())
            except WeftError as exc:
                form.add_error(None, str(exc))
            else:
                labels = dict(StepControlForm.base_fields["control"].choices)  # type: ignore[attr-defined]
                note = _t("Step %(seq)s: %(control)s.") % {"seq": data["seq"], "control": labels[data["control"]]}
                self.log_change(request, run, note)
                self.message_user(request, note, messages.SUCCESS)
                return self._back(run)
        return self._form_page(request, run, form, _t("Control a step of %(run)s") % {"run": run.workflow_id},
                               {"submit_label": _t("Apply")})

    def update_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return send_update_view(self, request, object_id)

    def async_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run_for_form(request, object_id, allowed=self.has_complete_async_permission(request))
        if isinstance(run, HttpResponse):
            return run
        prefilled = self._prefilled_token(request, run)
        if not prefilled:  # one activity waits: its token is the one to use
            waiting = list(AsyncActivity.objects.filter(run=run, status=AsyncStatus.PENDING).values_list(
                "token", flat=True)[:2])
            prefilled = waiting[0] if len(waiting) == 1 else ""
        form = AsyncCompletionForm(request.POST or None, run=run, initial={"token": prefilled})
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                if data["outcome"] == "complete":
                    complete_async_activity(data["token"], data["result"])
                else:
                    fail_async_activity(data["token"], data["error_message"])
            except WeftError as exc:
                form.add_error("token", str(exc))
            else:
                verb = _t("completed") if data["outcome"] == "complete" else _t("failed")
                note = _t("Async activity step %(seq)s attempt %(attempt)s %(verb)s.") % {
                    "seq": form.seq, "attempt": form.attempt, "verb": verb}
                self.log_change(request, run, note)
                self.message_user(request, note, messages.SUCCESS)
                return self._back(run)
        pending = AsyncActivity.objects.filter(run=run, status=AsyncStatus.PENDING).order_by("seq", "attempt")
        return self._form_page(request, run, form,
                               _t("Complete or fail an async activity of %(run)s") % {"run": run.workflow_id},
                               {"submit_label": _t("Submit"), "pending_async": pending,
                                "show_tokens": self.has_complete_async_permission(request),
                                "hidden_token": hidden_token()})

    @staticmethod
    def _prefilled_token(request: HttpRequest, run: Workflow) -> str:
        """``?token=`` prefills the form only with a genuine token of this run; anything else is dropped,
        so the page never echoes an arbitrary string (and the prefill reveals nothing the user lacked)."""
        token = request.GET.get("token", "").strip()
        if not token:
            return ""
        try:
            run_id, _seq, _attempt = read_task_token(token)
        except WeftError:
            return ""
        return token if run_id == run.pk else ""

    # --- fields -----------------------------------------------------------------------------------

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, run: Workflow) -> str:
        shown = badge(run.status, run.get_status_display())
        if run.cancel_requested_at is not None and not run.is_finished:  # its code is cleaning up
            return format_html("{} {}", shown, badge("cancelled", _("cancel requested: cleaning up")))
        return shown

    @admin.display(description=_("history length"))
    def history_length(self, run: Workflow) -> str:
        """Journal rows, and the share of WEFT_MAX_HISTORY they use once it is worth saying."""
        rows = WorkflowStep.objects.filter(run=run).count()
        limit = weft_settings.MAX_HISTORY
        share = rows / limit if limit else 0
        return f"{rows} ({share:.0%} of WEFT_MAX_HISTORY)" if share >= 0.1 else str(rows)

    @admin.display(description=_("duration"))
    def duration(self, run: Workflow) -> str:
        return span(run.started_at, run.finished_at, open_ended=not run.is_finished)

    @admin.display(description=_("schedule"), ordering="schedule__schedule_id")
    def schedule_link(self, run: Workflow) -> str:
        if run.schedule_id is None:
            return "—"
        return format_html("<a href='{}'>{}</a>", reverse("admin:django_weft_schedule_change",
                                                         args=[run.schedule_id]), run.schedule)

    @admin.display(description=_("parent run"))
    def parent_link(self, run: Workflow) -> str:
        if run.parent_id is None:
            return "—"
        return format_html("<a href='{}'>{}</a>", reverse("admin:django_weft_workflow_change",
                                                         args=[run.parent_id]), run.parent)

    # The run's times to the second, in one labelled zone (admin.common.moment).
    @admin.display(description=_("created"))
    def created_shown(self, run: Workflow) -> str:
        return moment(run.created_at)

    @admin.display(description=_("started"), ordering="started_at")
    def started_shown(self, run: Workflow) -> str:
        return moment(run.started_at)

    @admin.display(description=_("updated"), ordering="updated_at")
    def updated_shown(self, run: Workflow) -> str:
        return moment(run.updated_at)

    @admin.display(description=_("finished"))
    def finished_shown(self, run: Workflow) -> str:
        return moment(run.finished_at)

    @admin.display(description=_("runnable at"))
    def runnable_shown(self, run: Workflow) -> str:
        return moment(run.runnable_at)

    @admin.display(description=_("execution deadline"))
    def execution_deadline_shown(self, run: Workflow) -> str:
        return moment(run.execution_deadline)

    @admin.display(description=_("parent"), ordering="parent__workflow_id")
    def parent_column(self, run: Workflow) -> str:
        """The parent's workflow id (what an operator knows it by), linked; "—" for a top-level run."""
        if run.parent_id is None or run.parent is None:
            return "—"
        return format_html("<a href='{}'>{}</a>", reverse("admin:django_weft_workflow_change", args=[run.parent_id]),
                           run.parent.workflow_id)

    @admin.display(description=_("children"))
    def children_links(self, run: Workflow) -> str:
        children = list(Workflow.objects.filter(parent=run).only("pk", "workflow_id", "workflow_type", "status")
                        .order_by("created_at")[:MAX_CHILDREN_LISTED + 1])
        if not children:
            return "—"
        links = format_html_join(
            mark_safe("<br>"), "<a href='{}'>{}</a> {}",
            ((reverse("admin:django_weft_workflow_change", args=[c.pk]), c.workflow_id,
              badge(c.status, c.get_status_display())) for c in children[:MAX_CHILDREN_LISTED]))
        if len(children) > MAX_CHILDREN_LISTED:
            links = format_html("{}<br>{}", links, _t("(more not shown)"))
        return links

    @admin.display(description=_("search attributes"))
    def attributes_listing(self, run: Workflow) -> str:
        return attribute_listing(run)

    @admin.display(description=_("input"))
    def input_pretty(self, run: Workflow) -> str:
        return pre(pretty(run.input))

    @admin.display(description=_("result"))
    def result_pretty(self, run: Workflow) -> str:
        return pre(pretty(run.result)) if run.result is not None else "—"

    @admin.display(description=_("error"))
    def error_pretty(self, run: Workflow) -> str:
        if not run.error:
            return "—"
        return pre(f"{run.error.get('type')}: {run.error.get('message')}\n\n{run.error.get('traceback', '')}")
