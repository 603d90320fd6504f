"""Talking to a run from its admin page: the Queries panel (the handlers its code registers, and a query's
answer), its updates (an inline beside the signals) and the "send update" form.

Queries are read-only and open to whoever may view the run: the panel's forms are GET forms on the run's own
page, answered from a dry replay of the journal (django_weft.services.queries), which executes and writes nothing.
Sending an update needs the signal permission and calls ``start_update``: validated before anything is
written, then applied by the run, whose page shows it pending and then its reply.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import MAX_INLINE_ROWS, ReadOnlyInline, badge, pretty_value, preview
from django_weft.admin.forms import UpdateForm
from django_weft.common.codec import MAX_DEPTH
from django_weft.exceptions import InvalidArgument, WeftError, WorkflowNotRegistered
from django_weft.models import RunStatus, Timer, UpdateStatus, Workflow, WorkflowStep, WorkflowUpdate
from django_weft.services import queries
from django_weft.services.client import WorkflowHandle
from django_weft.store.starts import check_id

if TYPE_CHECKING:
    from django_weft.admin.runs import WorkflowAdmin
    from django_weft.runtime.context import Context

# The panel replays a journal this long on every view of the page; a longer one only when asked (a link).
AUTO_REPLAY_MAX_STEPS = 2000
# A query's arguments, as typed into the panel (JSON text).
MAX_ARGS_CHARS = 10_000
# The panel's GET parameters on the run's page.
QUERY_PARAM, ARGS_PARAM, LIST_PARAM = "weft_query", "weft_args", "weft_handlers"


class UpdateInline(ReadOnlyInline):
    """A run's updates in arrival order: pending until the run applied them, then the handler's reply."""

    model = WorkflowUpdate
    verbose_name = _("update")
    verbose_name_plural = _("updates")
    fields = ("sequence", "name", "update_id", "status_badge", "payload_preview", "reply", "received_at",
              "finished_at", "applied_step")
    readonly_fields = fields
    ordering = ("sequence",)

    @admin.display(description=_("status"))
    def status_badge(self, update: WorkflowUpdate) -> str:
        return badge(update.status, update.get_status_display())

    @admin.display(description=_("payload"))
    def payload_preview(self, update: WorkflowUpdate) -> str:
        return preview(update.payload)

    @admin.display(description=_("result or error"))
    def reply(self, update: WorkflowUpdate) -> str:
        if update.status == UpdateStatus.COMPLETED:
            return preview(update.result)
        if update.status == UpdateStatus.FAILED:
            error = update.error or {}
            return f"{error.get('type', 'Error')}: {error.get('message', '')}"
        return "—"

    @admin.display(description=_("applied at step"))
    def applied_step(self, update: WorkflowUpdate) -> str:
        return "—" if update.applied_seq is None else str(update.applied_seq)


def replay_run(run: Workflow, steps: list[WorkflowStep] | None = None,
               timers: list[Timer] | None = None) -> tuple[Context | None, str]:
    """The context a dry replay of ``run`` built (None if there is none) and what to say about it ("" when the
    replay reached where the run is). Never raises: the run's page opens whatever its code does."""
    try:
        ctx, stopped = queries.replay(run, steps, timers)
    except WorkflowNotRegistered as exc:
        return None, _t("The run's code cannot be replayed here: %(error)s") % {"error": exc}
    except Exception as exc:  # the workflow's own code, or its journal: shown, never a 500
        return None, _t("Replaying the run's journal failed: %(type)s: %(error)s") % {
            "type": type(exc).__name__, "error": exc}
    if stopped is None:
        return ctx, ""
    return ctx, _t("The replay stopped before the end of the journal (%(type)s: %(error)s): the handlers "
                   "registered up to there are listed, and queries answer with the state there.") % {
        "type": type(stopped).__name__, "error": stopped}


def handler_names(ctx: Context | None) -> dict[str, list[str]]:
    if ctx is None:
        return {"queries": [], "updates": [], "signals": []}
    return {"queries": sorted(ctx._query_handlers), "updates": sorted(ctx._update_handlers),
            "signals": sorted(ctx._signal_handlers)}


def parse_args(text: str) -> list:
    """A query's arguments from the panel: a JSON list (empty text: none)."""
    if not text.strip():
        return []
    if len(text) > MAX_ARGS_CHARS:
        raise InvalidArgument(_t("The arguments are over %(max)d characters.") % {"max": MAX_ARGS_CHARS})
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(_t("The arguments are not JSON: %(error)s") % {"error": exc}) from None
    except RecursionError:  # deeper than Python's parser goes (queries.answer refuses what is over the limit)
        raise InvalidArgument(_t("The arguments nest more than %(max)d levels.") % {"max": MAX_DEPTH}) from None
    if not isinstance(args, list):
        raise InvalidArgument(_t('The arguments must be a JSON list, e.g. [] or ["A1", 2].'))
    return args


def ask(run: Workflow, ctx: Context | None, problem: str, name: str, args_text: str) -> dict[str, Any]:
    """One query from the panel: its answer as text, or the message of what went wrong."""
    asked: dict[str, Any] = {"name": name, "args": args_text}
    try:
        check_id(name, "a query name")
        args = parse_args(args_text)
        if ctx is None:
            raise InvalidArgument(problem)
        value = queries.answer(run, ctx, name, tuple(args))
    except WeftError as exc:  # QueryNotFound (it names the handlers), QueryFailed, bad arguments
        asked["error"] = str(exc)
    else:
        asked["answer"] = pretty_value(value)
    return asked


def loaded_rows(context: dict[str, Any], model: type[Model]) -> list | None:
    """Copies of all of the run's rows of ``model`` as the page's inline loaded them (no query of their own),
    or None (no such inline, or it loaded only the first MAX_INLINE_ROWS of more). Copies: a replay may change its
    rows in memory (a sleep whose timer is due completes), and the inline shows what the database holds."""
    for inline in context.get("inline_admin_formsets") or ():
        if inline.formset.model is model:
            formset = inline.formset
            rows = list(formset.get_queryset())
            if len(rows) >= MAX_INLINE_ROWS:  # all of them, or only the first? One count tells (cheaper than a reload)
                owned = model._default_manager.filter(**{formset.fk.name: formset.instance})
                if owned.count() > len(rows):
                    return None
            return [copy.copy(row) for row in rows]
    return None


def talk_panel(request: HttpRequest, run: Workflow, context: dict[str, Any], *, may_send: bool) -> dict[str, Any]:
    """The Queries panel of ``run``'s page: the handlers its code registers and, when asked, one answer;
    replayed from the journal and timers the page's inlines loaded, when they loaded all of them."""
    steps, timers = loaded_rows(context, WorkflowStep), loaded_rows(context, Timer)
    name = request.GET.get(QUERY_PARAM)
    args_text = request.GET.get(ARGS_PARAM, "")
    update_url = reverse("admin:django_weft_workflow_update", args=[run.pk])
    panel: dict[str, Any] = {"continued": run.status == RunStatus.CONTINUED}
    if name is None and not request.GET.get(LIST_PARAM):
        length = len(steps) if steps is not None else (
            WorkflowStep.objects.filter(run=run).order_by()[:AUTO_REPLAY_MAX_STEPS + 1].count())
        if length > AUTO_REPLAY_MAX_STEPS:  # a long journal costs a long replay: only on request
            return {**panel, "deferred": True, "max_steps": AUTO_REPLAY_MAX_STEPS,
                    "list_url": "?" + urlencode({LIST_PARAM: "1"}) + "#weft-queries"}
    ctx, problem = replay_run(run, steps, timers)
    names = handler_names(ctx)
    asked = ask(run, ctx, problem, name, args_text) if name is not None else None
    panel.update({
        "problem": problem,
        # A run that failed (or was cancelled) stops its replay where it ended: said plainly, not as an alarm.
        "problem_is_its_end": bool(problem) and ctx is not None and run.status in (
            RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT),
        "asked": asked,
        "queries": [{"name": query, "form_id": f"weft-query-{number}",
                     "args": args_text if asked and asked["name"] == query else ""}
                    for number, query in enumerate(names["queries"], start=1)],
        "updates": [{"name": update, "url": f"{update_url}?{urlencode({'name': update})}" if may_send else ""}
                    for update in names["updates"]],
        "signals": names["signals"],
        "may_send": may_send,
    })
    return panel


def send_update_view(model_admin: WorkflowAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The "send update" form: ``start_update`` (validated before anything is written), then back to the run."""
    run = model_admin._run_for_form(request, object_id, allowed=model_admin.has_signal_permission(request))
    if isinstance(run, HttpResponse):
        return run
    target = Workflow.objects.end_of_chain(run)  # where start_update delivers it
    form: UpdateForm | None = None
    if request.method == "POST":
        form = UpdateForm(request.POST)
        if form.is_valid():
            response = _send(model_admin, request, run, target, form)
            if response is not None:
                return response
    # The page itself: the handler names as suggestions, from a dry replay of the run that would take it.
    ctx, problem = replay_run(target) if not target.is_finished else (None, "")
    names = handler_names(ctx)["updates"]
    if form is None:
        asked = request.GET.get("name", "")
        form = UpdateForm(initial={"name": asked if asked in names else ""})  # never echoes arbitrary text
    form.fields["name"].widget.suggestions = names
    if target.is_finished:
        note = _t("This run is %(status)s: it takes no updates.") % {"status": target.get_status_display()}
    elif problem and ctx is None:
        note = problem
    elif names:
        note = _t("Its code registers these update handlers: %(names)s.") % {"names": ", ".join(names)}
    else:
        note = _t("Its code registers no update handler (yet).")
    return model_admin._form_page(request, run, form, _t("Send an update to %(run)s") % {"run": run.workflow_id},
                                  {"submit_label": _t("Send update"), "form_note": note})


def _send(model_admin: WorkflowAdmin, request: HttpRequest, run: Workflow, target: Workflow,
          form: UpdateForm) -> HttpResponse | None:
    data = form.cleaned_data
    update_id = data["update_id"] or None
    known = update_id is not None and WorkflowUpdate.objects.filter(run=target, update_id=update_id).exists()
    try:
        handle = WorkflowHandle(run.workflow_id, run.pk).start_update(data["name"], data["payload"],
                                                                      update_id=update_id)
    except WeftError as exc:  # UpdateRejected, WorkflowClosed, InvalidArgument, PayloadError: nothing written
        form.add_error(None, str(exc))
        return None
    values = {"name": handle.name, "id": handle.update_id}
    if known:
        note = _t("Update %(name)r with id %(id)r was accepted before: it is the same update, applied once.") % values
    else:
        note = _t("Update %(name)r accepted with id %(id)r; the run applies it in arrival order, and its page "
                  "shows the reply once it has.") % values
    model_admin.log_change(request, run, note)
    model_admin.message_user(request, note, messages.WARNING if known else messages.SUCCESS)
    return model_admin._back(run)
