"""The API object: its routes, authentication, error handlers and the request size limit."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.parser import Parser

from django_weft import __version__
from django_weft.api import bulk, errors, published, queues, runs, schedules, step_controls, waits, webhooks
from django_weft.api.auth import AUTH
from django_weft.common import privacy
from django_weft.common.codec import MAX_DEPTH
from django_weft.conf import weft_settings
from django_weft.exceptions import PayloadTooDeep


class JsonBody(Parser):
    """ninja's JSON parser, except that a body nested too deeply for Python's parser is what it is, a payload too
    deep (422 payload_too_deep), not a body that is not JSON."""

    def parse_body(self, request: HttpRequest) -> Any:
        try:
            return json.loads(request.body)
        except RecursionError:
            raise PayloadTooDeep(f"the body is nested too deeply to read; payloads nest at most {MAX_DEPTH} "
                                 "levels") from None


api = NinjaAPI(
    title="django_weft", version=__version__, urls_namespace="weft_api", auth=AUTH, parser=JsonBody(),
    openapi_url="openapi.json", docs_url=None,
    description="Start, find, signal, query, update and cancel durable workflow runs, act on many and operate "
                "schedules. Authenticate with `Authorization: Bearer <API key>` (manage.py weft_api_key) or a "
                "Django session (unsafe methods then need the X-CSRFToken header). Errors are `{\"error\", \"code\"}`. "
                "Path parameters are percent-encoded, a `/` in an id as `%2F`; an id that is itself a route "
                "(`runs/count`) with a letter of it encoded (`runs/%63ount`).",
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
        token = privacy.remember()  # a route sets what its answer may show (auth.require): for this request only
        try:
            return view(request, *args, **kwargs)
        finally:
            privacy.restore(token)

    return bounded


api.add_decorator(_bounded, mode="view")
api.add_router("", runs.router)
api.add_router("", schedules.router)
api.add_router("", waits.router)
api.add_router("", bulk.router)
api.add_router("", webhooks.router)
api.add_router("", queues.router)
api.add_router("", published.router)
api.add_router("", step_controls.router)
