"""``path("weft/api/", include("django_weft.api.urls"))``: the HTTP API (needs ``django-weft[api]``)."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path, re_path

from django_weft.api.app import api
from django_weft.api.docs import docs, docs_asset
from django_weft.api.routing import Dispatcher

# Routes that wait for a run (they would not see it move inside the request's transaction) and bulk operations
# (a transaction per run, by design): exempt from ATOMIC_REQUESTS.
NON_ATOMIC = frozenset({"run_result", "run_update", "run_update_reply", "bulk", "run_event", "run_stream"})

_ninja = [pattern for pattern in api.urls[0] if isinstance(pattern, URLPattern)]
_document = [pattern for pattern in _ninja if pattern.name == "openapi-json"]
_operations = [pattern for pattern in _ninja if pattern.name not in ("openapi-json", "api-root")]
dispatch = Dispatcher(api, _operations, NON_ATOMIC)

urlpatterns: list[Any] = [
    *_document,
    path("docs", docs, name="docs"),
    path("docs/assets/<str:name>", docs_asset, name="docs_asset"),
    # Every other path, ids with "/" and route words included, by the path as sent (django_weft.api.routing);
    # "api-root" is the name ninja finds the API's prefix by.
    path("", dispatch, name="api-root"),
    re_path(r"^(?P<rest>[\s\S]+)$", dispatch, name="route"),  # not <path:>, whose "." stops at a newline
    # Never reached (the pattern above takes every path): kept so that reverse("weft_api:<operation>") works.
    *_operations,
]
app_name = api.urls_namespace  # "weft_api": reverse("weft_api:...")
