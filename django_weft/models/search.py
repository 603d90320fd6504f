"""The typed, indexed search attributes of runs (``WEFT_SEARCH_ATTRIBUTES``), one row per value. Re-exported by
:mod:`django_weft.models`.

A run's attributes are also on its row (``Workflow.search_attributes``, for showing them); these rows are
what filters and grouped counts use: one indexed column per type, and the run's ``created_at`` beside it,
so a filtered page, newest first, is read from one index.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from django_weft.fields import IdentifierField


class SearchAttributeValue(models.Model):
    """One value of a declared search attribute of a run (a ``keyword_list`` has a row per keyword)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("django_weft.Workflow", on_delete=models.CASCADE, related_name="attribute_values")
    name = IdentifierField(max_length=64)
    int_value = models.BigIntegerField(null=True, blank=True)
    decimal_value = models.DecimalField(max_digits=38, decimal_places=10, null=True, blank=True)
    # Keywords match exactly (a text attribute is the one for loose search).
    keyword_value = IdentifierField(max_length=255, null=True, blank=True)  # NULL: not this type
    text_value = models.TextField(null=True, blank=True)  # noqa: DJ001
    datetime_value = models.DateTimeField(null=True, blank=True)
    bool_value = models.BooleanField(null=True, blank=True)
    created_at = models.DateTimeField(help_text=_("The run's, for newest-first pages read from these indexes."))

    class Meta:
        verbose_name = _("search attribute value")
        # Each over the rows holding a value of its type (partial: a row fills one column), newest first per
        # value; a comparison implies NOT NULL, and a count by attribute says it.
        indexes = [
            models.Index(fields=["name", "int_value", "-created_at"], name="weft_attr_int_idx",
                         condition=Q(int_value__isnull=False)),
            models.Index(fields=["name", "decimal_value", "-created_at"], name="weft_attr_decimal_idx",
                         condition=Q(decimal_value__isnull=False)),
            models.Index(fields=["name", "keyword_value", "-created_at"], name="weft_attr_keyword_idx",
                         condition=Q(keyword_value__isnull=False)),
            models.Index(fields=["name", "datetime_value", "-created_at"], name="weft_attr_datetime_idx",
                         condition=Q(datetime_value__isnull=False)),
            models.Index(fields=["name", "bool_value", "-created_at"], name="weft_attr_bool_idx",
                         condition=Q(bool_value__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.name} of {self.run_id}"
