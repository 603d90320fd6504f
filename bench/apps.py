from __future__ import annotations

from django.apps import AppConfig


class WeftBenchConfig(AppConfig):
    """Adds ``manage.py weft_bench``; no models, no migrations, no workflows registered at start-up."""

    name = "bench"
    label = "weft_bench"
    verbose_name = "django_weft benchmarks"
