"""manage.py weft_runs: find runs and act on many from the shell.

``list`` and ``show`` read; ``cancel``, ``terminate``, ``signal``, ``retry``, ``suspend``, ``resume`` and ``purge``
are the bulk operations of ``weft.bulk`` over the same filters (a preview, then, once confirmed at the prompt or
by ``--yes``, the operation with the preview's token: a set that changed in between is refused); ``fork`` starts
a new run from a step of an old one. ``--json`` prints one JSON document on standard output.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_weft.common import privacy
from django_weft.common.codec import MAX_DEPTH
from django_weft.exceptions import WeftError
from django_weft.management import runs_cli
from django_weft.models import Workflow
from django_weft.services import bulk, queues, step_controls
from django_weft.services.client import WorkflowHandle
from django_weft.services.pending_activities import pending_activities
from django_weft.services.visibility import list_runs

# subcommand -> (bulk operation, verb of the prompt, what it applies to)
BULK = {
    "cancel": ("cancel", "Cancel", "open runs"),
    "terminate": ("terminate", "Terminate", "open runs"),
    "signal": ("signal", "Signal", "open runs"),
    "retry": ("retry_failed", "Retry", "failed runs"),
    "suspend": ("suspend", "Suspend", "pending, running and waiting runs"),
    "resume": ("resume", "Resume", "suspended runs"),
    "purge": ("purge", "Purge", "finished runs"),
}
SAMPLE_COLUMNS = ("run_id", "workflow_id", "type", "status", "created_at")
LIST_COLUMNS = ("run_id", "workflow_id", "type", "version", "status", "created_at", "finished_at")
JOURNAL_COLUMNS = ("seq", "kind", "name", "status", "attempt", "started_at", "finished_at")
ATTEMPT_COLUMNS = ("seq", "attempt", "outcome", "executor", "started_at", "finished_at")
STEP_CONTROLS = {"fire-now": "fire_timer_now", "reset-attempts": "reset_attempts", "pause-retries": "pause_retries",
                 "unpause-retries": "unpause_retries", "set-options": "set_activity_options"}
IN_FLIGHT_COLUMNS = ("seq", "activity", "attempt", "state", "started_at", "executor", "executor_silent",
                     "last_heartbeat_at", "timeout_at", "next_retry_at")


class Command(BaseCommand):
    help = ("Find workflow runs and act on many: list | show RUN_ID | cancel | terminate | signal NAME | retry | "
            "suspend | resume | purge | fork RUN_ID --from-step N. The bulk ones preview first and ask before "
            "acting (--dry-run: only preview; --yes: do not ask).")
    # call_command(..., stdin=...) answers the prompt (tests); on the command line it reads standard input.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: Any) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        listing = commands.add_parser("list", help="Runs matching the filters, newest first.")
        runs_cli.add_filter_arguments(listing)
        listing.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")
        show = commands.add_parser("show", help="One run with its journal.")
        show.add_argument("run_id", metavar="RUN_ID", help="A run id, or a workflow id (its latest run).")
        for name, (_operation, verb, applies) in BULK.items():
            sub = commands.add_parser(name, help=f"{verb} the {applies} matching the filters.")
            if name == "signal":
                sub.add_argument("name", metavar="NAME", help="The signal's name.")
                sub.add_argument("--payload", default="null", help="JSON payload (default null).")
                sub.add_argument("--signal-id", default=None,
                                 help="Deduplication id: a repeat delivers once per run.")
            if name in ("cancel", "terminate", "suspend"):
                sub.add_argument("--reason", default="", help="Recorded on each run and in the audit row.")
            runs_cli.add_filter_arguments(sub)
            runs_cli.add_bulk_arguments(sub)
        fork = commands.add_parser("fork", help="A new run that keeps RUN_ID's journal before step N and "
                                                "executes from there.")
        fork.add_argument("run_id", metavar="RUN_ID", help="A run id, or a workflow id (its latest run).")
        fork.add_argument("--from-step", type=int, required=True, metavar="N")
        fork.add_argument("--workflow-id", default=None, help="The new run's workflow id (default: derived).")
        commands.add_parser("queues", help="Each queue: backlog, admitted runs, limits, oldest wait, rate-limited.")
        pause = commands.add_parser("pause-type", help="Stop admitting runs of a workflow type (weft.pause_type).")
        pause.add_argument("workflow_type", metavar="WORKFLOW")
        pause.add_argument("--reason", default="")
        resume = commands.add_parser("resume-type", help="Admit runs of a paused workflow type again.")
        resume.add_argument("workflow_type", metavar="WORKFLOW")
        step = commands.add_parser("step", help="A step control on one run: fire-now (its timer or retry backoff), "
                                                "reset-attempts, pause-retries, unpause-retries, set-options.")
        step.add_argument("run_id", metavar="RUN_ID", help="A run id, or a workflow id (its latest run).")
        step.add_argument("seq", metavar="SEQ", type=int, help="The step's position in the journal.")
        step.add_argument("control", choices=sorted(STEP_CONTROLS))
        step.add_argument("--max-attempts", type=int, default=None, help="set-options: the retry policy's.")
        step.add_argument("--initial-backoff", type=float, default=None, help="set-options: seconds.")
        step.add_argument("--backoff-multiplier", type=float, default=None, help="set-options.")
        step.add_argument("--max-backoff", type=float, default=None, help="set-options: seconds.")
        step.add_argument("--timeout", type=float, default=None, help="set-options: seconds per attempt.")
        step.add_argument("--schedule-to-close-timeout", type=float, default=None, help="set-options: seconds.")
        for sub in commands.choices.values():
            sub.add_argument("--json", action="store_true", dest="as_json",
                             help="Print one JSON document (for scripts).")
            sub.add_argument("--user", default=None, dest="cli_user",
                             help="Show payloads (inputs, results, heartbeat details) if this Django user holds "
                                  "django_weft.view_payloads (default: WEFT_CLI_USER; without one they are hidden).")

    def handle(self, *args: Any, action: str, cli_user: str | None = None, **options: Any) -> None:
        try:
            with privacy.payloads(runs_cli.payloads_for(cli_user)):
                if action in BULK:
                    self.do_bulk(action, options)
                else:
                    getattr(self, f"do_{action.replace('-', '_')}")(**options)
        except WeftError as exc:
            raise CommandError(str(exc)) from None

    def emit(self, data: Any) -> None:
        self.stdout.write(runs_cli.to_json(data))

    # --- reading ------------------------------------------------------------------------------------------

    def do_list(self, *, limit: int, as_json: bool, **options: Any) -> None:
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        runs = list(list_runs(**runs_cli.filters_from(options)).defer("input", "result", "error")[:limit + 1])
        more, runs = len(runs) > limit, runs[:limit]
        rows = [runs_cli.summary(run) for run in runs]
        if as_json:
            self.emit({"runs": rows, "limit": limit, "more": more})
            return
        if not rows:
            self.stdout.write("no runs match")
            return
        self.stdout.write(runs_cli.table(rows, LIST_COLUMNS))
        if more:
            self.stdout.write(f"(first {limit} shown; more match: narrow the filters or raise --limit)")

    def do_queues(self, *, as_json: bool, **options: Any) -> None:
        infos = queues.list_queues()
        paused = queues.paused_types()
        if as_json:
            self.emit({"queues": [info.as_dict() for info in infos], "paused_types": paused})
            return
        rows = [{"queue": info.name, "queued": info.backlog, "ready": info.ready, "admitted": info.admitted,
                 "limits": ", ".join(f"{k}={v}" for k, v in info.limits.items() if v is not None) or "-",
                 "oldest_wait": "-" if info.oldest_wait_seconds is None else f"{info.oldest_wait_seconds:.0f}s",
                 "rate_limited": info.rate_limited} for info in infos]
        self.stdout.write(runs_cli.table(rows, list(rows[0])) if rows else "no queues (WEFT_QUEUES is empty)")
        if paused:
            self.stdout.write("paused types: " + ", ".join(paused))

    def do_pause_type(self, *, workflow_type: str, reason: str, as_json: bool, **options: Any) -> None:
        changed = queues.pause_type(workflow_type, reason)
        self.stdout.write(f"{workflow_type}: paused" if changed else f"{workflow_type} was paused already")

    def do_resume_type(self, *, workflow_type: str, as_json: bool, **options: Any) -> None:
        changed = queues.resume_type(workflow_type)
        self.stdout.write(f"{workflow_type}: resumed" if changed else f"{workflow_type} was not paused")

    def do_show(self, *, run_id: str, as_json: bool, **options: Any) -> None:
        run = self.run_named(run_id)
        data, steps, attempts = runs_cli.detail(run), runs_cli.journal(run), runs_cli.attempts(run)
        in_flight = [{**item.as_dict(), "heartbeat_details": privacy.shown_value(item.heartbeat_details)
                      if item.heartbeat_details is not None else None} for item in pending_activities(run)]
        if as_json:
            self.emit({"run": data, "pending_activities": in_flight, "journal": steps, "attempts": attempts})
            return
        for key, value in data.items():
            shown = runs_cli.to_json(value, compact=True) if isinstance(value, dict | list) and value else value
            self.stdout.write(f"{key + ':':<20} {'-' if shown in (None, '', []) else shown}")
        if in_flight:  # first: what an operator looks at a stuck-looking run for
            self.stdout.write(f"\nin flight ({len(in_flight)}):")
            self.stdout.write(runs_cli.table(in_flight, IN_FLIGHT_COLUMNS))
            for row in in_flight:
                if row["heartbeat_details"] is not None:
                    details = runs_cli.to_json(row["heartbeat_details"], compact=True)  # "hidden" when hidden
                    self.stdout.write(f"    step {row['seq']} heartbeat details: {details}")
                if row["last_error"]:
                    self.stdout.write(f"    step {row['seq']} last error: {runs_cli.error_text(row['last_error'])}")
        self.stdout.write(f"\njournal ({len(steps)} step(s)):")
        if steps:
            self.stdout.write(runs_cli.table(steps, JOURNAL_COLUMNS))
        if attempts:
            # Steps that took more than one attempt: earlier errors and lost attempts stay visible here.
            self.stdout.write(f"\nattempts ({len(attempts)}):")
            lines = runs_cli.table(attempts, ATTEMPT_COLUMNS).splitlines()
            self.stdout.write(lines[0])
            for line, row in zip(lines[1:], attempts, strict=True):
                self.stdout.write(line)
                if row["error"]:  # whole, on a line of its own: it is what the history is read for
                    self.stdout.write(f"    {runs_cli.error_text(row['error'])}")

    @staticmethod
    def run_named(text: str) -> Workflow:
        try:
            run = Workflow.objects.filter(pk=uuid.UUID(text)).first()
        except ValueError:
            run = None
        if run is None:
            run = Workflow.objects.latest_for(text).first()
        if run is None:
            raise CommandError(f"no run with run id or workflow id {text!r}")
        return run

    # --- acting -------------------------------------------------------------------------------------------

    def do_fork(self, *, run_id: str, from_step: int, workflow_id: str | None, as_json: bool, **options: Any) -> None:
        run = self.run_named(run_id)
        fork = getattr(WorkflowHandle(run.workflow_id, run.run_id), "fork", None)
        if fork is None:
            raise CommandError("this version of django_weft has no handle.fork()")
        new = fork(from_step=from_step, workflow_id=workflow_id)
        if as_json:
            self.emit({"forked_from": run.run_id, "from_step": from_step, "workflow_id": new.workflow_id,
                       "run_id": new.run_id})
            return
        self.stdout.write(f"forked run {run.run_id} from step {from_step}: new run {new.run_id} of "
                          f"{new.workflow_id!r}")

    def do_step(self, *, run_id: str, seq: int, control: str, as_json: bool, timeout: float | None,
                schedule_to_close_timeout: float | None, **options: Any) -> None:
        run = Workflow.objects.end_of_chain(self.run_named(run_id))
        action = STEP_CONTROLS[control]
        given = {name: options[name] for name in step_controls.RETRY_FIELDS if options.get(name) is not None}
        if action == "set_activity_options":
            retry = None
            if given:
                declared = step_controls.declared_retry(run, seq)
                retry = {**{name: getattr(declared, name) for name in step_controls.RETRY_FIELDS}, **given}
            step_controls.set_activity_options(run, seq, retry=retry, timeout=timeout,
                                               schedule_to_close_timeout=schedule_to_close_timeout,
                                               requested_by=runs_cli.who())
        elif given or timeout is not None or schedule_to_close_timeout is not None:
            raise CommandError(f"{control} takes no options (they are for set-options)")
        else:
            step_controls.perform(run, action, seq, requested_by=runs_cli.who())
        if as_json:
            self.emit({"done": action, "run_id": run.run_id, "seq": seq})
            return
        self.stdout.write(f"{action}: step {seq} of run {run.run_id} ({run.workflow_id!r})")

    def do_bulk(self, action: str, options: dict[str, Any]) -> None:
        name, verb, applies = BULK[action]
        operation = bulk.OPERATIONS[name]
        args, kwargs = self.arguments(action, options)
        filters = runs_cli.filters_from(options)
        as_json = options["as_json"]
        preview = operation(*args, dry_run=True, **kwargs, **filters)
        assert isinstance(preview, bulk.BulkPreview)
        if options["dry_run"]:
            if as_json:
                self.emit({"operation": name, "dry_run": True, "matched": preview.matched,
                           "sample_ids": preview.sample_ids, "confirmation_token": preview.confirmation_token})
            else:
                self.describe(preview, verb, applies, self.stdout)
            return
        if preview.matched == 0:
            if as_json:
                self.emit({"operation": name, "matched": 0, "count": 0, "skipped": 0, "operation_id": None})
            else:
                self.stdout.write(f"no {applies} match the filters; nothing to do")
            return
        if not options["yes"]:
            self.confirm(preview, verb, applies, options)
        bar = runs_cli.ProgressBar(self.stderr, f"{verb.lower()}:")
        result = operation(*args, confirmation_token=preview.confirmation_token, requested_by=runs_cli.who(),
                           progress=bar, **kwargs, **filters)
        assert isinstance(result, bulk.BulkResult)
        if as_json:
            self.emit({"operation": name, "matched": result.matched, "count": result.count,
                       "skipped": result.skipped, "operation_id": result.operation_id})
            return
        self.stdout.write(f"{name}: {result.count} of {result.matched} run(s) changed"
                          + (f", {result.skipped} skipped (they changed meanwhile)" if result.skipped else "")
                          + f"; audit record #{result.operation_id}")

    @staticmethod
    def arguments(action: str, options: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        if action == "signal":
            try:
                payload = json.loads(options["payload"])
            except ValueError as exc:
                raise CommandError(f"--payload is not JSON: {exc}") from None
            except RecursionError:
                raise CommandError(f"--payload nests more than {MAX_DEPTH} levels, the limit of every "
                                   "payload") from None
            return [options["name"], payload], {"signal_id": options["signal_id"]}
        if action in ("cancel", "terminate", "suspend"):
            return [options["reason"]], {}
        return [], {}

    def describe(self, preview: bulk.BulkPreview, verb: str, applies: str, out: Any) -> None:
        out.write(f"{verb}: {preview.matched} run(s) match ({applies} only)")
        if preview.sample_ids:
            runs = {run.pk: run for run in Workflow.objects.filter(pk__in=preview.sample_ids)
                    .defer("input", "result", "error")}
            rows = [runs_cli.summary(runs[pk]) for pk in preview.sample_ids if pk in runs]
            more = preview.matched - len(rows)
            out.write(runs_cli.table(rows, SAMPLE_COLUMNS) + (f"\n… and {more} more" if more > 0 else ""))

    def confirm(self, preview: bulk.BulkPreview, verb: str, applies: str, options: dict[str, Any]) -> None:
        """Show the preview and ask; anything but y/yes (or end of input) stops here."""
        out = self.stderr if options["as_json"] else self.stdout  # --json keeps standard output for the result
        self.describe(preview, verb, applies, out)
        out.write(f"{verb} these {preview.matched} run(s)? [y/N] ", ending="", style_func=lambda x: x)
        out.flush()
        stdin = options.get("stdin") or sys.stdin
        answer = stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise CommandError("not confirmed; nothing was changed")
