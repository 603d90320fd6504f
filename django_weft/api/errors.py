"""Every API error as ``{"error": message, "code": stable code}``.

The codes are part of the API (clients branch on them); the messages are for people. django_weft's own
exceptions map by class (the most specific first); ninja's validation and authentication errors and Django's
404 join them. Nothing a client sends should produce a 500: what is not listed here is a bug.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import Http404, HttpRequest, HttpResponse
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError

from django_weft import exceptions as weft

if TYPE_CHECKING:
    from ninja import NinjaAPI

# exception class -> (HTTP status, code), most specific first: the first that matches wins.
WEFT_ERRORS: tuple[tuple[type[Exception], int, str], ...] = (
    (weft.PayloadTooDeep, 422, "payload_too_deep"),
    (weft.PayloadTooLarge, 413, "payload_too_large"),
    (weft.PayloadNotSerializable, 422, "payload_not_serializable"),
    (weft.WorkflowNotRegistered, 422, "unknown_workflow"),
    (weft.IdempotencyKeyPurged, 409, "idempotency_key_purged"),
    (weft.WorkflowAlreadyExists, 409, "workflow_already_exists"),
    (weft.WorkflowClosed, 409, "workflow_closed"),
    (weft.TransitionNotAllowed, 409, "transition_not_allowed"),
    (weft.BulkConfirmationError, 409, "bulk_set_changed"),
    (weft.StartOrSignalConflict, 409, "start_or_signal_conflict"),
    (weft.ScheduleAlreadyExists, 409, "schedule_already_exists"),
    (weft.TaskTokenAlreadyUsed, 409, "token_already_used"),
    (weft.InvalidTaskToken, 404, "invalid_token"),
    (weft.WorkflowNotFound, 404, "workflow_not_found"),
    (weft.ScheduleNotFound, 404, "schedule_not_found"),
    (weft.QueryNotFound, 422, "query_not_found"),
    (weft.QueryFailed, 422, "query_failed"),
    (weft.UpdateRejected, 422, "update_rejected"),
    (weft.UpdateFailed, 422, "update_failed"),
    (weft.WaitTimeout, 408, "timeout"),
    (weft.InvalidArgument, 422, "invalid_argument"),
    (weft.PayloadError, 422, "invalid_payload"),
)

# Statuses raised with ApiError / HttpError without a code of their own.
STATUS_CODES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 408: "timeout", 409: "conflict", 413: "payload_too_large",
                422: "invalid_argument"}


class ApiError(HttpError):
    """An error a route raises itself: ``ApiError(403, "forbidden", "you may not cancel runs")``."""

    def __init__(self, status_code: int, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(status_code, message)
        self.code = code
        self.extra = extra or {}  # fields beside error and code (declared in the route's error schema)


def error_response(api: NinjaAPI, request: HttpRequest, status: int, code: str, message: str,
                   extra: dict[str, Any] | None = None) -> HttpResponse:
    return api.create_response(request, {"error": message, "code": code, **(extra or {})}, status=status)


def weft_status(exc: Exception) -> tuple[int, str] | None:
    for cls, status, code in WEFT_ERRORS:
        if isinstance(exc, cls):
            return status, code
    return None


# The names pydantic gives the branches of a union in an error's location ("str", "function-wrap[...]", a class).
_BRANCH_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_branch(part: object) -> bool:
    text = str(part)
    return text in _BRANCH_TYPES or "[" in text or text[:1].isupper()


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors[:5]:
        loc = list(error.get("loc", ()))
        unknown = error.get("type") == "extra_forbidden"
        named = loc.pop() if unknown and loc else None  # the client's text: whatever it looks like, it stays
        where = ".".join([*(str(part) for part in loc if part not in ("body", "payload") and not _is_branch(part)),
                          *([str(named)] if named is not None else [])])
        what = "unknown field" if unknown else error.get("msg", "invalid")
        parts.append(f"{where}: {what}" if where else str(what))
    return "; ".join(parts) or "invalid request"


def install(api: NinjaAPI) -> None:
    """Replace ninja's error bodies (``{"detail": ...}``) with ours, and map django_weft's exceptions.
    (ninja types a handler's exception as the class or an instance, hence ``Any``.)"""

    def on_weft_error(request: HttpRequest, exc: Any) -> HttpResponse:
        mapped = weft_status(exc)
        if mapped is None:
            raise exc
        return error_response(api, request, mapped[0], mapped[1], str(exc))

    def on_http_error(request: HttpRequest, exc: Any) -> HttpResponse:
        if isinstance(exc.__cause__, weft.WeftError):  # ninja wraps what the body parser raised
            return on_weft_error(request, exc.__cause__)
        status = exc.status_code
        if isinstance(exc, AuthenticationError):
            response = error_response(api, request, 401, "unauthenticated", str(exc) if exc.message != "Unauthorized"
                                      else "authentication required: Authorization: Bearer <API key>, or a session")
            response["WWW-Authenticate"] = 'Bearer realm="django_weft"'  # RFC 7235: a 401 names its scheme
            return response
        if isinstance(exc, AuthorizationError):
            return error_response(api, request, 403, "forbidden", str(exc) or "forbidden")
        code = getattr(exc, "code", None) or STATUS_CODES.get(status, "error")
        message = str(exc)
        if status == 400 and message.startswith("Cannot parse request body"):
            message = "the body must be JSON"
        if status == 403 and "CSRF" in message:
            code, message = "csrf_failed", "CSRF check failed: send the X-CSRFToken header with a session"
        return error_response(api, request, status, code, message, getattr(exc, "extra", None))

    def on_validation_error(request: HttpRequest, exc: Any) -> HttpResponse:
        return error_response(api, request, 422, "invalid_request", _validation_message(exc))

    def on_404(request: HttpRequest, exc: Any) -> HttpResponse:
        return error_response(api, request, 404, "not_found", str(exc) or "not found")

    api.add_exception_handler(weft.WeftError, on_weft_error)
    api.add_exception_handler(HttpError, on_http_error)
    api.add_exception_handler(ValidationError, on_validation_error)
    api.add_exception_handler(Http404, on_404)
