"""Create the demo superuser and a few example runs (idempotent: safe to run at every `make demo`)."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

import django_weft as weft
from django_weft.models import Workflow

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
        for workflow, payload in examples:
            name = payload["order_id"] if isinstance(payload, dict) else payload
            workflow_id = f"{workflow.removeprefix('demo.')}-{name}"
            if not Workflow.objects.filter(workflow_id=workflow_id).exists():
                weft.start(workflow, payload, workflow_id=workflow_id)
            self.stdout.write(f"  {workflow_id:<24} {weft.get_handle(workflow_id).status}")
        self.stdout.write("")
        self.stdout.write("Approve a checkout once it waits for approval (after its 30 s cooling-off sleep):")
        self.stdout.write("  .venv/bin/python testproject/manage.py weft_signal checkout-1001 approval "
                          "--payload '{\"approved\": true}'")
        self.stdout.write("")
        self.stdout.write(self.style.SUCCESS(
            f"Admin: http://127.0.0.1:{os.environ.get('DEMO_PORT') or 8000}/admin/  "
            f"user: {USERNAME}  password: {PASSWORD}"
        ))
