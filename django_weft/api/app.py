"""The API object: its routes, authentication, error handlers and the request size limit."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI

from .. import __version__
from ..conf import weft_settings
from . import bulk, errors, runs, schedules, waits, webhooks
from .auth import AUTH

api = NinjaAPI(
    title="django_weft", version=__version__, urls_namespace="weft_api", auth=AUTH,
    openapi_url="openapi.json", docs_url=None,
    description="Start, find, signal, query, update and cancel durable workflow runs, act on many and operate "
                "schedules. Authenticate with `Authorization: Bearer <API key>` (manage.py weft_api_key) or a "
                "Django session (unsafe methods then need the X-CSRFToken header). Errors are `{\"error\", \"code\"}`.",
)
errors.install(api)


def _bounded(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Refuse a body over WEFT_MAX_REQUEST_BYTES with 413 before anything parses it."""

    @wraps(view)
    def bounded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        limit = weft_settings.MAX_REQUEST_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return errors.error_response(api, request, 400, "bad_request", "invalid Content-Length")
        if declared > limit or len(request.body) > limit:
            return errors.error_response(api, request, 413, "request_too_large",
                                         f"the request body is over WEFT_MAX_REQUEST_BYTES ({limit} bytes)")
        return view(request, *args, **kwargs)

    return bounded


api.add_decorator(_bounded, mode="view")
api.add_router("", runs.router)
api.add_router("", schedules.router)
api.add_router("", waits.router)
api.add_router("", bulk.router)
api.add_router("", webhooks.router)
