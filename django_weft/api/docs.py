"""``docs``: the Swagger page of the API, for staff only (``openapi.json`` itself stays public: it says what the
routes are, not what the runs hold)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from ninja.openapi.docs import Swagger

from django_weft.api.app import api


@staff_member_required
def docs(request: HttpRequest) -> HttpResponse:
    return Swagger().render_page(request, api)
