"""manage.py weft_replay_check: replay stored journals against the code loaded now, before a deploy."""

from __future__ import annotations

import time
from datetime import datetime
from datetime import time as day_start
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from django_weft.models import Workflow
from django_weft.services.replay_check import check_runs


def _since(text: str) -> datetime:
    moment = parse_datetime(text)
    if moment is None:
        day = parse_date(text)
        if day is None:
            raise CommandError(f"--since {text!r} is not a date (YYYY-MM-DD) or a date and time (ISO 8601)")
        moment = datetime.combine(day, day_start())
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment, timezone.get_current_timezone())


class Command(BaseCommand):
    help = ("Replay the journals of stored runs against the workflow code loaded now, executing and writing "
            "nothing. Prints one line per run that would fail (run, step, what was recorded, what the code asks "
            "for) and exits 1 if there is any; exits 0 when every run replays cleanly. Run it before a deploy.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--type", dest="workflow_type", default=None, help="Only runs of this workflow type.")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--open", action="store_true", help="Open runs (the default).")
        which.add_argument("--since", default=None, help="Runs created since DATE (YYYY-MM-DD or ISO 8601), "
                                                         "open or finished.")
        parser.add_argument("--limit", type=int, default=None, help="At most N runs, newest first.")

    def handle(self, *args: Any, workflow_type: str | None, open: bool, since: str | None, limit: int | None,
               **options: Any) -> None:
        if limit is not None and limit < 1:
            raise CommandError("--limit must be at least 1")
        runs = Workflow.objects.all() if since is not None else Workflow.objects.open()
        if since is not None:
            runs = runs.filter(created_at__gte=_since(since))
        if workflow_type is not None:
            runs = runs.filter(workflow_type=workflow_type)
        runs = runs.order_by("-created_at")
        if limit is not None:
            runs = runs[:limit]
        began = time.monotonic()
        checked = failing = 0
        for _, problem in check_runs(runs.iterator(chunk_size=500)):
            checked += 1
            if problem is not None:
                failing += 1
                self.stdout.write(problem.line())
        took = time.monotonic() - began
        summary = f"{checked} run(s) replayed in {took:.2f}s; {failing} would fail with the code loaded now"
        if failing:
            raise CommandError(summary)
        self.stdout.write(summary)
