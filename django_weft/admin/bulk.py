"""The admin's "apply to all runs matching this filter", and the audit records of bulk operations.

When the runs changelist is filtered, it links each bulk operation the user may do (cancel, terminate, retry,
suspend, resume, purge) to a confirmation page: the dry run of ``weft.bulk`` over the same filters (how many
runs it applies to, a sample), whose form posts the preview's confirmation token back. A set that changed
in between is refused (BulkConfirmationError) and previewed afresh. Every operation is recorded as a
BulkOperation, which :class:`BulkOperationAdmin` lists (read-only).

The changelist's query string is mapped to the filters of ``runs_matching`` by :data:`PARAMETERS` (exact
parameter names) and :data:`PREFIXES` (``attr_<name>[__lookup]=<text>``, the parameters of the attribute
filters in ``admin/filters.py``). A changelist narrowed by anything else (the search box, a filter with no
mapping) offers no bulk operation: the bulk set would not be the list the user sees. A list filter of its
own registers its parameters with :func:`register_parameter` or :func:`register_prefix`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import ReadOnlyMixin, badge, pre, pretty_value
from django_weft.admin.filters import ATTRIBUTE_PREFIX
from django_weft.exceptions import BulkConfirmationError, InvalidArgument, WeftError
from django_weft.models import BulkOperation, Schedule, Workflow
from django_weft.services import bulk, visibility_text
from django_weft.services.visibility import runs_matching

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# Changelist parameters that do not narrow the list (ordering, page, popups, the error flag, "show all").
IGNORED = frozenset({"o", "p", "e", "all", "_to_field", "_popup", "weft_reason"})  # weft_reason: REASON_PARAMETER
# Matches counted for the changelist's link, at most ("1000+" beyond).
COUNT_CAP = 1000
# From this many runs on, the confirmation page warns that a web request may not live long enough.
LARGE = 10_000

# parameter value, filters to add it to
Handler = Callable[[str, dict[str, Any]], None]
# the rest of the parameter name after the prefix, its value, the filters
PrefixHandler = Callable[[str, str, dict[str, Any]], None]


def _listed(key: str) -> Handler:
    def handle(value: str, filters: dict[str, Any]) -> None:
        filters.setdefault(key, []).extend(part.strip() for part in value.split(",") if part.strip())

    return handle


def _moment(key: str) -> Handler:
    def handle(value: str, filters: dict[str, Any]) -> None:
        filters[key] = visibility_text.moment(value, key)

    return handle


def _version(value: str, filters: dict[str, Any]) -> None:
    filters["version"] = visibility_text.integer(value, "version")


def _schedule(value: str, filters: dict[str, Any]) -> None:
    schedule_id = Schedule.objects.filter(pk=visibility_text.integer(value, "schedule")).values_list(
        "schedule_id", flat=True).first()
    if schedule_id is None:
        raise InvalidArgument(f"no schedule with id {value!r}")
    filters["schedule"] = schedule_id


def _parent(value: str, filters: dict[str, Any]) -> None:
    filters["parent"] = value


def _attribute(rest: str, value: str, filters: dict[str, Any]) -> None:
    filters.setdefault("attributes", {})[rest] = visibility_text.attribute(rest, value)


PARAMETERS: dict[str, Handler] = {
    "status__exact": _listed("status"), "status__in": _listed("status"), "status": _listed("status"),
    "failure_category__exact": _listed("failure_category"), "failure_category__in": _listed("failure_category"),
    "failure_category": _listed("failure_category"),
    "type": _listed("type"), "workflow_type": _listed("type"), "workflow_type__exact": _listed("type"),
    "version": _version, "version__exact": _version,
    "tags": _listed("tags"), "tag": _listed("tags"), "tags__contains": _listed("tags"),
    "schedule__id__exact": _schedule,
    "parent": _parent, "parent__exact": _parent, "parent__run_id__exact": _parent,
    "created_at__gte": _moment("created_after"), "created_at__lt": _moment("created_before"),
}
PREFIXES: dict[str, PrefixHandler] = {ATTRIBUTE_PREFIX: _attribute}


def register_parameter(name: str, handler: Handler) -> None:
    """Map changelist parameter ``name`` to runs_matching filters: ``handler(value, filters)`` adds to them."""
    PARAMETERS[name] = handler


def register_prefix(prefix: str, handler: PrefixHandler) -> None:
    """Map the changelist parameters starting with ``prefix``: ``handler(rest_of_name, value, filters)``."""
    PREFIXES[prefix] = handler


def changelist_filters(params: QueryDict) -> tuple[dict[str, Any], list[str]]:
    """The runs_matching filters of a changelist query string, and what of it has none (named, with why)."""
    filters: dict[str, Any] = {}
    unsupported: list[str] = []
    for name in params:
        values = [value for value in params.getlist(name) if value != ""]
        if name in IGNORED or not values:
            continue
        handler = PARAMETERS.get(name)
        prefixed = next((prefix for prefix in PREFIXES if name.startswith(prefix)), None)
        if handler is None and prefixed is None:
            unsupported.append(_t("the search box") if name == "q" else name)
            continue
        try:
            for value in values:
                if handler is not None:
                    handler(value, filters)
                elif prefixed is not None:
                    PREFIXES[prefixed](name[len(prefixed):], value, filters)
        except (WeftError, ValueError) as exc:
            unsupported.append(f"{name} ({exc})")
    return filters, unsupported


# --- the operations --------------------------------------------------------------------------------------


# The reason an operator gives on the confirmation page: a query parameter, so the preview's confirmation token
# (which binds the operation's arguments) is issued for it, and the "Yes" form posts to the same URL.
REASON_PARAMETER = "weft_reason"


def _reason(verb: str) -> Callable[[HttpRequest], str]:
    def reason(request: HttpRequest) -> str:
        recorded = f"{verb} by {request.user.get_username()} in the admin (all runs matching a filter)"
        given = request.GET.get(REASON_PARAMETER, "").strip()
        return f"{recorded}: {given}" if given else recorded

    return reason


@dataclass(frozen=True)
class BulkAction:
    name: str  # URL segment
    operation: str  # the weft.bulk operation (bulk.OPERATIONS)
    label: StrOrPromise
    explanation: StrOrPromise
    reason: Callable[[HttpRequest], str] | None = None
    destructive: bool = False

    @property
    def permission(self) -> str:
        """The WorkflowAdmin.has_<permission>_permission it needs: bulk.PERMISSIONS' codename, less the model."""
        return bulk.PERMISSIONS[self.operation].removesuffix("_workflow")


BULK_ACTIONS = {
    action.name: action for action in (
        BulkAction("cancel", "cancel", _("Cancel"),
                   _("The open runs end as cancelled; an executor holding one loses it."), _reason("cancelled"),
                   destructive=True),
        BulkAction("terminate", "terminate", _("Terminate"),
                   _("The open runs end at once as timed out (termination reason: terminated); their children "
                     "follow their parent close policy."), _reason("terminated"), destructive=True),
        BulkAction("retry", "retry_failed", _("Retry"),
                   _("The failed runs run again from their failed step; a run whose workflow id has another open "
                     "run is skipped.")),
        BulkAction("suspend", "suspend", _("Suspend"),
                   _("Nothing executes the pending, running and waiting runs until they are resumed."),
                   _reason("suspended")),
        BulkAction("resume", "resume", _("Resume"),
                   _("The suspended runs become runnable and continue where they were.")),
        BulkAction("purge", "purge", _("Purge"),
                   _("The finished runs are deleted with their journal, timers, signals and async records. This "
                     "cannot be undone."), destructive=True),
    )
}


def _allowed(model_admin: Any, request: HttpRequest, action: BulkAction) -> bool:
    return bool(getattr(model_admin, f"has_{action.permission}_permission")(request))


def _url(name: str, query: str) -> str:
    base = reverse("admin:django_weft_workflow_bulk", args=[name])
    return f"{base}?{query}" if query else base


def _changelist_url(query: str) -> str:
    base = reverse("admin:django_weft_workflow_changelist")
    return f"{base}?{query}" if query else base


def _query(request: HttpRequest) -> str:
    params = request.GET.copy()
    for name in ("o", "p", "e", REASON_PARAMETER):
        params.pop(name, None)
    return params.urlencode()


def bulk_context(model_admin: Any, request: HttpRequest) -> dict[str, Any]:
    """The changelist's "all runs matching this filter" links (nothing while it is not filtered)."""
    filters, unsupported = changelist_filters(request.GET)
    if not filters and not unsupported:
        return {}
    links = [{"label": action.label, "name": action.name, "url": _url(action.name, _query(request))}
             for action in BULK_ACTIONS.values() if _allowed(model_admin, request, action)]
    if not links:
        return {}
    count = ""
    if not unsupported:
        try:
            matched = runs_matching(**filters).order_by()[:COUNT_CAP + 1].count()
        except WeftError:
            return {}
        count = f"{COUNT_CAP}+" if matched > COUNT_CAP else str(matched)
    return {"weft_bulk": {"links": [] if unsupported else links, "count": count, "unsupported": unsupported}}


def bulk_urls(model_admin: Any) -> list:
    """``bulk/<operation>/`` (before the admin's ``<object_id>/...`` patterns, which would take it)."""

    # Never one transaction around the whole operation (ATOMIC_REQUESTS): it works in batches of its own.
    @transaction.non_atomic_requests
    def view(request: HttpRequest, operation: str) -> HttpResponse:
        return bulk_view(model_admin, request, operation)

    return [path("bulk/<str:operation>/", model_admin.admin_site.admin_view(view),
                 name="django_weft_workflow_bulk")]


def bulk_view(model_admin: Any, request: HttpRequest, name: str) -> HttpResponse:
    """The confirmation page (GET: the dry run) and the operation (POST: its confirmation token)."""
    action = BULK_ACTIONS.get(name)
    if action is None:
        raise Http404(f"no bulk operation {name!r}")
    if not _allowed(model_admin, request, action):
        raise PermissionDenied
    query = _query(request)
    filters, unsupported = changelist_filters(request.GET)
    context: dict[str, Any] = {"action": action, "changelist_url": _changelist_url(query),
                               "unsupported": unsupported, "filtered": bool(filters),
                               "asks_reason": action.reason is not None, "reason_parameter": REASON_PARAMETER,
                               "reason_given": request.GET.get(REASON_PARAMETER, "").strip(),
                               "filter_parameters": [(name, value) for name, values in request.GET.lists()
                                                     if name != REASON_PARAMETER for value in values]}
    if filters and not unsupported:
        operation = bulk.OPERATIONS[action.operation]
        args = [action.reason(request)] if action.reason is not None else []
        if request.method == "POST":
            try:
                result = operation(*args, confirmation_token=request.POST.get("confirmation_token", ""),
                                   requested_by=f"{request.user.get_username()} (admin)", **filters)
            except (BulkConfirmationError, InvalidArgument) as exc:
                model_admin.message_user(request, _t("Nothing was done: %(error)s. Here is the new preview.") % {
                    "error": exc}, messages.ERROR)
            else:
                assert isinstance(result, bulk.BulkResult)
                model_admin.message_user(request, _t(
                    "%(label)s: %(count)d of %(matched)d matching run(s) changed (%(skipped)d had changed "
                    "meanwhile); bulk operation #%(id)s.") % {"label": action.label, "count": result.count,
                                                              "matched": result.matched, "skipped": result.skipped,
                                                              "id": result.operation_id},
                    messages.SUCCESS if result.count else messages.WARNING)
                return HttpResponseRedirect(_changelist_url(query))
        try:
            preview = operation(*args, dry_run=True, **filters)
        except WeftError as exc:
            context["unsupported"] = [str(exc)]
        else:
            assert isinstance(preview, bulk.BulkPreview)
            runs = {run.pk: run for run in Workflow.objects.filter(pk__in=preview.sample_ids)}
            context.update(preview=preview, sample=[runs[pk] for pk in preview.sample_ids if pk in runs],
                           more=max(0, preview.matched - len(preview.sample_ids)), large=preview.matched >= LARGE,
                           described=pretty_value(bulk.describe_filters(filters)))
    opts = model_admin.opts
    context.update(model_admin.admin_site.each_context(request), opts=opts, app_label=opts.app_label,
                   title=_t("%(label)s all runs matching this filter") % {"label": action.label},
                   media=model_admin.media)
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_weft/workflow/bulk_confirmation.html", context)


# --- the audit records -----------------------------------------------------------------------------------


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyMixin, admin.ModelAdmin):
    class Media:
        css = {"all": ("django_weft/admin.css",)}  # cells wrap: the list fits the screen

    """Who did what to how many runs, with which filter (read-only)."""

    list_display = ("id", "operation", "status_badge", "matched", "count", "requested_by", "started_at",
                    "finished_at")
    list_filter = ("operation", "status")
    search_fields = ("requested_by",)
    fields = ("operation", "status_badge", "requested_by", "filters_pretty", "arguments_pretty", "matched", "count",
              "error_pretty", "started_at", "finished_at")
    readonly_fields = fields

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, record: BulkOperation) -> str:
        colour = {"completed": "completed", "failed": "failed"}.get(record.status, "running")
        return badge(colour, record.get_status_display())

    @admin.display(description=_("filters"))
    def filters_pretty(self, record: BulkOperation) -> str:
        return pre(pretty_value(record.filters))

    @admin.display(description=_("arguments"))
    def arguments_pretty(self, record: BulkOperation) -> str:
        return pre(pretty_value(record.arguments)) if record.arguments else "—"

    @admin.display(description=_("error"))
    def error_pretty(self, record: BulkOperation) -> str:
        return pre(f"{record.error.get('type')}: {record.error.get('message')}") if record.error else "—"
