"""Schedules in words, for the schedule admin.

Cron expressions are described by cron-descriptor (what django-celery-beat uses), in the active Django
language where cron-descriptor has a translation (English otherwise), with Django's 12- or 24-hour clock
for that language. Only the calls common to cron-descriptor 1.4 and 2.x are used: ``Options`` with
``locale_code`` and ``use_24hour_time_format``, and ``ExpressionDescriptor(expression, options)``.
Intervals (``every=``) are described here.
"""

from __future__ import annotations

import calendar
import re
from datetime import timedelta
from functools import cache, lru_cache
from pathlib import Path

import cron_descriptor
from django.utils import dates, formats
from django.utils.translation import get_language, ngettext, to_locale
from django.utils.translation import gettext as _t

FALLBACK_LOCALE = "en_US"
# Django language codes whose cron-descriptor locale is not language_COUNTRY of the same letters.
SCRIPT_LOCALES = {"zh_Hans": "zh_CN", "zh_Hant": "zh_TW", "nb": "nb_NO", "no": "nb_NO"}


@cache
def available_locales() -> frozenset[str]:
    """The translations cron-descriptor ships (``cron_descriptor/locale/<code>.mo``)."""
    try:
        folder = Path(cron_descriptor.__file__).parent / "locale"
        return frozenset(path.stem for path in folder.glob("*.mo")) | {FALLBACK_LOCALE}
    except OSError:
        return frozenset({FALLBACK_LOCALE})


def cron_locale(language: str | None) -> str:
    """A Django language code ("de", "pt-br", "zh-hans") as a cron-descriptor locale ("de_DE", ...)."""
    if not language:
        return FALLBACK_LOCALE
    locale = to_locale(language)  # "pt-br" -> "pt_BR", "zh-hans" -> "zh_Hans"
    locale = SCRIPT_LOCALES.get(locale, locale)
    available = available_locales()
    if locale in available:
        return locale
    prefix = locale.split("_")[0].lower()
    same_language = sorted(code for code in available if code.split("_")[0].lower() == prefix)
    preferred = f"{prefix}_{prefix.upper()}"  # de_DE for "de-at", fr_FR for "fr-ca"
    if preferred in same_language:
        return preferred
    return same_language[0] if same_language else FALLBACK_LOCALE


def _uses_24_hour_clock() -> bool:
    """Whether the active language writes times on a 24-hour clock (Django's TIME_FORMAT: "H:i", not "P")."""
    time_format = str(formats.get_format("TIME_FORMAT"))
    return any(char in time_format for char in "HG") and not any(char in time_format for char in "aAgPh")


def _localized_names() -> list[tuple[str, str]]:
    """cron-descriptor 1.4 takes day and month names from the process's C locale (English on servers), not from
    its translation; pairs of (that name, Django's name in the active language), longest first."""
    pairs = [(calendar.day_name[i], str(dates.WEEKDAYS[i])) for i in range(7)]
    pairs += [(calendar.month_name[i], str(dates.MONTHS[i])) for i in range(1, 13)]
    return sorted((pair for pair in pairs if pair[0] and pair[0] != pair[1]), key=lambda p: -len(p[0]))


@lru_cache(maxsize=1024)
def _describe(expression: str, locale: str, use_24_hours: bool, names: tuple[tuple[str, str], ...]) -> str | None:
    options = cron_descriptor.Options()
    options.locale_code = locale
    options.use_24hour_time_format = use_24_hours
    fields = expression.split()
    if any(field[:1] in ("H", "R") for field in fields):
        return None  # croniter's hashed and random fields ("H", "R(0-29)"): cron-descriptor would misread them
    if len(fields) == 6:
        # Ours puts seconds first; cron-descriptor guesses between seconds-first and year-last for six
        # fields, so an explicit "every year" seventh field removes the guess.
        expression = f"{expression} *"
    try:
        text = cron_descriptor.ExpressionDescriptor(expression, options).get_description()
    except Exception:  # any expression it cannot read (croniter's extensions): shown without words
        return None
    if not text:
        return None
    for name, translated in names:
        text = re.sub(rf"\b{re.escape(name)}\b", translated, text)
    return str(text)


def describe_cron(expression: str) -> str | None:
    """``"0 9 * * 1-5"`` -> ``"At 09:00 AM, Monday through Friday"`` (in the active language); None when the
    expression cannot be described."""
    if not expression or not expression.strip():
        return None
    return _describe(" ".join(expression.split()), cron_locale(get_language()), _uses_24_hour_clock(),
                     tuple(_localized_names()))


def describe_interval(every: timedelta) -> str:
    """``timedelta(seconds=90)`` -> ``"Every 90 seconds"``, in the largest whole unit."""
    seconds = int(every.total_seconds())
    if seconds % 86400 == 0:
        count = seconds // 86400
        return _t("Every day") if count == 1 else ngettext(
            "Every %(count)d day", "Every %(count)d days", count) % {"count": count}
    if seconds % 3600 == 0:
        count = seconds // 3600
        return _t("Every hour") if count == 1 else ngettext(
            "Every %(count)d hour", "Every %(count)d hours", count) % {"count": count}
    if seconds % 60 == 0:
        count = seconds // 60
        return _t("Every minute") if count == 1 else ngettext(
            "Every %(count)d minute", "Every %(count)d minutes", count) % {"count": count}
    return _t("Every second") if seconds == 1 else ngettext(
        "Every %(count)d second", "Every %(count)d seconds", seconds) % {"count": seconds}
