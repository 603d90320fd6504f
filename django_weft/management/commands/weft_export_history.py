"""manage.py weft_export_history RUN_ID: a run's journal as JSON, for django_weft.testing.replay() in a test."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_weft.models import Workflow
from django_weft.services.replay_check import export_history


class Command(BaseCommand):
    help = ("Write the journal of run RUN_ID as JSON (payloads byte for byte), to replay it against changed code "
            "in a test with django_weft.testing.replay().")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--output", "-o", default=None, help="Write to this file instead of standard output.")

    def handle(self, *args: Any, run_id: str, output: str | None, **options: Any) -> None:
        try:
            run = Workflow.objects.get(pk=uuid.UUID(run_id))
        except (ValueError, Workflow.DoesNotExist):
            raise CommandError(f"no workflow run with run id {run_id!r}") from None
        text = json.dumps(export_history(run), indent=1)
        if output is None:
            self.stdout.write(text)
            return
        with open(output, "w", encoding="utf-8") as file:
            file.write(text + "\n")
        self.stdout.write(f"run {run.run_id}: {len(json.loads(text)['steps'])} step(s) written to {output}")
