from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class WeftConfig(AppConfig):
    name = "django_weft"
    label = "django_weft"
    verbose_name = _("Workflows")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_weft.conf import weft_settings, weft_task_backends
        from django_weft.observability import events

        events.configure()  # metrics and tracing: on when installed, unless turned off

        from django_weft import checks  # noqa: F401  (registers the system checks: weft.E001...)

        try:
            from django_weft import tasks  # noqa: F401  (registers the Celery tasks with wakeups)
        except ImportError:  # Celery is an optional extra
            pass

        if weft_task_backends():
            from django_weft.services import task_runs  # noqa: F401  (executors know the task: types)

        # Like admin.py: import <app>.workflows of every installed app so workflows register.
        autodiscover_modules(weft_settings.AUTODISCOVER_MODULE)

