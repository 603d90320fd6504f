"""``docs``: the Swagger page of the API, for staff only (``openapi.json`` itself stays public: it says what the
routes are, not what the runs hold). It works offline: Swagger UI's script and stylesheet are the copies
django-ninja ships, served from here (no CDN, and no need for "ninja" in INSTALLED_APPS)."""

from __future__ import annotations

from pathlib import Path

import ninja
from django.contrib.admin.views.decorators import staff_member_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

ASSETS = {"swagger-ui-bundle.js": "application/javascript", "swagger-ui.css": "text/css"}
ASSET_DIR = Path(ninja.__file__).parent / "static" / "ninja"


@staff_member_required
def docs(request: HttpRequest) -> HttpResponse:
    def asset(name: str) -> str:
        return reverse("weft_api:docs_asset", args=[name])

    page = format_html(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>django_weft API</title>'
        '<link rel="stylesheet" href="{}"></head><body><div id="swagger-ui"></div>'
        '<script src="{}"></script>'
        '<script>SwaggerUIBundle({{url: "{}", dom_id: "#swagger-ui", deepLinking: true}});</script>'
        "</body></html>",
        asset("swagger-ui.css"), asset("swagger-ui-bundle.js"), reverse("weft_api:openapi-json"))
    return HttpResponse(page)


@staff_member_required
def docs_asset(request: HttpRequest, name: str) -> FileResponse:
    if name not in ASSETS:
        raise Http404(name)
    response = FileResponse(open(ASSET_DIR / name, "rb"), content_type=ASSETS[name])
    response["Cache-Control"] = "max-age=86400"
    return response
