"""API keys: made, checked and revoked (the records are :class:`~django_weft.models.ApiKey`).

A key reads ``weft_<prefix>_<secret>``; only the prefix and a SHA-256 of the whole key are stored, so a key
is shown once, when it is made. Checking compares hashes in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

from django.db import transaction

from django_weft.common import clock
from django_weft.exceptions import InvalidArgument
from django_weft.models import ApiKey

SCHEME = "weft"
PREFIX_CHARS = 12
# last_used_at is written at most this often per key, so a busy client does not write on every request.
LAST_USED_RESOLUTION_SECONDS = 60


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def known_permissions() -> set[str]:
    """Every permission a key may hold: ``app_label.codename`` of the installed models' permissions."""
    from django.contrib.auth.models import Permission

    return {f"{app}.{codename}" for app, codename in
            Permission.objects.values_list("content_type__app_label", "codename")}


# The permissions the HTTP API checks (django_weft.api: each route's, and bulk operations'): what a key is given
# for. Others may be given too, and mean nothing to the API.
API_PERMISSIONS = (
    "view_workflow", "add_workflow", "cancel_workflow", "signal_workflow", "retry_workflow", "suspend_workflow",
    "purge_workflow", "view_payloads", "view_schedule", "add_schedule", "change_schedule", "view_queuestate",
    "change_queuestate", "add_pausedtype", "delete_pausedtype",
)


def check_permissions(permissions: Iterable[str]) -> list[str]:
    names = sorted({str(name).strip() for name in permissions if str(name).strip()})
    unknown = sorted(set(names) - known_permissions())
    if unknown:
        raise InvalidArgument(f"unknown permission(s) {', '.join(unknown)}: a permission is app_label.codename, "
                              'e.g. "django_weft.view_workflow" (manage.py weft_api_key permissions lists them)')
    return names


def create(name: str, permissions: Iterable[str], *, created_by: str = "") -> tuple[ApiKey, str]:
    """Make a key; returns the record and the key itself, which is not stored and cannot be shown again."""
    name = str(name).strip()
    if not name or len(name) > 100:
        raise InvalidArgument("an API key needs a name of 1 to 100 characters")
    checked = check_permissions(permissions)
    if ApiKey.objects.filter(name=name).exists():
        raise InvalidArgument(f"an API key named {name!r} exists already")
    prefix = secrets.token_hex(PREFIX_CHARS // 2)
    key = f"{SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    record = ApiKey.objects.create(name=name, prefix=prefix, key_hash=_hash(key), permissions=checked,
                                   created_by=created_by, created_at=clock.now())
    return record, key


def authenticate(key: str) -> ApiKey | None:
    """The live (not revoked) key record ``key`` is, or None; notes when it was last used."""
    scheme, _, rest = key.partition("_")
    prefix, _, secret = rest.partition("_")
    if scheme != SCHEME or len(prefix) != PREFIX_CHARS or not secret:
        return None
    record = ApiKey.objects.filter(prefix=prefix, revoked_at__isnull=True).first()
    if record is None or not hmac.compare_digest(record.key_hash, _hash(key)):
        return None
    now = clock.now()
    last = record.last_used_at
    if last is None or (now - last).total_seconds() >= LAST_USED_RESOLUTION_SECONDS:
        ApiKey.objects.filter(pk=record.pk).update(last_used_at=now)
        record.last_used_at = now
    return record


def revoke(name: str) -> ApiKey:
    with transaction.atomic():
        record = ApiKey.objects.select_for_update().filter(name=name).first()
        if record is None:
            raise InvalidArgument(f"no API key named {name!r}")
        if record.revoked_at is None:
            record.revoked_at = clock.now()
            record.save(update_fields=["revoked_at"])
    return record


def has_permission(record: ApiKey, permission: str) -> bool:
    return permission in (record.permissions or [])
