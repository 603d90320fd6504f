"""Shared admin pieces: payload rendering, read-only bases, and confirmed operations.

Payloads are decoded from msgpack (which never executes anything) and always rendered escaped.
An *operation* (cancel, retry, pause, ...) is one engine call per selected object. It is offered both
as a changelist action and as a button on the detail page, and both go through the same confirmation
page, permission check, outcome message and ``LogEntry``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import capfirst
from django.utils.translation import gettext as _t
from django.utils.translation import ngettext

from django_weft.common import clock, privacy
from django_weft.common.codec import decode
from django_weft.common.jsonable import as_json
from django_weft.exceptions import WeftError

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    # The mixins below are only ever mixed into ModelAdmins: type-check them as one.
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = object

PREVIEW_CHARS = 120
# Objects one action submission processes (the rest are left alone and the message says so).
MAX_OBJECTS_PER_OPERATION = 1000
# Objects a confirmation page lists by name.
MAX_LISTED = 100
# Rows a read-only inline (a run's journal, signals, ...) shows on the detail page: the first ones.
MAX_INLINE_ROWS = 1000


def pretty(data: bytes | memoryview | None) -> str:
    if not privacy.visible():
        return privacy.HIDDEN  # the user lacks django_weft.view_payloads
    try:
        value = decode(data)
    except Exception as exc:  # a payload this version cannot read is shown, not fatal
        return f"<undecodable payload: {exc}>"
    return pretty_value(value)


def pretty_value(value: object) -> str:
    """A decoded value as JSON text, indented: the text the API answers and accepts, never Python's repr (plain
    text: render it escaped, e.g. with :func:`pre`). A value nested deeper than MAX_DEPTH is shown cut there."""
    if not privacy.visible():
        return privacy.HIDDEN
    return json.dumps(as_json(value), indent=2, ensure_ascii=False)


def preview(data: bytes | memoryview | None) -> str:
    if data is None:
        return "—"
    text = pretty(data)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def moment(value: datetime | None, *, milliseconds: bool = False) -> str:
    """A time to the second (to the millisecond for steps) in the admin's time zone, which it names: one format
    and one zone on every page of a run, never "7:30 a.m."."""
    if value is None:
        return "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    if milliseconds:
        text += f".{local.microsecond // 1000:03d}"
    return f"{text} {local.tzname() or ''}".strip()


def pre(text: str) -> str:
    return format_html("<pre style='white-space: pre-wrap; margin: 0'>{}</pre>", text)


def human_duration(delta: timedelta | None) -> str:
    if delta is None:
        return "—"
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else "",
             f"{secs}s" if secs and not days else ""]
    return " ".join(p for p in parts if p)


def span(start: datetime | None, end: datetime | None, *, open_ended: bool = False) -> str:
    if start is None:
        return "—"
    if end is None:
        return human_duration(clock.now() - start) + " so far" if open_ended else "—"
    return human_duration(end - start)


BADGE_COLOURS = {
    "queued": "#adb5bd", "pending": "#6c757d", "running": "#0d6efd", "waiting": "#6f42c1", "suspended": "#fd7e14",
    "completed": "#198754", "failed": "#dc3545", "cancelled": "#495057", "timed_out": "#b02a37",
    "active": "#198754", "paused": "#fd7e14", "lost": "#d63384",
}


def badge(value: str, label: StrOrPromise) -> str:
    return format_html(
        "<span class='weft-badge weft-{}' style='background:{};color:#fff;padding:1px 7px;border-radius:8px;"
        "white-space:nowrap'>{}</span>", value, BADGE_COLOURS.get(value, "#6c757d"), label)


class BoundedPaginator(Paginator):
    """Counts at most ``count_cap`` rows (a COUNT over a LIMIT subquery), never a whole table.

    Beyond the cap the changelist shows "N+" and pages up to the cap; narrow the filters to see further.
    """

    count_cap = 1000

    @cached_property
    def count(self) -> int:
        queryset = cast("QuerySet[Any]", self.object_list)  # the admin paginates querysets
        rows = queryset.order_by()[: self.count_cap + 1].count()  # no sort needed to count
        self.capped = rows > self.count_cap
        return min(rows, self.count_cap)


class ReadOnlyMixin:
    """Engine-owned records: viewable, never added, changed or deleted through the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class BoundedInlineFormSet(BaseInlineFormSet):
    """Loads at most ``MAX_INLINE_ROWS`` related rows, so a run with a huge journal still opens."""

    def get_queryset(self) -> QuerySet:
        if not hasattr(self, "_bounded_queryset"):
            self._bounded_queryset = super().get_queryset()[:MAX_INLINE_ROWS]
        return self._bounded_queryset


def may_view_payloads(request: HttpRequest) -> bool:
    return request.user.has_perm(f"django_weft.{privacy.PERMISSION}")


class PayloadPrivacyMixin:
    """Every page of the model admin shows payloads only to users with django_weft.view_payloads (others see
    "hidden"): set for the whole view, which renders its inlines, panels and forms within it."""

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with privacy.payloads(may_view_payloads(request)):
            response = super().changeform_view(request, *args, **kwargs)  # type: ignore[misc]
            return _rendered(response)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with privacy.payloads(may_view_payloads(request)):
            return _rendered(super().changelist_view(request, *args, **kwargs))  # type: ignore[misc]


def _rendered(response: Any) -> Any:
    """A TemplateResponse renders after the view returns, outside the block: render it inside."""
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    """A read-only inline visible to whoever may view the parent (no separate view permission needed)."""

    formset = BoundedInlineFormSet
    extra = 0
    max_num = 0
    can_delete = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = self.parent_model._meta
        return request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}") or request.user.has_perm(
            f"{opts.app_label}.change_{opts.model_name}")


@dataclass(frozen=True)
class Operation:
    """One engine call per object, confirmed first, permission-checked, reported and logged."""

    name: str  # URL segment and action suffix, e.g. "cancel"
    label: StrOrPromise  # button and page title, e.g. "Cancel"
    done: StrOrPromise  # past participle for messages, e.g. "cancelled"
    permission: str  # ModelAdmin.has_<permission>_permission
    eligible: Callable[[Any], QuerySet]  # the model's own QuerySet (its vocabulary: open(), finished() ...)
    # Does it to one object; returns a note for the log/message, or raises WeftError to skip it.
    apply: Callable[[HttpRequest, Any], str] | None = None
    # Deletes many at once (purge); returns the objects it deleted, which are logged as deletions.
    apply_many: Callable[[HttpRequest, list], list] | None = None
    explanation: StrOrPromise = ""
    destructive: bool = False
    # The confirmation asks for a reason (request.POST["reason"]), recorded with what the operator did.
    takes_reason: bool = False


class OperationsMixin(_ModelAdmin):
    """Adds ``<pk>/<operation>/`` views and the shared confirmation flow to a ModelAdmin."""

    operations: dict[str, Operation] = {}
    confirmation_template = "admin/django_weft/operation_confirmation.html"

    def get_urls(self) -> list:
        info = self.opts.app_label, self.opts.model_name
        extra = [
            path(f"<path:object_id>/{name}/", self.admin_site.admin_view(self._object_operation_view(name)),
                 name="{}_{}_{}".format(*info, name))
            for name in self.operations
        ]
        return extra + super().get_urls()

    def _object_operation_view(self, name: str) -> Callable[..., HttpResponse]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            return self.object_operation(request, object_id, name)

        return view

    def operation_allowed(self, request: HttpRequest, operation: Operation) -> bool:
        return getattr(self, f"has_{operation.permission}_permission")(request)

    def available_operations(self, request: HttpRequest, obj: Model) -> list[dict]:
        """Buttons for the detail page: operations the user may do and the object is eligible for."""
        buttons = []
        for op in self.operations.values():
            if self.operation_allowed(request, op) and op.eligible(self.model._default_manager.filter(pk=obj.pk)
                                                                   ).exists():
                buttons.append({"label": op.label, "name": op.name, "url": reverse(
                    f"admin:{self.opts.app_label}_{self.opts.model_name}_{op.name}", args=[obj.pk])})
        return buttons

    def object_operation(self, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        obj = self.get_object(request, object_id)
        if obj is None:
            return self.missing_object_redirect(request, object_id)
        queryset = self.model._default_manager.filter(pk=obj.pk)
        response = self.run_operation(request, queryset, name, single=obj)
        if response is None:
            return HttpResponseRedirect(reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
                                                args=[obj.pk]))
        return response

    def missing_object_redirect(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        """What Django's change view does for an id that is gone: a warning, and back to the admin index."""
        # Django's own message (and so its translations), curly quotes included.
        text = _t("%(name)s with ID “%(key)s” doesn’t exist. Perhaps it was deleted?")  # noqa: RUF001
        self.message_user(request, text % {"name": self.opts.verbose_name, "key": object_id}, messages.WARNING)
        return HttpResponseRedirect(reverse("admin:index", current_app=self.admin_site.name))

    def run_operation(self, request: HttpRequest, queryset: QuerySet, name: str,
                      single: Model | None = None) -> HttpResponse | None:
        """Confirmation page on first sight, the operation on ``post=yes``. None means done (redirect)."""
        op = self.operations[name]
        if not self.operation_allowed(request, op):
            raise PermissionDenied
        eligible = op.eligible(queryset)
        if request.method == "POST" and request.POST.get("post") == "yes":
            self._perform(request, queryset, eligible, op)
            return None
        listed = list(eligible[:MAX_LISTED])
        eligible_count = eligible[:MAX_OBJECTS_PER_OPERATION + 1].count()
        selected_count = queryset[:MAX_OBJECTS_PER_OPERATION + 1].count()
        context = {
            **self.admin_site.each_context(request),
            "title": _t("%(operation)s: are you sure?") % {"operation": op.label},
            "operation": op,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "listed": listed,
            "more": max(0, eligible_count - len(listed)),
            "eligible_count": eligible_count,
            "capped": eligible_count > MAX_OBJECTS_PER_OPERATION,
            "max_objects": MAX_OBJECTS_PER_OPERATION,
            "ineligible_count": max(0, selected_count - eligible_count),
            "single": single,
            "action_name": f"{name}_selected",
            "selected_ids": [] if single else request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "index": request.POST.get("index", "0"),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, [
            f"admin/{self.opts.app_label}/{self.opts.model_name}/{name}_confirmation.html",
            f"admin/{self.opts.app_label}/{self.opts.model_name}/operation_confirmation.html",
            self.confirmation_template,
        ], context)

    def _perform(self, request: HttpRequest, queryset: QuerySet, eligible: QuerySet, op: Operation) -> None:
        ids = list(eligible.values_list("pk", flat=True)[:MAX_OBJECTS_PER_OPERATION + 1])
        capped = len(ids) > MAX_OBJECTS_PER_OPERATION
        ids = ids[:MAX_OBJECTS_PER_OPERATION]
        objects = list(self.model._default_manager.filter(pk__in=ids))
        done: list[Model] = []
        notes: list[str] = []
        failures: list[str] = []
        if op.apply_many is not None:
            done = op.apply_many(request, objects)
            if done:
                # Django only iterates what it is given; these rows are gone, so no queryset could list them.
                self.log_deletions(request, done)  # type: ignore[arg-type]
        else:
            assert op.apply is not None
            for obj in objects:
                try:
                    note = op.apply(request, obj)
                except WeftError as exc:
                    failures.append(f"{obj}: {exc}")
                    continue
                done.append(obj)
                if note:
                    notes.append(note)
                self.log_change(request, obj, f"{capfirst(op.done)} (admin operation {op.name!r})"
                                + (f": {note}" if note else ""))
        skipped = len(objects) - len(done)
        skipped += max(0, queryset[:MAX_OBJECTS_PER_OPERATION + 1].count() - len(ids))
        verbose = self.opts.verbose_name if len(done) == 1 else self.opts.verbose_name_plural
        text = ngettext("%(count)d %(name)s %(done)s.", "%(count)d %(name)s %(done)s.", len(done)) % {
            "count": len(done), "name": verbose, "done": op.done}
        if skipped and not capped:
            text += " " + ngettext("%(count)d skipped: not eligible or changed meanwhile.",
                                   "%(count)d skipped: not eligible or changed meanwhile.", skipped) % {
                "count": skipped}
        if capped:
            text += " " + _t("Only the first %(max)d were processed; run the action again for the rest.") % {
                "max": MAX_OBJECTS_PER_OPERATION}
        if notes and len(notes) <= 5:
            text += " " + " ".join(notes)
        level = messages.SUCCESS if done else messages.WARNING
        self.message_user(request, text, level)
        for failure in failures[:5]:
            self.message_user(request, failure, messages.WARNING)
