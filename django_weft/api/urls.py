"""``path("weft/api/", include("django_weft.api.urls"))``: the HTTP API (needs ``django-weft[api]``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import URLPattern, path

from .app import api
from .docs import docs

# Routes that wait for a run (they would not see it move inside the request's transaction) and bulk operations
# (a transaction per run, by design): exempt from ATOMIC_REQUESTS.
NON_ATOMIC = frozenset({"run_result", "run_update", "run_update_reply", "bulk"})

urlpatterns: list[Any] = [*api.urls[0], path("docs", docs, name="docs")]
for pattern in urlpatterns:
    if isinstance(pattern, URLPattern) and pattern.name in NON_ATOMIC:
        for alias in settings.DATABASES:
            transaction.non_atomic_requests(using=alias)(pattern.callback)
app_name = api.urls_namespace  # "weft_api": reverse("weft_api:...")
