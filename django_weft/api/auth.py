"""Who calls, and what they may do.

Two ways in: an API key (``Authorization: Bearer weft_...``, see :mod:`django_weft.services.api_keys`) or the Django
session of a logged-in user (the admin's own pages; unsafe methods then need the CSRF token). Either way
each operation checks one model permission, the same the admin checks (``django_weft.cancel_workflow``...):
a key holds its permissions, a user has them through Django's auth (superusers have all).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.errors import AuthenticationError
from ninja.security import HttpBearer, SessionAuth

from django_weft.api.errors import ApiError
from django_weft.common import privacy
from django_weft.models import ApiKey
from django_weft.services import api_keys

APP = "django_weft"


class BearerKey(HttpBearer):
    """``Authorization: Bearer <key>``, the scheme in any case and the key after one or more spaces (RFC 7235). A
    request that sends a key is judged by it: a wrong or revoked one is 401, whatever session the browser has."""

    def __call__(self, request: HttpRequest) -> ApiKey | None:
        scheme, _, key = request.headers.get(self.header, "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return None  # no key: a session may do
        found = self.authenticate(request, key.strip())
        if found is None:
            raise AuthenticationError(message="the API key is unknown or revoked")
        return found

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        return api_keys.authenticate(token)


def _session_user(request: HttpRequest) -> Any:
    """The logged-in, active user of the request's session, or None."""
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated and user.is_active else None


class StaffSession(SessionAuth):
    """A logged-in, active user (permissions are checked per operation). Unsafe methods need the CSRF token, which
    is asked for only when there is a session to protect: without one the answer is 401, on every method."""

    def __call__(self, request: HttpRequest) -> Any:
        if _session_user(request) is None:
            return None
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return _session_user(request)


AUTH = [BearerKey(), StaffSession()]


def permitted(request: HttpRequest, codename: str) -> bool:
    permission = f"{APP}.{codename}"
    principal = getattr(request, "auth", None)
    if isinstance(principal, ApiKey):
        return api_keys.has_permission(principal, permission)
    return bool(principal is not None and principal.has_perm(permission))


def require(request: HttpRequest, codename: str) -> None:
    """Refuse with 403 unless the caller holds ``django_weft.<codename>``."""
    if not permitted(request, codename):
        raise ApiError(403, "forbidden", f"this operation needs the permission {APP}.{codename}")
    # What the answer may show (a stream's events are sent after the view returns: set, not scoped).
    privacy.set_for_this_request(permitted(request, privacy.PERMISSION))


def caller(request: HttpRequest) -> str:
    """Who called, for audit records and reasons: ``key:<name>`` or the user name."""
    principal = getattr(request, "auth", None)
    if isinstance(principal, ApiKey):
        return f"key:{principal.name}"
    return principal.get_username() if principal is not None else "anonymous"
