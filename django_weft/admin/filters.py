"""The run changelist's filters by version, by tag and by each declared search attribute (WEFT_SEARCH_ATTRIBUTES),
and the run page's list of its attributes.

Every filter narrows the changelist through :func:`django_weft.services.visibility.runs_matching`, so the admin and
``weft.list_runs`` match the same runs by the same rules; a value the rules refuse (a word where a number goes)
is shown as an error and matches nothing, rather than being dropped and matching everything.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.common import attributes
from django_weft.common.registry import registered_versions, registered_workflow_names
from django_weft.exceptions import ConfigurationError, InvalidArgument
from django_weft.models import Workflow
from django_weft.services import visibility

# Versions offered as choices, at most (a higher one still filters from the URL).
MAX_VERSIONS_LISTED = 50
INPUT_TEMPLATE = "admin/django_weft/workflow/input_filter.html"


def _narrow(request: HttpRequest, queryset: QuerySet, title: Any, **filters: Any) -> QuerySet:
    """``queryset`` and the runs ``filters`` match; none, with an error message, if the rules refuse one."""
    try:
        return queryset & visibility.runs_matching(**filters)
    except InvalidArgument as exc:
        messages.error(request, f"{title}: {exc}")
        return queryset.none()


class VersionFilter(admin.SimpleListFilter):
    """The versions registered workflows have (no SELECT DISTINCT over the runs table)."""

    title = _("version")
    parameter_name = "version"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        highest = max((v for name in registered_workflow_names() for v in registered_versions(name)), default=0)
        return [(str(v), str(v)) for v in range(1, min(highest, MAX_VERSIONS_LISTED) + 1)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        return _narrow(request, queryset, self.title, version=int(value) if value.isdigit() else value)


class LineageFilter(admin.SimpleListFilter):
    """Top-level runs (no parent) or child runs."""

    title = _("lineage")
    parameter_name = "lineage"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("top", _("top-level only")), ("child", _("child runs only"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "top":
            return queryset.filter(parent__isnull=True)
        if self.value() == "child":
            return queryset.filter(parent__isnull=False)
        return queryset


class InputFilter(admin.ListFilter):
    """A filter typed into a small form: each of ``inputs`` (suffix, label, HTML input type) is a parameter."""

    template = INPUT_TEMPLATE
    parameter = ""
    inputs: tuple[tuple[str, Any, str], ...] = (("", _("is"), "text"),)

    def __init__(self, request: HttpRequest, params: dict[str, list[str]], model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        self.values: dict[str, str] = {}  # the boxes filled in, by parameter
        for name in self.parameters():
            if name in params:
                value = params.pop(name)[-1].strip()
                if value:
                    self.values[name] = self.used_parameters[name] = value

    def parameters(self) -> list[str]:
        return [self.parameter + suffix for suffix, _label, _type in self.inputs]

    def expected_parameters(self) -> list[str | None]:
        return list(self.parameters())

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Iterator[dict[str, Any]]:
        ours = set(self.parameters())
        yield {
            "fields": [{"name": self.parameter + suffix, "label": label, "type": kind,
                        "value": self.values.get(self.parameter + suffix, "")}
                       for suffix, label, kind in self.inputs],
            "hidden": [(k, v) for k, v in changelist.params.items() if k not in ours],
            "active": bool(self.values),
            "clear": changelist.get_query_string(remove=list(ours)),
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if not self.values:
            return queryset
        try:
            filters = self.filters()
        except InvalidArgument as exc:
            messages.error(request, f"{self.title}: {exc}")
            return queryset.none()
        return _narrow(request, queryset, self.title, **filters)

    def filters(self) -> dict[str, Any]:
        raise NotImplementedError


class TagFilter(InputFilter):
    """Runs that have every tag given (comma-separated)."""

    title = _("tag")
    parameter = "tag"
    inputs = (("", _("has (a, b: both)"), "text"),)

    def filters(self) -> dict[str, Any]:
        return {"tags": [tag.strip() for tag in self.values["tag"].split(",") if tag.strip()]}


# Per attribute type: (parameter suffix, the lookup it is, its label, the HTML input type).
_EQUAL = ("", "exact", _("is"))
_FROM = ("__gte", "gte", _("from"))
_TO = ("__lte", "lte", _("to"))
INPUTS: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "int": (_EQUAL, _FROM, _TO),
    "decimal": (_FROM, _TO),
    "datetime": (_FROM, _TO),
    "keyword": (_EQUAL,),
    "keyword_list": (("", "exact", _("has")),),
    "text": (("__contains", "contains", _("contains")),),
}
HTML_TYPES = {"int": "number", "datetime": "datetime-local"}
# An attribute's changelist parameters are this, its name and a suffix of INPUTS (admin/bulk maps them back).
ATTRIBUTE_PREFIX = "attr_"


class AttributeFilter(InputFilter):
    """One declared attribute: equality, a from/to range (inclusive) or, for text, contains."""

    attribute = ""
    kind = ""
    lookups: dict[str, str] = {}

    def filters(self) -> dict[str, Any]:
        conditions = {}
        for parameter, value in self.values.items():
            lookup = self.lookups[parameter]
            key = self.attribute if lookup == "exact" else f"{self.attribute}__{lookup}"
            conditions[key] = self.typed(value)
        return {"attributes": conditions}

    def typed(self, value: str) -> Any:
        """The text typed, as the attribute's type takes it (the rules themselves are finding's)."""
        if self.kind == "int":
            try:
                return int(value)
            except ValueError:
                raise InvalidArgument(_t("%(value)r is not a whole number") % {"value": value}) from None
        if self.kind == "datetime":
            moment = parse_datetime(value)
            if moment is None and (day := parse_date(value)) is not None:
                moment = datetime(day.year, day.month, day.day)
            if moment is None:
                raise InvalidArgument(_t("%(value)r is not a date and time (YYYY-MM-DD HH:MM)") % {"value": value})
            return timezone.make_aware(moment) if timezone.is_naive(moment) else moment
        return value


class BoolAttributeFilter(admin.SimpleListFilter):
    attribute = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("1", _("Yes")), ("0", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value not in ("0", "1"):
            return queryset
        return _narrow(request, queryset, self.title, attributes={self.attribute: value == "1"})


def attribute_filters() -> list[type]:
    """A filter class per attribute WEFT_SEARCH_ATTRIBUTES declares (read per request: it is a setting)."""
    classes: list[type] = []
    for name, kind in sorted(attributes.declared().items()):
        title = name.replace("_", " ")
        parameter = f"{ATTRIBUTE_PREFIX}{name}"
        if kind == "bool":
            classes.append(type(f"{name}_filter", (BoolAttributeFilter,),
                                {"title": title, "parameter_name": parameter, "attribute": name}))
            continue
        inputs = tuple((suffix, label, HTML_TYPES.get(kind, "text")) for suffix, _lookup, label in INPUTS[kind])
        classes.append(type(f"{name}_filter", (AttributeFilter,), {
            "title": title, "parameter": parameter, "attribute": name, "kind": kind, "inputs": inputs,
            "lookups": {parameter + suffix: lookup for suffix, lookup, _label in INPUTS[kind]}}))
    return classes


# --- the run page --------------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)


def attribute_listing(run: Workflow) -> str:
    """The run's search attributes as a table: name, declared type, value (all escaped)."""
    values = run.search_attributes or {}
    if not isinstance(values, dict) or not values:
        return "—"
    try:
        kinds = attributes.declared()
    except ConfigurationError:
        kinds = {}
    body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", (
        (name, kinds.get(name, _t("not declared")), _shown(value)) for name, value in sorted(values.items())))
    return format_html('<table class="weft-attributes"><thead><tr><th>{}</th><th>{}</th><th>{}</th></tr></thead>'
                       "<tbody>{}</tbody></table>", _t("name"), _t("type"), _t("value"), body)
