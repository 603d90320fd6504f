"""API keys for the HTTP API (``django_weft.api``). Re-exported by :mod:`django_weft.models`.

A key is shown once, when it is made; the database keeps its prefix (to find the row and to show in the admin)
and a SHA-256 hash of the whole key. Keys are 256 random bits, so a fast hash is enough: there is nothing to
brute-force that a slow one would protect. Its permissions are the model permissions the admin uses
(``"django_weft.cancel_workflow"``...), checked per operation as for a user.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_weft.fields import IdentifierField


class ApiKey(models.Model):
    id = models.BigAutoField(primary_key=True)
    name = IdentifierField(max_length=100, unique=True, help_text=_("Who or what uses it."))
    prefix = IdentifierField(max_length=16, unique=True, editable=False,
                              help_text=_("The start of the key, to recognise it; the rest is not stored."))
    key_hash = models.CharField(max_length=64, editable=False)
    permissions = models.JSONField(default=list, blank=True,
                                   help_text=_('Permission names, e.g. "django_weft.view_workflow".'))
    created_by = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("API key")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
