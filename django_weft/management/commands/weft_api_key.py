"""manage.py weft_api_key: create, list and revoke the HTTP API's keys; list the permissions a key may hold."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand, CommandError

from django_weft.exceptions import WeftError
from django_weft.models import ApiKey
from django_weft.services import api_keys

CREATED_BY = "manage.py weft_api_key"


class Command(BaseCommand):
    help = ("API keys: create NAME --permissions P1,P2 | list | revoke NAME | permissions [--all]. "
            "The key is printed once, by create; only its prefix and a hash are stored.")

    def add_arguments(self, parser: Any) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        create = commands.add_parser("create", help="Make a key and print it (once).")
        create.add_argument("name")
        create.add_argument("--permissions", "-p", action="append", default=[], metavar="PERMS",
                            help="app_label.codename, comma-separated or repeated "
                                 "(e.g. django_weft.view_workflow,django_weft.add_workflow)")
        commands.add_parser("list", help="List keys: name, prefix, permissions, created, last used, revoked.")
        commands.add_parser("revoke", help="Revoke a key: it authenticates no more.").add_argument("name")
        listed = commands.add_parser("permissions", help="The permissions the HTTP API checks: what a key is given.")
        listed.add_argument("--all", action="store_true", dest="all_apps", help="Every installed app's permissions.")
        for sub in commands.choices.values():
            sub.add_argument("--json", action="store_true", help="Write JSON, for scripts.")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(**options)
        except WeftError as exc:
            raise CommandError(str(exc)) from None

    def emit(self, options: dict[str, Any], value: Any, text: str) -> None:
        self.stdout.write(json.dumps(value, indent=2) if options["json"] else text)

    def do_create(self, name: str, permissions: list[str], **options: Any) -> None:
        names = [part for value in permissions for part in value.split(",")]
        record, key = api_keys.create(name, names, created_by=CREATED_BY)
        shown = ", ".join(record.permissions) or "(none)"
        self.emit(options, {**_row(record), "key": key},
                  f"created API key {record.name!r} (prefix {record.prefix}) with permissions {shown}\n{key}\n"
                  "Keep it now: it is not stored and cannot be shown again.")

    def do_list(self, **options: Any) -> None:
        rows = [_row(record) for record in ApiKey.objects.order_by("name")]
        lines = [f"{r['name']:<24} {r['prefix']:<13} created={r['created_at']} last_used={r['last_used_at'] or '-'} "
                 f"revoked={r['revoked_at'] or '-'}  {', '.join(r['permissions']) or '(no permissions)'}"
                 for r in rows]
        self.emit(options, rows, "\n".join(lines) or "no API keys")

    def do_revoke(self, name: str, **options: Any) -> None:
        before = ApiKey.objects.filter(name=name).values_list("revoked_at", flat=True).first()
        record = api_keys.revoke(name)
        text = f"revoked API key {name!r}" if before is None else \
            f"API key {name!r} was revoked already, at {_iso(record.revoked_at)}"
        self.emit(options, _row(record), text)

    def do_permissions(self, all_apps: bool, **options: Any) -> None:
        permissions = Permission.objects.select_related("content_type").order_by(
            "content_type__app_label", "codename")
        if not all_apps:  # the ones the API checks: what a key is for
            permissions = permissions.filter(content_type__app_label="django_weft",
                                             codename__in=api_keys.API_PERMISSIONS)
        rows = [{"permission": f"{p.content_type.app_label}.{p.codename}", "description": p.name}
                for p in permissions]
        self.emit(options, rows, "\n".join(f"{r['permission']:<40} {r['description']}" for r in rows))


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _row(record: ApiKey) -> dict[str, Any]:
    return {"name": record.name, "prefix": record.prefix, "permissions": list(record.permissions or []),
            "created_at": _iso(record.created_at), "created_by": record.created_by,
            "last_used_at": _iso(record.last_used_at), "revoked_at": _iso(record.revoked_at)}
