"""``manage.py weft_reencrypt``: move every stored payload to WEFT_PAYLOAD_CODEC's current key (payloads sealed with
an older key, and those stored before encryption was turned on), so that an old key can be dropped.

Each row is rewritten only if its payload is still the one read (compare and set): a payload the engine replaced
meanwhile is left to the engine, which wrote it with the current key anyway.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.db.models import BinaryField

from django_weft.common import payload_crypto

BATCH = 500


class Command(BaseCommand):
    help = ("Encrypt every stored payload with WEFT_PAYLOAD_CODEC's current key (rotation: add a key, make it "
            "current, run this, drop the old key).")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count what would change; change nothing.")

    def handle(self, *args: Any, dry_run: bool, **options: Any) -> None:
        keys = payload_crypto.ring()
        if keys is None:
            raise CommandError("WEFT_PAYLOAD_CODEC is not set: there is no key to encrypt with")
        total = 0
        for model in apps.get_app_config("django_weft").get_models():
            for field in model._meta.concrete_fields:
                if isinstance(field, BinaryField):
                    changed = self.reencrypt(model, field.attname, keys, dry_run=dry_run)
                    if changed:
                        self.stdout.write(f"{model._meta.label}.{field.attname}: {changed}")
                    total += changed
        verb = "would be re-encrypted" if dry_run else "re-encrypted"
        self.stdout.write(f"{total} payload(s) {verb} with key {keys.current!r}")

    @staticmethod
    def reencrypt(model: Any, name: str, keys: payload_crypto.KeyRing, *, dry_run: bool) -> int:
        changed, last = 0, None
        while True:
            rows = model.objects.filter(**{f"{name}__isnull": False}).order_by("pk")
            if last is not None:
                rows = rows.filter(pk__gt=last)
            page = list(rows.values_list("pk", name)[:BATCH])
            if not page:
                return changed
            for pk, stored in page:
                data = bytes(stored)
                if payload_crypto.sealed_with(data) == keys.current:
                    continue
                if not dry_run:
                    plain = keys.open(data) if payload_crypto.is_sealed(data) else data
                    model.objects.filter(pk=pk, **{name: data}).update(**{name: keys.seal(plain)})
                changed += 1
            last = page[-1][0]
