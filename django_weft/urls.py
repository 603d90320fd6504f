"""``path("weft/", include("django_weft.urls"))`` exposes the async-activity completion webhooks."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "django_weft"

urlpatterns = [
    path("complete/", views.complete, name="complete"),
    path("fail/", views.fail, name="fail"),
]
