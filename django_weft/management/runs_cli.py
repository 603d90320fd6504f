"""The pieces of ``manage.py weft_runs``: its filter options, run rows (text and JSON), the progress bar."""

from __future__ import annotations

import getpass
import json
import os
import uuid
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.management.base import CommandError, OutputWrapper

from django_weft.common import privacy
from django_weft.common.codec import decode
from django_weft.models import FailureCategory, RunStatus, StepAttempt, Workflow, WorkflowStep
from django_weft.services import bulk, visibility_text

MAX_CELL = 40


def add_filter_arguments(parser: Any) -> None:
    """The filters of weft.list_runs as options (the repeatable ones may be given several times)."""
    group = parser.add_argument_group("filters (those given must all hold)")
    group.add_argument("--status", action="append", choices=RunStatus.values, metavar="STATUS",
                       help=f"One of {', '.join(RunStatus.values)}. Repeatable.")
    group.add_argument("--type", action="append", metavar="WORKFLOW", help="A registered workflow name. Repeatable.")
    group.add_argument("--workflow-id-prefix", metavar="PREFIX")
    group.add_argument("--tag", action="append", dest="tags", metavar="TAG", help="Runs with every tag given.")
    group.add_argument("--attr", action="append", dest="attributes", metavar="NAME[__LOOKUP]=VALUE",
                       help="A search attribute filter, typed by WEFT_SEARCH_ATTRIBUTES: region=eu, amount__gte=100, "
                            "due__lt=2025-03-01, region__in=eu,us, note__contains=late. Repeatable.")
    group.add_argument("--created-after", metavar="ISO", help="Created at or after (no offset: TIME_ZONE).")
    group.add_argument("--created-before", metavar="ISO", help="Created before.")
    group.add_argument("--schedule", metavar="SCHEDULE_ID")
    group.add_argument("--parent", metavar="RUN_ID")
    group.add_argument("--failure-category", action="append", choices=FailureCategory.values, metavar="CATEGORY",
                       help=f"One of {', '.join(FailureCategory.values)}. Repeatable.")
    group.add_argument("--version", type=int, metavar="N", help="The workflow version the runs started on.")
    group.add_argument("--queue", metavar="QUEUE", help="Runs of this queue ('default': of no queue).")


def filters_from(options: dict[str, Any]) -> dict[str, Any]:
    """The runs_matching keywords of the options given."""
    filters: dict[str, Any] = {}
    for key in ("status", "type", "workflow_id_prefix", "tags", "schedule", "parent", "failure_category",
                "version", "queue"):
        if options.get(key) is not None:
            filters[key] = options[key]
    if options.get("attributes"):
        filters["attributes"] = dict(visibility_text.attribute_pair(text) for text in options["attributes"])
    for key in ("created_after", "created_before"):
        if options.get(key):
            filters[key] = visibility_text.moment(options[key], "--" + key.replace("_", "-"))
    return filters


def add_bulk_arguments(parser: Any) -> None:
    parser.add_argument("--dry-run", action="store_true", help="Show what would be done; change nothing.")
    parser.add_argument("--yes", "-y", action="store_true", help="Do it without asking.")


def who() -> str:
    """The audit row's requested_by: the operating system user."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in the environment or the password database
        user = "unknown user"
    return f"{user} (manage.py weft_runs)"


# --- output ----------------------------------------------------------------------------------------------


def to_json(data: Any, *, compact: bool = False) -> str:
    return json.dumps(data, indent=None if compact else 2, default=_default, ensure_ascii=False)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)


def _decoded(data: Any) -> Any:
    if data is None:
        return None
    if not privacy.visible():
        return privacy.HIDDEN
    try:
        return decode(data)
    except Exception as exc:  # a payload this version cannot read is shown, not fatal
        return f"<undecodable payload: {exc}>"


def payloads_for(username: str | None) -> bool:
    """Whether payloads are shown: to a Django user holding django_weft.view_payloads (``--user``, or the
    WEFT_CLI_USER environment variable), and to no one else."""
    name = username or os.environ.get("WEFT_CLI_USER") or ""
    if not name:
        return False
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: name}, is_active=True).first()
    if user is None:
        raise CommandError(f"no active user {name!r} (--user / WEFT_CLI_USER)")
    return user.has_perm(f"django_weft.{privacy.PERMISSION}")


def summary(run: Workflow) -> dict[str, Any]:
    """A run as ``list`` shows it."""
    return {"run_id": run.run_id, "workflow_id": run.workflow_id, "type": run.workflow_type, "version": run.version,
            "status": run.status, "failure_category": run.failure_category, "tags": run.tags,
            "created_at": run.created_at, "finished_at": run.finished_at}


def detail(run: Workflow) -> dict[str, Any]:
    """A run as ``show`` shows it, its payloads decoded."""
    return {**summary(run), "wait_reason": run.wait_reason, "termination_reason": run.termination_reason,
            "search_attributes": run.search_attributes, "input": _decoded(run.input),
            "result": _decoded(run.result), "error": run.error, "parent": run.parent_id,
            "restarted_from": run.restarted_from_id, "schedule": run.schedule_id,
            "idempotency_key": run.idempotency_key,
            "retries": run.retries, "started_at": run.started_at, "updated_at": run.updated_at,
            "runnable_at": run.runnable_at, "execution_deadline": run.execution_deadline,
            "cancel_requested_at": run.cancel_requested_at, "cancel_reason": run.cancel_reason}


def journal(run: Workflow) -> list[dict[str, Any]]:
    return [{"seq": step.seq, "kind": step.kind, "name": step.name, "status": step.status, "attempt": step.attempt,
             "failure_category": step.failure_category, "started_at": step.started_at,
             "finished_at": step.finished_at, "result": _decoded(step.result), "error": step.error}
            for step in WorkflowStep.objects.filter(run=run).order_by("seq")]


def attempts(run: Workflow) -> list[dict[str, Any]]:
    """The attempt history of the run's steps that took more than one attempt (failed and retried, lost with
    their executor), in step and attempt order."""
    return [{"seq": row.seq, "attempt": row.attempt, "outcome": row.outcome, "executor": row.executor,
             "started_at": row.started_at, "finished_at": row.finished_at, "error": row.error}
            for row in StepAttempt.objects.filter(run=run).order_by("seq", "attempt")]


def error_text(error: dict | None) -> str:
    """A recorded error as one line: ``type: message``."""
    return f"{error.get('type')}: {error.get('message')}" if error else ""


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "-"
    text = str(value)
    return text if len(text) <= MAX_CELL else text[:MAX_CELL - 1] + "…"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns under an upper-case header."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(column), *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)]
    lines = ["  ".join(column.upper().ljust(width) for column, width in zip(columns, widths, strict=True))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


class ProgressBar:
    """``progress(done, total)`` for a bulk operation, on standard error, once the work spans more than one
    batch: redrawn in place on a terminal, a line per tenth otherwise (logs, pipes)."""

    width = 30

    def __init__(self, out: OutputWrapper, label: str) -> None:
        self.out = out
        self.label = label
        self.shown_tenth = -1

    def __call__(self, done: int, total: int) -> None:
        if total <= bulk.BATCH_SIZE:
            return
        filled = self.width * done // total
        text = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} runs"
        if self.out.isatty():
            self.out.write("\r" + text, ending="\n" if done >= total else "", style_func=lambda x: x)
            self.out.flush()
            return
        tenth = 10 * done // total
        if tenth > self.shown_tenth:
            self.shown_tenth = tenth
            self.out.write(text, style_func=lambda x: x)
