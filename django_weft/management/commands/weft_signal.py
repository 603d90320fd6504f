"""manage.py weft_signal: send a signal to a workflow from the shell (operators, scripts, the demo)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_weft.common.codec import MAX_DEPTH
from django_weft.exceptions import WeftError
from django_weft.services.client import signal


class Command(BaseCommand):
    help = "Send signal NAME with a JSON payload to the open run of WORKFLOW_ID."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("workflow_id")
        parser.add_argument("name")
        parser.add_argument("--payload", default="null", help="JSON payload (default null).")
        parser.add_argument("--signal-id", default=None, help="Deduplication id for this signal.")

    def handle(self, *args: Any, workflow_id: str, name: str, payload: str, signal_id: str | None,
               **options: Any) -> None:
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise CommandError(f"--payload is not JSON: {exc}") from None
        except RecursionError:
            raise CommandError(f"--payload nests more than {MAX_DEPTH} levels, the limit of every payload") from None
        try:
            delivered = signal(workflow_id, name, data, signal_id=signal_id)
        except WeftError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"signal {name!r} {'delivered' if delivered else 'already delivered (same signal id)'} "
                          f"to {workflow_id!r}")
