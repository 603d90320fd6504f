"""The API key admin: list keys, make one (shown once, on the page that answers the add form), revoke.

The key itself is never stored: not in the row (prefix and hash only), not in a message (messages live in the
session or a cookie), so the add form's answer is a page showing it, sent with ``Cache-Control: no-store``.
The hash is never shown. Keys are read-only once made; revoking is an operation like a run's cancel.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.cache import patch_cache_control
from django.utils.translation import gettext_lazy as _

from django_weft.admin.common import Operation, OperationsMixin, moment
from django_weft.models import ApiKey
from django_weft.services import api_keys

SHOWN_FIELDS = ("name", "prefix", "permission_list", "created_at", "created_by", "last_used_at", "revoked_at")


def _permission_choices(request: HttpRequest) -> list[tuple[str, str]]:
    """The permissions the user may give a key: the ones they hold (a key must not do more than its maker)."""
    rows = Permission.objects.filter(content_type__app_label="django_weft").order_by("content_type__model",
                                                                                      "codename")
    return [(f"django_weft.{p.codename}", f"django_weft.{p.codename}: {p.name}") for p in rows
            if request.user.has_perm(f"django_weft.{p.codename}")]


class ApiKeyAddForm(forms.ModelForm):
    permissions = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label=_("permissions"),
        help_text=_("What the key may do, checked per request as for a user with these permissions."))

    class Meta:
        model = ApiKey
        fields = ("name", "permissions")

    request: HttpRequest  # set by ApiKeyAdmin.get_form

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["permissions"].choices = _permission_choices(self.request)  # type: ignore[attr-defined]


def _revoke(request: HttpRequest, key: ApiKey) -> str:
    api_keys.revoke(key.name)
    return ""


API_KEY_OPERATIONS = {
    "revoke": Operation("revoke", _("Revoke"), _("revoked"), "change",
                        lambda qs: qs.filter(revoked_at__isnull=True), _revoke,
                        explanation=_("A revoked key authenticates no more, at once; this cannot be undone (make "
                                      "a new key instead)."), destructive=True),
}


class RevokedFilter(admin.SimpleListFilter):
    title = _("revoked")
    parameter_name = "revoked"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("no", _("No")), ("yes", _("Yes"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in ("yes", "no"):
            return queryset.filter(revoked_at__isnull=self.value() == "no")
        return queryset


@admin.register(ApiKey)
class ApiKeyAdmin(OperationsMixin, admin.ModelAdmin):
    class Media:
        css = {"all": ("django_weft/admin.css",)}  # cells wrap: the list fits the screen

    operations = API_KEY_OPERATIONS
    list_display = ("name", "prefix", "permission_list", "created_shown", "last_used_shown", "revoked_shown")
    list_filter = (RevokedFilter,)
    search_fields = ("name", "=prefix")
    actions = ("revoke_selected",)
    change_form_template = "admin/django_weft/apikey/change_form.html"
    key_created_template = "admin/django_weft/apikey/key_created.html"

    # Compact times (the admin's zone, named), so that the list fits the screen.
    @admin.display(description=_("created"), ordering="created_at")
    def created_shown(self, key: ApiKey) -> str:
        return moment(key.created_at)

    @admin.display(description=_("last used"), ordering="last_used_at")
    def last_used_shown(self, key: ApiKey) -> str:
        return moment(key.last_used_at)

    @admin.display(description=_("revoked"), ordering="revoked_at")
    def revoked_shown(self, key: ApiKey) -> str:
        return moment(key.revoked_at)

    def get_form(self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = type("ApiKeyAddForm", (ApiKeyAddForm,), {"request": request})
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        return ("name", "permissions") if obj is None else SHOWN_FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        return () if obj is None else SHOWN_FIELDS

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None) -> HttpResponse:
        key = self.get_object(request, object_id)
        # Every field is read-only, so there is nothing to save; revoking is a button.
        extra_context = {**(extra_context or {}), "show_save": False, "show_save_and_continue": False,
                         "show_save_and_add_another": False,
                         "weft_buttons": self.available_operations(request, key) if key else []}
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            return  # every field of a made key is read-only: nothing to write
        record, key = api_keys.create(form.cleaned_data["name"], form.cleaned_data["permissions"],
                                      created_by=f"{request.user.get_username()} in the admin")
        for field in ApiKey._meta.concrete_fields:
            setattr(obj, field.attname, getattr(record, field.attname))
        obj._state.adding = False
        obj.shown_once = key  # type: ignore[attr-defined]  # for response_add only; not a field

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "title": _("API key created"), "opts": self.opts,
                   "app_label": self.opts.app_label, "original": obj, "key": obj.shown_once}  # type: ignore[attr-defined]
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, self.key_created_template, context)
        patch_cache_control(response, no_store=True, no_cache=True, private=True)
        return response

    @admin.action(description=_("Revoke selected API keys"), permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.run_operation(request, queryset, "revoke")

    @admin.display(description=_("permissions"))
    def permission_list(self, key: ApiKey) -> str:
        return ", ".join(key.permissions or []) or "—"
