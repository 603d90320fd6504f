"""Webhook endpoints that complete, fail or heartbeat async activities, for systems that cannot import Python.

POST a JSON body: ``{"token": "...", "result": ...}`` to ``complete/``, ``{"token": "...", "error":
{"message": "...", "type": "..."}}`` (or a message string) to ``fail/``, ``{"token": "...", "details": ...}``
(details optional) to ``heartbeat/``, which answers ``{"ok": true, "cancelled": false}`` (true: stop, the
attempt was cancelled). The token is the only credential (signed; single-use for a resolution), so the views
are CSRF-exempt. Status codes: 200 done, 400 bad request, 404 unknown or forged token, 409 already resolved,
413 too large, 422 nested deeper than a payload may be (django_weft.common.codec.MAX_DEPTH). The HTTP API
offers the same (``POST weft/api/complete``, ``fail`` and ``heartbeat``) through :func:`resolve` and
:func:`beat`, with its error format.

``metrics/`` (GET) answers Prometheus' text format: to anyone with ``WEFT_METRICS_PUBLIC = True``, else to a
staff user or a request with ``Authorization: Bearer <WEFT_METRICS_TOKEN>`` (the scheme in any case; 401
without credentials, 403 with wrong ones); 501 when metrics are off or prometheus-client is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from django_weft.common.codec import MAX_DEPTH
from django_weft.conf import weft_settings
from django_weft.exceptions import (
    InvalidArgument,
    InvalidTaskToken,
    PayloadNotSerializable,
    PayloadTooDeep,
    PayloadTooLarge,
    TaskTokenAlreadyUsed,
)
from django_weft.observability import events
from django_weft.observability.access import bearer_token, is_metrics_token
from django_weft.runtime.activities import complete_async_activity, fail_async_activity
from django_weft.runtime.heartbeats import heartbeat_async

# What resolving an async activity can meet: (exception, HTTP status, the HTTP API's code), the first match wins.
REFUSALS: tuple[tuple[type[Exception], int, str], ...] = (
    (PayloadTooDeep, 422, "payload_too_deep"),
    (TaskTokenAlreadyUsed, 409, "token_already_used"),
    (InvalidTaskToken, 404, "invalid_token"),
    (PayloadTooLarge, 413, "payload_too_large"),
    (PayloadNotSerializable, 400, "invalid_payload"),
    (InvalidArgument, 400, "invalid_payload"),
)
ACTIONS: dict[str, Callable[[str, Any], None]] = {"result": complete_async_activity, "error": fail_async_activity}


class Refused(Exception):
    """Why a completion was refused: ``status``, ``code`` (the HTTP API's) and the message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def resolve(field: str, token: str, value: Any) -> None:
    """Complete (``field="result"``) or fail (``"error"``) the async activity of ``token``; these views and the
    HTTP API's ``complete`` and ``fail`` both call it. Raises :class:`Refused`."""
    with _refusals():
        ACTIONS[field](token, value)


def beat(token: str, details: Any) -> bool:
    """Heartbeat the async activity of ``token``; True if it was cancelled. For ``heartbeat/`` and the HTTP API's
    ``heartbeat``. Raises :class:`Refused`."""
    with _refusals():
        cancelled = heartbeat_async(token, details)
    return cancelled


@contextmanager
def _refusals() -> Iterator[None]:
    """Turn what a token's call can meet (REFUSALS) into :class:`Refused`."""
    try:
        yield
    except Exception as exc:
        for cls, status, code in REFUSALS:
            if isinstance(exc, cls):
                raise Refused(status, code, str(exc)) from exc
        raise


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"ok": False, "error": message}, status=status)


def _handle(request: HttpRequest, field: str) -> JsonResponse:
    data = _read_body(request, field)
    if isinstance(data, JsonResponse):
        return data
    try:
        if field == "details":
            return JsonResponse({"ok": True, "cancelled": beat(data["token"], data.get(field))})
        resolve(field, data["token"], data.get(field))
    except Refused as refused:
        return _error(refused.status, str(refused))
    return JsonResponse({"ok": True})


def _read_body(request: HttpRequest, field: str) -> dict | JsonResponse:
    """The JSON object posted, holding a "token" string and at most ``field`` besides; else the error to answer."""
    limit = weft_settings.MAX_REQUEST_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return _error(400, "invalid Content-Length")
    if declared > limit:
        return _error(413, f"request body over {limit} bytes")
    body = request.read(limit + 1)
    if len(body) > limit:
        return _error(413, f"request body over {limit} bytes")
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "the body must be JSON")
    except RecursionError:
        return _error(422, f"the JSON body is nested too deeply to read; payloads nest at most {MAX_DEPTH} levels")
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        return _error(400, 'the body must be a JSON object with a "token" string')
    unknown = sorted(set(data) - {"token", field})
    if unknown:  # a misspelt "result" would complete the activity with null
        return _error(400, f'unknown field {unknown[0]!r}: the body holds "token" and "{field}"')
    if field == "error" and "error" not in data:
        return _error(400, 'the body needs an "error" (a message or {"message": ..., "type": ...})')
    return data


@csrf_exempt
@require_POST
def complete(request: HttpRequest) -> JsonResponse:
    return _handle(request, "result")


@csrf_exempt
@require_POST
def fail(request: HttpRequest) -> JsonResponse:
    return _handle(request, "error")


@csrf_exempt
@require_POST
def heartbeat(request: HttpRequest) -> JsonResponse:
    return _handle(request, "details")


def _may_read_metrics(request: HttpRequest) -> int | None:
    """None if the request may read the metrics, else the HTTP status that refuses it."""
    if weft_settings.METRICS_PUBLIC:
        return None
    given = bearer_token(request.headers.get("Authorization", ""))
    if weft_settings.METRICS_TOKEN and given is not None:
        return None if is_metrics_token(given) else 403
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return None if user.is_active and user.is_staff else 403
    return 401


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    module = events.metrics()
    if module is None:
        return HttpResponse("metrics are off: install prometheus-client (pip install 'django-weft[metrics]') and "
                            "leave WEFT_METRICS unset or True\n", status=501, content_type="text/plain")
    refused = _may_read_metrics(request)
    if refused is not None:
        response = HttpResponse("staff login or Authorization: Bearer <WEFT_METRICS_TOKEN> needed\n",
                                status=refused, content_type="text/plain")
        if refused == 401:
            response["WWW-Authenticate"] = 'Bearer realm="django_weft metrics"'
        return response
    return HttpResponse(module.render(), content_type=module.CONTENT_TYPE)
