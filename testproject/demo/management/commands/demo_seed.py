"""Create the demo superuser and a few example runs (idempotent: safe to run at every `make demo`)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

import django_weft as weft

USERNAME = "demo"
PASSWORD = "demo"


class Command(BaseCommand):
    help = "Create the demo superuser and start example workflow runs."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if not user_model.objects.filter(username=USERNAME).exists():
            user_model.objects.create_superuser(USERNAME, "demo@example.com", PASSWORD)
        examples = [
            ("demo.checkout", {"order_id": 1001, "amount": "49.90", "cooling_off_seconds": 30}),
            ("demo.checkout", {"order_id": 1002, "amount": "12.00", "cooling_off_seconds": 120}),
            ("demo.pipeline", "customers.csv"),
            ("demo.pipeline", "orders.csv"),
        ]
        for number, (workflow, payload) in enumerate(examples, start=1):
            handle = weft.start(workflow, payload, idempotency_key=f"demo-example-{number}")
            self.stdout.write(f"  {workflow:<15} run {handle.run_id} ({handle.status})")
        self.stdout.write("")
        self.stdout.write(self.style.SUCCESS(
            f"Admin: http://127.0.0.1:8000/admin/  user: {USERNAME}  password: {PASSWORD}"
        ))
