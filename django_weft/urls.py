"""``path("weft/", include("django_weft.urls"))`` exposes the async-activity completion and heartbeat webhooks and the
Prometheus metrics (``metrics/``: see django_weft.views.metrics for who may read them)."""

from __future__ import annotations

from django.urls import path

from django_weft import views

app_name = "django_weft"

urlpatterns = [
    path("complete/", views.complete, name="complete"),
    path("fail/", views.fail, name="fail"),
    path("heartbeat/", views.heartbeat, name="heartbeat"),
    path("metrics/", views.metrics, name="metrics"),
]
