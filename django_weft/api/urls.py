"""``path("weft/api/", include("django_weft.api.urls"))``: the HTTP API (needs ``django-weft[api]``)."""

from __future__ import annotations

from .app import api

urlpatterns = api.urls[0]
app_name = api.urls_namespace  # "weft_api": reverse("weft_api:...")
