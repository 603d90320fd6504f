"""The HTTP API: ``path("weft/api/", include("django_weft.api.urls"))`` (design 8.6).

JSON over the same client, finding and bulk functions as Python callers use. It needs the extra
``django-weft[api]`` (django-ninja); nothing here is imported unless the project includes these URLs.

- ``app``: the API object, its authentication and error handlers;
- ``auth``: API keys (``Authorization: Bearer``) and Django sessions, and the permission check per operation;
- ``errors``: every error as ``{"error": message, "code": stable code}`` with its HTTP status;
- ``schemas``: request and response bodies (the OpenAPI document is written from them);
- ``routing``: matches each path, as the client sent it, to its route (ids may hold "/", percent-encoded);
- one module of routes per resource (``runs``, ``schedules``...).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    import ninja  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in the test environment
    raise ImproperlyConfigured(
        "django_weft.api needs django-ninja: pip install 'django-weft[api]'") from exc
