"""Admin forms: send a signal or an update, resolve an async activity, create or edit a schedule."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.forms.fields import InvalidJSONInput
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_weft.common import privacy
from django_weft.common.codec import MAX_DEPTH, decode, encode, nests_deeper_than
from django_weft.common.occurrences import check_cron, parse_zone
from django_weft.common.queues import configured as configured_queues
from django_weft.common.registry import registered_workflow_names
from django_weft.common.tokens import read_task_token
from django_weft.conf import weft_settings
from django_weft.exceptions import InvalidArgument, WeftError
from django_weft.models import Schedule, Workflow
from django_weft.services.schedules import ScheduleSpec


class PayloadField(forms.JSONField):
    """A JSON payload; one nested deeper than payloads may be is refused here, naming the limit (Python's parser,
    and the form shown again with the text, would otherwise raise RecursionError)."""

    default_error_messages = {"too_deep": _("A payload nests at most %(max)s levels (lists and objects).")}

    def to_python(self, value: Any) -> Any:
        try:
            converted = super().to_python(value)
        except RecursionError:
            converted = value  # text: a leaf, but the parser found it deeper than it can go
            too_deep = True
        else:
            too_deep = nests_deeper_than(converted, MAX_DEPTH)
        if too_deep:
            raise ValidationError(self.error_messages["too_deep"], code="too_deep", params={"max": MAX_DEPTH})
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            value = super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
        return InvalidJSONInput(data) if nests_deeper_than(value, MAX_DEPTH) else value


class SignalForm(forms.Form):
    name = forms.CharField(label=_("signal name"), max_length=255)
    payload = PayloadField(label=_("payload (JSON)"), required=False,
                           widget=forms.Textarea(attrs={"rows": 6, "cols": 80}),
                           help_text=_("Any JSON value; leave empty for null."))
    signal_id = forms.CharField(label=_("signal id"), max_length=128, required=False,
                                help_text=_("Optional deduplication id: a repeat with the same id is stored once."))


class StepControlForm(forms.Form):
    """One step control (services.step_controls): which step, which control, and for "set options" what to change."""

    seq = forms.IntegerField(label=_("step"), min_value=1)
    control = forms.ChoiceField(label=_("control"), choices=[
        ("fire_timer_now", _("Fire its timer or retry backoff now")),
        ("reset_attempts", _("Reset its activity's attempt count")),
        ("pause_retries", _("Pause its retries")),
        ("unpause_retries", _("Unpause its retries")),
        ("set_activity_options", _("Change its retry policy or timeouts")),
    ])
    max_attempts = forms.IntegerField(label=_("max attempts"), min_value=1, required=False)
    initial_backoff = forms.FloatField(label=_("initial backoff (s)"), min_value=0, required=False)
    max_backoff = forms.FloatField(label=_("max backoff (s)"), min_value=0, required=False)
    timeout = forms.FloatField(label=_("timeout per attempt (s)"), min_value=0.001, required=False)
    schedule_to_close_timeout = forms.FloatField(label=_("schedule-to-close timeout (s)"), min_value=0.001,
                                                 required=False)

    RETRY = ("max_attempts", "initial_backoff", "max_backoff")
    TIMEOUTS = ("timeout", "schedule_to_close_timeout")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        options = [name for name in (*self.RETRY, *self.TIMEOUTS) if data.get(name) is not None]
        if data.get("control") == "set_activity_options" and not options:
            raise ValidationError(_("Give at least one of the retry policy's fields or a timeout to change."))
        if data.get("control") not in (None, "set_activity_options") and options:
            raise ValidationError(_("Only “change its retry policy or timeouts” takes these fields."))
        return data


class SuggestingTextInput(forms.TextInput):
    """A text input with the browser's suggestions (a ``<datalist>``): any text goes, known values are offered."""

    def __init__(self, *args: Any, list_id: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.list_id = list_id
        self.suggestions: list[str] = []

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> SafeString:
        if not self.suggestions:
            return super().render(name, value, attrs, renderer)
        html = super().render(name, value, {**(attrs or {}), "list": self.list_id}, renderer)
        options = format_html_join("", "<option value=\"{}\">", ((s,) for s in self.suggestions))
        return format_html("{}<datalist id=\"{}\">{}</datalist>", html, self.list_id, options)


class UpdateForm(forms.Form):
    name = forms.CharField(label=_("update name"), max_length=255,
                           widget=SuggestingTextInput(list_id="weft-update-names"))
    payload = PayloadField(label=_("payload (JSON)"), required=False,
                           widget=forms.Textarea(attrs={"rows": 6, "cols": 80}),
                           help_text=_("Any JSON value, passed to the handler; null (or nothing) calls it "
                                       "without an argument."))
    update_id = forms.CharField(label=_("update id"), max_length=128, required=False,
                                help_text=_("Optional: a repeat with the same id is the same update, applied once "
                                            "(a new id is made when empty)."))

    def __init__(self, *args: Any, suggestions: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        widget = self.fields["name"].widget
        assert isinstance(widget, SuggestingTextInput)
        widget.suggestions = list(suggestions)


class AsyncCompletionForm(forms.Form):
    token = forms.CharField(label=_("task token"), max_length=512,
                            widget=forms.TextInput(attrs={"size": 80}))
    outcome = forms.ChoiceField(label=_("outcome"), choices=[("complete", _("Complete with a result")),
                                                             ("fail", _("Fail with an error message"))],
                                widget=forms.RadioSelect, initial="complete")
    result = PayloadField(label=_("result (JSON)"), required=False,
                          widget=forms.Textarea(attrs={"rows": 6, "cols": 80}))
    error_message = forms.CharField(label=_("error message"), required=False, max_length=2000,
                                    help_text=_("The activity's retry policy decides what happens next."))

    def __init__(self, *args: Any, run: Workflow, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        self.seq: int | None = None
        self.attempt: int | None = None

    def clean_token(self) -> str:
        token = self.cleaned_data["token"].strip()
        try:
            run_id, self.seq, self.attempt = read_task_token(token)
        except WeftError as exc:
            raise forms.ValidationError(str(exc)) from None
        if run_id != self.run.pk:
            raise forms.ValidationError(_("This task token belongs to another run."))
        return token

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("outcome") == "fail" and not data.get("error_message"):
            self.add_error("error_message", _("Give an error message to fail the activity with."))
        return data


# What the admin says on a schedule that WEFT_SCHEDULES defines: sync_schedules (run when weft_maintenance
# starts, and by `manage.py weft_schedules sync`) writes every one of its fields back from the setting.
SETTINGS_NOTE = _("Defined in settings.WEFT_SCHEDULES; change it there and it is synced when weft_maintenance "
                  "starts or by manage.py weft_schedules sync.")


def defined_in_settings(schedule_id: str) -> bool:
    """Whether the next sync rewrites this schedule: its id is a key of WEFT_SCHEDULES (synced or not yet)."""
    definitions = weft_settings.SCHEDULES
    return isinstance(definitions, dict) and schedule_id in definitions


def _every_help() -> str:
    return str(_("An interval instead of cron: seconds (3600) or [DD] [HH:[MM:]]ss (01:00:00)."))


class ScheduleForm(forms.ModelForm):
    """Validates with the engine's own rules (ScheduleSpec), reporting each problem on its field."""

    workflow_type = forms.ChoiceField(label=_("workflow"))
    input_json = PayloadField(label=_("input (JSON)"), required=False, encoder=DjangoJSONEncoder,
                              widget=forms.Textarea(attrs={"rows": 4, "cols": 80}))
    cron = forms.CharField(label=_("cron"), required=False, max_length=255,
                           help_text=_("Five fields (minute hour day month weekday), or six with seconds first."))
    timezone = forms.CharField(label=_("time zone"), max_length=64,
                               help_text=_("IANA name, e.g. Europe/Berlin; cron is evaluated on its wall clock."))

    class Meta:
        model = Schedule
        # Model fields only: the declared input_json is always on the form, unless the admin lists it as
        # read-only (a subclass without it would otherwise fail over an unknown field in Meta).
        fields = ("schedule_id", "workflow_type", "cron", "every", "timezone", "overlap", "backfill_missed",
                  "catchup_window", "jitter", "start_at", "end_at", "queue", "priority", "pause_on_failure")
        help_texts = {"every": _every_help()}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = set(registered_workflow_names())
        instance = self.instance
        if instance.pk and instance.workflow_type:
            names.add(instance.workflow_type)
        workflow_type = self.fields.get("workflow_type")
        if isinstance(workflow_type, forms.ChoiceField):  # not on the change form: read-only there
            workflow_type.choices = [(n, n) for n in sorted(names)]
        if not self.is_bound and not instance.pk:
            self.initial.setdefault("timezone", settings.TIME_ZONE)
        if "priority" in self.fields:
            self.fields["priority"].required = False  # empty: 0
        if "queue" in self.fields:  # the queues of WEFT_QUEUES (and the one it has, if it has gone since)
            queue_names = set(configured_queues()) | ({instance.queue} if instance.queue else set())
            self.fields["queue"] = forms.ChoiceField(
                label=_("queue"), required=False,
                choices=[("", _("the workflow's own")), *((n, n) for n in sorted(queue_names))])
        self.input_editable = "input_json" in self.fields  # not when the admin shows the schedule read-only
        if instance.pk and self.input_editable and not privacy.visible():
            self.input_editable = False  # the user may not see it (django_weft.view_payloads), nor replace it
            self.initial["input_json"] = privacy.HIDDEN
        elif instance.pk and self.input_editable:
            try:
                value = decode(instance.input)
                json.dumps(value, cls=DjangoJSONEncoder)
            except Exception:
                self.input_editable = False
            else:
                # Stored before the nesting limit: kept as it is (saving it again would be refused).
                self.input_editable = not nests_deeper_than(value, MAX_DEPTH)
                self.initial["input_json"] = value
        if "input_json" in self.fields and not self.input_editable:
            self.fields["input_json"].disabled = True
            self.fields["input_json"].help_text = _("This input is not representable as JSON; it is kept as it is.")
        self.spec: ScheduleSpec | None = None

    def clean_schedule_id(self) -> str:
        schedule_id = self.cleaned_data["schedule_id"]
        if defined_in_settings(schedule_id):
            raise forms.ValidationError(_("%(id)s is defined in settings.WEFT_SCHEDULES; the next sync would "
                                          "overwrite this form's values. Change it there instead."),
                                        params={"id": schedule_id})
        return schedule_id

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if "cron" not in self.fields:  # the cadence is read-only (defined in WEFT_SCHEDULES): nothing to check
            return data
        cron = (data.get("cron") or "").strip() or None
        every: timedelta | None = data.get("every")
        if cron is not None:
            try:
                check_cron(cron)
            except InvalidArgument as exc:
                self.add_error("cron", str(exc))
        if cron is None and every is None and "every" not in self.errors:
            self.add_error("cron", _("Give a cron expression or an interval."))
        if cron is not None and every is not None:
            self.add_error("every", _("Give either a cron expression or an interval, not both."))
        if every is not None and every < timedelta(seconds=1):
            self.add_error("every", _("The interval must be at least one second."))
        for name in ("catchup_window", "jitter"):
            value = data.get(name)
            if value is not None and value <= timedelta(0):
                self.add_error(name, _("Must be positive."))
        zone = data.get("timezone")
        if zone:
            try:
                parse_zone(zone)
            except InvalidArgument as exc:
                self.add_error("timezone", str(exc))
        start_at, end_at = data.get("start_at"), data.get("end_at")
        if start_at and end_at and end_at <= start_at:
            self.add_error("end_at", _("The end must be after the start."))
        if "input_json" in self.fields and not self.fields["input_json"].disabled:
            try:
                encode(data.get("input_json"), what="schedule input")
            except WeftError as exc:
                self.add_error("input_json", str(exc))
        if not self.errors:
            try:
                self.spec = ScheduleSpec.check(
                    cron=cron, every=every, timezone=zone, overlap=data.get("overlap"),
                    backfill=bool(data.get("backfill_missed")), catchup_window=data.get("catchup_window"),
                    jitter=data.get("jitter"), start_at=start_at, end_at=end_at, queue=data.get("queue") or None,
                    priority=data.get("priority") or 0, pause_on_failure=bool(data.get("pause_on_failure")))
            except WeftError as exc:
                self.add_error(None, str(exc))
        data["cron"] = cron or ""
        return data
