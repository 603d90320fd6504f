"""The queue admin: each queue's backlog, admitted runs, limits and oldest wait, its limits changed at run time;
and the paused workflow types (adding one pauses the type, deleting it resumes it)."""

from __future__ import annotations

import threading
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from django_weft.common import queues
from django_weft.exceptions import InvalidArgument, WeftError
from django_weft.models import PausedType, QueueState
from django_weft.services import queues as queue_service

NO_LIMIT = "none"
_page = threading.local()


class LimitsForm(forms.ModelForm):
    """Each limit: empty keeps the setting's, "none" removes it, else the value (a count, or "N/s|m|h")."""

    concurrency = forms.CharField(required=False, help_text=_('Empty: the setting\'s. "none": no limit.'))
    concurrency_per_key = forms.CharField(required=False)
    rate = forms.CharField(required=False, help_text=_('"50/s", "100/m", "1000/h".'))
    rate_per_key = forms.CharField(required=False)

    class Meta:
        model = QueueState
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key, value in (self.instance.overrides or {}).items():
            if key in self.fields:
                self.initial[key] = NO_LIMIT if value is None else value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        overrides: dict[str, Any] = {}
        for key in queues.LIMIT_KEYS:
            text = (data.get(key) or "").strip()
            if not text:
                continue
            if text.lower() == NO_LIMIT:
                overrides[key] = None
            elif key.startswith("concurrency"):
                overrides[key] = int(text) if text.isdigit() else text
            else:
                overrides[key] = text
        try:
            queues.check_limits(overrides, "the limits")
        except InvalidArgument as exc:
            raise forms.ValidationError(str(exc)) from None
        data["overrides"] = overrides
        return data


@admin.register(QueueState)
class QueueStateAdmin(admin.ModelAdmin):
    class Media:
        css = {"all": ("django_weft/admin.css",)}  # cells wrap: the list fits the screen

    form = LimitsForm
    list_display = ("name", "backlog", "ready", "admitted", "limits", "oldest_wait", "rate_limited_now",
                    "admitted_total")
    fields = ("name", "in_force", "concurrency", "concurrency_per_key", "rate", "rate_per_key")
    readonly_fields = ("name", "in_force")
    actions = None

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # A queue of WEFT_QUEUES has its row from its first admission pass on; the list shows it before that too.
        for name in queues.configured():
            QueueState.objects.get_or_create(name=name)
        return super().get_queryset(request).filter(name__in=queue_service.queue_names())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a queue is declared in WEFT_QUEUES

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _info(self, obj: QueueState) -> queue_service.QueueInfo:
        # Read once per queue and page (the admin is shared by the threads serving requests: a local per thread).
        cache: dict[str, queue_service.QueueInfo] = getattr(_page, "infos", {})
        if obj.name not in cache:
            cache[obj.name] = queue_service.queue_info(obj.name)
            _page.infos = cache
        return cache[obj.name]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        _page.infos = {}
        try:
            return super().changelist_view(request, extra_context)
        finally:
            _page.infos = {}

    @admin.display(description=_("queued"))
    def backlog(self, obj: QueueState) -> int:
        return self._info(obj).backlog

    @admin.display(description=_("ready"))
    def ready(self, obj: QueueState) -> int:
        return self._info(obj).ready

    @admin.display(description=_("admitted (open)"))
    def admitted(self, obj: QueueState) -> Any:
        info = self._info(obj)
        url = reverse("admin:django_weft_workflow_changelist")
        return format_html('<a href="{}?queue={}">{}</a>', url, obj.name, info.admitted)

    @admin.display(description=_("limits"))
    def limits(self, obj: QueueState) -> str:
        shown = {k: v for k, v in self._info(obj).limits.items() if v is not None}
        return ", ".join(f"{k}={v}" for k, v in shown.items()) or "—"

    in_force = limits

    @admin.display(description=_("oldest wait"))
    def oldest_wait(self, obj: QueueState) -> str:
        seconds = self._info(obj).oldest_wait_seconds
        return "—" if seconds is None else f"{seconds:.0f}s"

    @admin.display(description=_("rate-limited"))
    def rate_limited_now(self, obj: QueueState) -> int:
        return obj.rate_limited

    def save_model(self, request: HttpRequest, obj: QueueState, form: Any, change: bool) -> None:
        queue_service.set_queue_limits(obj.name, **form.cleaned_data["overrides"])
        messages.info(request, _("The limits of %(name)s are in force from now on.") % {"name": obj.name})


class PauseForm(forms.ModelForm):
    class Meta:
        model = PausedType
        fields = ["workflow_type", "reason"]

    def clean_workflow_type(self) -> str:
        try:
            return queue_service.type_name(self.cleaned_data["workflow_type"])
        except WeftError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(PausedType)
class PausedTypeAdmin(admin.ModelAdmin):
    form = PauseForm
    list_display = ("workflow_type", "paused_at", "reason")
    fields = ("workflow_type", "reason")
    actions = None

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("workflow_type", "paused_at") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: PausedType, form: Any, change: bool) -> None:
        if change:
            PausedType.objects.filter(pk=obj.pk).update(reason=obj.reason)
            return
        queue_service.pause_type(obj.workflow_type, obj.reason)

    def delete_model(self, request: HttpRequest, obj: PausedType) -> None:
        queue_service.resume_type(obj.workflow_type)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for paused in queryset:
            queue_service.resume_type(paused.workflow_type)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"workflow_type": request.GET.get("workflow_type", "")}
