"""Webhook endpoints that complete or fail async activities, for systems that cannot import Python.

POST a JSON body: ``{"token": "...", "result": ...}`` to ``complete/``, ``{"token": "...", "error":
{"message": "...", "type": "..."}}`` (or a message string) to ``fail/``. The token is the only
credential (signed, single-use), so the views are CSRF-exempt. Status codes: 200 done, 400 bad request,
404 unknown or forged token, 409 already resolved, 413 too large.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .activities import complete_async_activity, fail_async_activity
from .conf import weft_settings
from .exceptions import InvalidArgument, InvalidTaskToken, PayloadNotSerializable, PayloadTooLarge, TaskTokenAlreadyUsed


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"ok": False, "error": message}, status=status)


def _handle(request: HttpRequest, field: str, action: Callable[[str, Any], None]) -> JsonResponse:
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
        return _error(400, "the JSON body is nested too deeply")
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        return _error(400, 'the body must be a JSON object with a "token" string')
    if field == "error" and "error" not in data:
        return _error(400, 'the body needs an "error" (a message or {"message": ..., "type": ...})')
    try:
        action(data["token"], data.get(field))
    except RecursionError:
        return _error(400, f"the {field} is nested too deeply to store")
    except TaskTokenAlreadyUsed as exc:
        return _error(409, str(exc))
    except InvalidTaskToken as exc:
        return _error(404, str(exc))
    except PayloadTooLarge as exc:
        return _error(413, str(exc))
    except (PayloadNotSerializable, InvalidArgument) as exc:
        return _error(400, str(exc))
    return JsonResponse({"ok": True})


@csrf_exempt
@require_POST
def complete(request: HttpRequest) -> JsonResponse:
    return _handle(request, "result", complete_async_activity)


@csrf_exempt
@require_POST
def fail(request: HttpRequest) -> JsonResponse:
    return _handle(request, "error", fail_async_activity)
