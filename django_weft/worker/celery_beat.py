"""``manage.py weft_maintenance --install-beat``: the maintenance pass as a django-celery-beat periodic task."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.apps import apps
from django.db import transaction

from django_weft.conf import weft_settings
from django_weft.exceptions import ConfigurationError

PERIODIC_TASK_NAME = "django_weft maintenance"
TASK = "django_weft.maintenance"


@dataclass
class BeatInstall:
    created: bool
    every: int


def install_beat(every: int) -> BeatInstall:
    """Create or update the PeriodicTask (and its IntervalSchedule) that sends ``django_weft.services.maintenance``
    every ``every`` seconds to a beat running ``django_celery_beat.schedulers:DatabaseScheduler``."""
    if every < 1:
        raise ValueError("--every must be at least 1 second")
    if not apps.is_installed("django_celery_beat"):
        raise ConfigurationError(
            "django_celery_beat is not in INSTALLED_APPS: pip install 'django-weft[celery]', add "
            "'django_celery_beat' to INSTALLED_APPS and run migrate"
        )
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    with transaction.atomic():
        # Not get_or_create: django-celery-beat does not make (every, period) unique, so duplicates may exist.
        interval = IntervalSchedule.objects.filter(every=every, period=IntervalSchedule.SECONDS).order_by("pk").first()
        if interval is None:
            interval = IntervalSchedule.objects.create(every=every, period=IntervalSchedule.SECONDS)
        _, created = PeriodicTask.objects.update_or_create(
            name=PERIODIC_TASK_NAME,
            defaults={
                "task": TASK,
                "interval": interval,
                "crontab": None,
                "solar": None,
                "clocked": None,
                "kwargs": json.dumps({"every": every}),
                "queue": weft_settings.CELERY_QUEUE or None,
                "enabled": True,
                "one_off": False,
            },
        )
    return BeatInstall(created=created, every=every)
