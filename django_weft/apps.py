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
        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import weft_settings

        # Like admin.py: import <app>.workflows of every installed app so workflows register.
        autodiscover_modules(weft_settings.AUTODISCOVER_MODULE)
