"""The test project's Celery app (WEFT_EXECUTOR=celery): the standard Django setup, settings under CELERY_*."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
