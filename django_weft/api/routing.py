"""Routing by the path as the client sent it, so that every id that can be created can be addressed.

Django percent-decodes the path before it resolves URLs: ``runs/order%2F42/result`` arrives as
``runs/order/42/result``, which no ``runs/<workflow_id>/result`` matches, and ``runs/a%2Fresult`` (the run whose
id is ``a/result``) would be taken for the result of ``a``. So one URL pattern takes every path under the API and
:class:`Dispatcher` matches it against ninja's routes itself, segment by segment on the raw path that WSGI servers
(gunicorn, uWSGI, mod_wsgi, waitress: ``RAW_URI`` / ``REQUEST_URI``) and ASGI servers (``raw_path``) pass on: a
route's word matches only that exact text, and a parameter takes one segment, percent-decoded. An id with a ``/``
is addressed as ``%2F``; an id that is a route word (``count``) with a character of it encoded (``%63ount``).

Where the server passes no raw path (``runserver``, Django's test client) the decoded path is matched instead, a
parameter then taking one or more segments: ids with ``/`` still work unless what follows them in the id reads as a
route (``a/result``).

Among the routes a path matches, the one with the most words wins (``runs/count`` before ``runs/{workflow_id}``),
then the longest; and a route that does not take the request's method gives way to the next (``GET
runs/start_or_signal`` reads that run). No route: a JSON 404; routes, none for this method: a JSON 405.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes, urlsplit

from django.db import connections, transaction
from django.http import HttpRequest, HttpResponseNotAllowed
from django.http.response import HttpResponseBase
from django.urls import URLPattern

from django_weft.api.errors import error_response

if TYPE_CHECKING:
    from ninja import NinjaAPI

View = Callable[..., HttpResponseBase]
# A path segment: (as the client sent it, decoded).
Piece = tuple[str, str]


@dataclass(frozen=True)
class Route:
    parts: tuple[str, ...]  # words, and parameters as "<name>"
    view: View
    atomic: bool  # under ATOMIC_REQUESTS, in a transaction (the routes that wait or act on many are not)

    @property
    def words(self) -> int:
        return sum(not is_parameter(part) for part in self.parts)


def is_parameter(part: str) -> bool:
    return part.startswith("<") and part.endswith(">")


def parameter_name(part: str) -> str:
    return part[1:-1].rpartition(":")[2]  # "<workflow_id>", or "<str:workflow_id>" with a converter


def routes_of(patterns: Iterable[URLPattern], non_atomic: frozenset[str]) -> list[Route]:
    """ninja's URL patterns as routes, most specific first (ninja gives one pattern per operation: a path's
    operations share one view, which picks the operation by method)."""
    views: dict[str, View] = {}
    names: dict[str, set[str]] = {}
    for pattern in patterns:
        route = str(pattern.pattern)
        views.setdefault(route, pattern.callback)
        names.setdefault(route, set()).add(pattern.name or "")
    routes = [Route(tuple(route.split("/")), view, atomic=not names[route] & non_atomic)
              for route, view in views.items()]
    return sorted(routes, key=lambda route: (-route.words, -len(route.parts)))


def bind(parts: Sequence[str], pieces: Sequence[Piece], *, spanning: bool) -> dict[str, str] | None:
    """The parameters of a route whose ``parts`` match ``pieces``, or None. A word matches a piece as sent; a
    parameter takes one piece, or (``spanning``) as few as leave a match, joined by "/"."""
    if not parts:
        return {} if not pieces else None
    head, tail = parts[0], parts[1:]
    if not is_parameter(head):
        return bind(tail, pieces[1:], spanning=spanning) if pieces and pieces[0][0] == head else None
    widest = len(pieces) - len(tail) if spanning else min(1, len(pieces))
    for width in range(1, widest + 1):
        value = "/".join(decoded for _sent, decoded in pieces[:width])
        found = bind(tail, pieces[width:], spanning=spanning) if value else None
        if found is not None:
            return {parameter_name(head): value, **found}
    return None


def _decoded(segment: str) -> str | None:
    """A raw segment percent-decoded as Django decodes paths (UTF-8), or None if it is not valid."""
    try:
        return unquote_to_bytes(segment.encode("latin-1")).decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return None


def sent_path(request: HttpRequest) -> str | None:
    """The request's path as the client sent it (still percent-encoded), where the server passes it on."""
    scope = getattr(request, "scope", None)  # an ASGI request
    if isinstance(scope, dict) and isinstance(scope.get("raw_path"), bytes):
        return scope["raw_path"].decode("latin-1")
    for key in ("RAW_URI", "REQUEST_URI"):
        sent = request.META.get(key)
        if isinstance(sent, str) and sent:
            return sent.split("?", 1)[0].split("#", 1)[0] if sent.startswith("/") else urlsplit(sent).path
    return None


def sent_pieces(request: HttpRequest, rest: str) -> list[Piece] | None:
    """The segments of the raw path that decode to ``rest`` (the path under the API, decoded), or None when the
    server passed no raw path or it does not end in ``rest`` (a proxy rewrote it)."""
    sent = sent_path(request)
    if sent is None:
        return None
    segments = sent.split("/")
    tail: list[str] = []  # the last segments, decoded
    for start in range(len(segments) - 1, -1, -1):
        decoded = _decoded(segments[start])
        if decoded is None:
            return None
        tail.insert(0, decoded)
        if "/".join(tail) == rest:
            return list(zip(segments[start:], tail, strict=True))
    return None


class Dispatcher:
    """The view of every path under the API but the document's: see the module's docstring."""

    def __init__(self, api: NinjaAPI, patterns: Iterable[URLPattern], non_atomic: frozenset[str]) -> None:
        self.api = api
        self.routes = routes_of(patterns, non_atomic)
        # Django leaves this view alone (no CSRF check: ninja checks sessions itself; no transaction: each route
        # gets the one ATOMIC_REQUESTS asks for, see _run).
        self.csrf_exempt = True
        self._non_atomic_requests = set(connections)

    def matches(self, request: HttpRequest, rest: str) -> Iterator[tuple[Route, dict[str, str]]]:
        """The routes the path matches, in order: on the raw path, else (none there) on the decoded one."""
        found = False
        pieces = sent_pieces(request, rest)
        if pieces is not None:
            for route in self.routes:
                bound = bind(route.parts, pieces, spanning=False)
                if bound is not None:
                    found = True
                    yield route, bound
        if not found:
            decoded = [(segment, segment) for segment in rest.split("/")]
            for route in self.routes:
                bound = bind(route.parts, decoded, spanning=True)
                if bound is not None:
                    yield route, bound

    def __call__(self, request: HttpRequest, rest: str = "") -> HttpResponseBase:
        allowed: set[str] = set()
        for route, parameters in self.matches(request, rest):
            response = self._run(route, request, parameters)
            if not isinstance(response, HttpResponseNotAllowed):
                return response
            allowed.update(method.strip() for method in response["Allow"].split(","))
        if allowed:
            response = error_response(self.api, request, 405, "method_not_allowed",
                                      f"{request.method} is not allowed here: {', '.join(sorted(allowed))}")
            response["Allow"] = ", ".join(sorted(allowed))
            return response
        return error_response(self.api, request, 404, "not_found",
                              f"no route {request.method} {rest or '/'} (see openapi.json; percent-encode a '/' "
                              "in an id as %2F)")

    @staticmethod
    def _run(route: Route, request: HttpRequest, parameters: dict[str, Any]) -> HttpResponseBase:
        """Run the route's view as Django would have: in a transaction per database with ATOMIC_REQUESTS."""
        view = route.view
        if route.atomic:
            for alias in connections:
                if connections.settings[alias]["ATOMIC_REQUESTS"]:
                    view = transaction.atomic(using=alias)(view)
        return view(request, **parameters)
