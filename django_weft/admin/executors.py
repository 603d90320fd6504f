"""The executor admin: which processes execute runs now (heartbeat rows), read-only for everyone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _t
from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import ReadOnlyMixin, human_duration
from django_weft.common import clock
from django_weft.models import Executor
from django_weft.services import liveness


class AliveFilter(admin.SimpleListFilter):
    title = _("alive")
    parameter_name = "alive"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = clock.now()
        if self.value() == "yes":
            return queryset.filter(expires_at__gt=now)
        if self.value() == "no":
            return queryset.filter(expires_at__lte=now)
        return queryset


@admin.register(Executor)
class ExecutorAdmin(ReadOnlyMixin, admin.ModelAdmin):
    class Media:
        css = {"all": ("django_weft/admin.css",)}  # cells wrap: the list fits the screen

    """Rows are written by the processes themselves: inserted at start, refreshed every heartbeat, deleted
    at a clean stop; a dead process's row shows "alive: no" until the maintenance pass deletes it."""

    list_display = ("host", "pid", "kind", "threads", "version", "started_at", "last_seen", "last_seen_ago",
                    "alive")
    list_filter = (AliveFilter, "kind", "host")
    search_fields = ("host", "=pid")
    ordering = ("-last_seen",)
    actions = None
    show_full_result_count = False
    fields = ("id", "kind", "host", "pid", "threads", "version", "started_at", "last_seen", "last_seen_ago",
              "expires_at", "alive")
    readonly_fields = fields

    @admin.display(description=_("seen"))
    def last_seen_ago(self, obj: Executor) -> str:
        ago = max(clock.now() - obj.last_seen, timedelta(0))
        return _t("%(duration)s ago") % {"duration": human_duration(ago)}

    @admin.display(boolean=True, description=_("alive"))
    def alive(self, obj: Executor) -> bool:
        return liveness.is_alive(obj)
