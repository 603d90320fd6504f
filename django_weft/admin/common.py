"""Shared admin pieces: payload rendering, read-only bases, and confirmed operations.

Payloads are decoded from msgpack (which never executes anything) and always rendered escaped.
An *operation* (cancel, retry, pause, ...) is one engine call per selected object. It is offered both
as a changelist action and as a button on the detail page, and both go through the same confirmation
page, permission check, outcome message and ``LogEntry``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.templatetags.admin_list import _boolean_icon  # type: ignore[attr-defined]
from django.contrib.admin.utils import display_for_field, lookup_field
from django.core.exceptions import FieldDoesNotExist, ObjectDoesNotExist, PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Choices, DateTimeField, Model, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import linebreaksbr, striptags
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeData, mark_safe
from django.utils.text import capfirst
from django.utils.translation import get_language, ngettext
from django.utils.translation import gettext as _t

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
    value = as_json(value)
    # A scalar has nothing to indent, and without indent json takes its C encoder (indent=2 costs 20 µs a call).
    return json.dumps(value, indent=2 if isinstance(value, (dict, list)) else None, ensure_ascii=False)


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
    return _badge(value, str(label))


@lru_cache(maxsize=1024, typed=True)  # a journal of 1,000 steps shows a few distinct badges, a thousand times
def _badge(value: str, label: str) -> str:
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
    """Loads at most ``MAX_INLINE_ROWS`` related rows, so a run with a huge journal still opens; shown by
    :class:`ReadOnlyTable` (the template of :class:`ReadOnlyInline`), which needs no form per row."""

    def get_queryset(self) -> QuerySet:
        if not hasattr(self, "_bounded_queryset"):
            self._bounded_queryset = super().get_queryset()[:MAX_INLINE_ROWS]
        return self._bounded_queryset

    # A page being shown builds no form per row: ReadOnlyTable writes the rows from get_queryset(). (Django's change
    # view walks the initial forms of a view-only inline, and the inline's media walks all its forms, building them;
    # ``forms`` itself still builds them, for whoever asks.) A read-only inline has no extra forms (extra = 0).
    @property
    def initial_forms(self) -> list:
        return super().initial_forms if self.is_bound else []

    @property
    def extra_forms(self) -> list:
        return super().extra_forms if self.is_bound else []

    @cached_property
    def empty_form(self) -> Any:  # asked for by the inline's columns, its media and is_multipart: built once
        return super().empty_form

    # Every row's form is of the empty form's class: the same media, multipart or not.
    @property
    def media(self) -> Any:
        return self.empty_form.media

    def is_multipart(self) -> bool:
        return self.empty_form.is_multipart()


@cache
def _labels(choices: type[Choices], language: str | None) -> dict[Any, str]:
    return {value: str(label) for value, label in choices.choices}  # translated into ``language``, the active one


def choice_labels(choices: type[Choices]) -> dict[Any, str]:
    """value -> label of ``choices`` (a model's TextChoices) in the current language: made once per language."""
    return _labels(choices, get_language())


def choice_label(choices: type[Choices], value: Any) -> str:
    """The label of ``value`` among ``choices``; what ``get_FOO_display()`` answers, without rebuilding (and
    translating) the whole list of choices on every call."""
    return choice_labels(choices).get(value, value)


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


class ReadOnlyTable:
    """How a :class:`ReadOnlyInline` renders (its ``template``; ``{% include %}`` takes any object with a ``render``
    method): the markup of Django's ``admin/edit_inline/tabular.html`` for rows nobody edits, written here instead
    of by the template engine. The template builds a form, a fieldset, a line and a field object per cell and walks
    them in three nested loops: about 0.7 ms a row, so a run page with a journal of 1,000 steps took over a second.
    Each cell holds what the template's ``field.contents`` would (``AdminReadonlyField.contents``: the inline's
    display method or the model field's display value, escaped). The rows have no change or "view on site" links
    (no read-only inline here shows them)."""

    def render(self, context: Any) -> str:
        admin_formset = context["inline_admin_formset"]
        formset, inline = admin_formset.formset, admin_formset.opts
        last = bool((context.get("forloop") or {}).get("last"))
        prefix, collapsible = formset.prefix, admin_formset.is_collapsible
        columns = list(admin_formset.fields())
        heading = inline.verbose_name if formset.max_num == 1 else inline.verbose_name_plural
        parts: list[str] = [format_html(
            '<div class="js-inline-admin-formset inline-group" id="{}-group" data-inline-type="tabular" '
            'data-inline-formset="{}">\n<div class="tabular inline-related {}">\n{}\n'
            '<fieldset class="module {}" aria-labelledby="{}-heading">\n{}<h2 id="{}-heading" class="inline-heading">'
            '{}</h2>{}\n{}\n<table>\n<thead><tr><th class="original"></th>',
            prefix, admin_formset.inline_formset_data(), "last-related" if last else "", formset.management_form,
            admin_formset.classes, prefix, mark_safe("<details><summary>") if collapsible else "", prefix,
            capfirst(heading), mark_safe("</summary>") if collapsible else "", admin_formset.non_form_errors())]
        for column in columns:
            parts.append(format_html('<th class="column-{}">{}{}</th>', column["name"], capfirst(column["label"]),
                                     _help_icon(column["help_text"])))
        parts.append(mark_safe("<th></th></tr></thead>\n<tbody>\n"))
        empty = inline.get_empty_value_display()
        # Escaped once here, or by each column's cell function: the rows are joined as plain strings.
        cells = [(format_html('<td class="field-{}"><p>', column["name"]), _column(column["name"], inline, empty))
                 for column in columns]
        fk = formset.fk
        parent = formset.instance.serializable_value(fk.remote_field.field_name)
        # The row's own cell: its text, and the hidden inputs of its key and its parent's.
        original = format_html(
            '<tr class="form-row has_original" id="{p}-{{i}}"><td class="original"><p>{{text}}</p>'
            '<input type="hidden" name="{p}-{{i}}-{pk}" value="{{pk}}" id="id_{p}-{{i}}-{pk}">'
            '<input type="hidden" name="{p}-{{i}}-{fk}" value="{parent}" id="id_{p}-{{i}}-{fk}"></td>',
            **{name: str(value).replace("{", "{{").replace("}", "}}") for name, value in
               (("p", prefix), ("pk", formset.model._meta.pk.name), ("fk", fk.name), ("parent", parent))})
        for i, row in enumerate(formset.get_queryset()):
            parts.append(original.format(i=i, text=html.escape(str(row)), pk=html.escape(str(row.pk))))
            for head, cell in cells:
                parts += (head, cell(row), "</p></td>")
            parts.append('<td class="delete"></td></tr>\n')
        parts.append("</tbody>\n</table>\n" + ("</details>" if collapsible else "") + "</fieldset>\n</div>\n</div>\n")
        return mark_safe("".join(parts))


def _help_icon(text: str) -> str:
    if not text:
        return ""
    text = striptags(text)
    return format_html('\n<img src="{}" class="help help-tooltip" width="10" height="10" alt="({})" title="{}">',
                       static("admin/img/icon-unknown.svg"), text, text)


def _text(value: Any) -> str:
    """``conditional_escape(linebreaksbr(value))``, as ``AdminReadonlyField.contents`` ends."""
    text = str(value)
    if "\n" in text or "\r" in text:
        return linebreaksbr(text)
    return text if isinstance(text, SafeData) else mark_safe(html.escape(text))


def _column(name: str, inline: Any, empty: str) -> Callable[[Model], str]:
    """The cells of column ``name``: what ``AdminReadonlyField.contents`` shows for it, resolved once for the
    column (a display method of the inline, or a plain field of the model) instead of by ``lookup_field`` per cell;
    anything else (relations, model methods) goes through ``lookup_field``."""
    try:
        field = inline.model._meta.get_field(name)
    except FieldDoesNotExist:
        field = None
    if field is not None and not field.is_relation:
        if isinstance(field, DateTimeField):  # one format and zone on the whole page (moment), not Django's default
            return lambda row: _text(moment(getattr(row, name)))
        if field.flatchoices:  # display_for_field's first case, its dict of labels made (and translated) once
            labels = {value: str(label) for value, label in field.flatchoices}
            return lambda row: _text(labels.get(getattr(row, name), empty))
        return lambda row: _text(display_for_field(getattr(row, name), field, empty))
    method = getattr(inline, name, None) if field is None and name != "__str__" else None
    if not callable(method):
        return lambda row: _cell(name, row, inline, empty)
    boolean = getattr(method, "boolean", False)

    def cell(row: Model) -> str:
        try:
            value = method(row)
        except (AttributeError, ValueError, ObjectDoesNotExist):
            return empty
        if boolean:
            return _boolean_icon(value)
        return conditional_escape(value) if hasattr(value, "__html__") else _text(value)

    return cell


def _cell(name: str, row: Model, inline: Any, empty: str) -> str:
    """What ``AdminReadonlyField.contents`` shows for field ``name`` of ``row`` (its relations as text)."""
    try:
        field, attr, value = lookup_field(name, row, inline)
    except (AttributeError, ValueError, ObjectDoesNotExist):
        return empty
    if field is None:
        if getattr(attr, "boolean", False):
            return _boolean_icon(value)
        return conditional_escape(value if hasattr(value, "__html__") else linebreaksbr(value))
    if field.is_relation and value is not None:
        return conditional_escape(linebreaksbr(str(value)))
    return conditional_escape(linebreaksbr(display_for_field(value, field, empty)))


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    """A read-only inline visible to whoever may view the parent (no separate view permission needed)."""

    formset = BoundedInlineFormSet
    template = ReadOnlyTable()  # type: ignore[assignment]  # {% include %} takes any object with a render()
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
