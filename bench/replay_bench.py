"""``manage.py weft_bench --replay-check N``: the replay check (``weft_replay_check``) over N open runs.

The runs are seeded, not executed: ``bulk_create`` inserts N runs of the registered ``weft.bench.replay``
workflow parked at a signal wait, each with the journal that workflow records up to there (``--steps``
K activity steps of ``weft.bench.step`` and the waiting ``signal go`` step), so the check replays them
against code that matches. One run in :data:`MISMATCH_EVERY` (1%) is seeded mismatched, in one of three
ways the check must report: an activity step recorded under another name (the code was renamed), a signal
wait on another signal (step K+1), or a version of the workflow no longer registered (it would be held).

Two timings over the same runs:

* :func:`django_weft.services.replay_check.check_runs` over the query the command makes (open runs of the type,
  newest first, read 500 at a time): runs/s and total seconds; the reported runs must be exactly the
  mismatched ones, at the expected step, or the bench fails;
* ``call_command("weft_replay_check", "--type", ..., "--since", ...)`` (the command an operator runs, its
  lines printed to a buffer): its summary must count N runs replayed and the mismatched share failing.

Steps replayed: the journal rows whose recorded results the check returned to the code before it reached
the run's frontier (the signal wait) or its mismatch. Runs are deleted afterwards unless ``--keep``.

Importing this module registers the ``weft.bench.replay`` workflow.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, router

from bench.core import BENCH_ACTIVITY, BenchError, bench_step, delete_bench_runs, load_average
from django_weft.common import clock
from django_weft.common.codec import encode
from django_weft.common.registry import get_workflow, workflow

REPLAY_WORKFLOW = "weft.bench.replay"
REPLAY_SIGNAL = "go"
# One run in this many is seeded mismatched (1%).
MISMATCH_EVERY = 100
# The mismatches, in turn.
RENAMED_ACTIVITY, OTHER_SIGNAL, UNREGISTERED_VERSION = "renamed_activity", "other_signal", "unregistered_version"
MISMATCHES = (RENAMED_ACTIVITY, OTHER_SIGNAL, UNREGISTERED_VERSION)
RENAMED_ACTIVITY_NAME = "weft.bench.step.before_rename"
OTHER_SIGNAL_NAME = "go.before_rename"
UNREGISTERED = 9999
SEED_BATCH = 2000
_SUMMARY = re.compile(r"(\d+) run\(s\) replayed in ([\d.]+)s; (\d+) would fail")


@workflow(name=REPLAY_WORKFLOW)
def replay_workflow(ctx: Any, spec: dict) -> int:
    """``spec``: ``steps`` (K). K activities, then a wait for signal ``go``: where the seeded runs are."""
    total = 0
    for i in range(spec["steps"]):
        total += ctx.run(bench_step, i)
    ctx.wait_for_signal(REPLAY_SIGNAL)
    return total


def mismatch_of(i: int) -> str | None:
    """How run ``i`` (0-based) is seeded mismatched, or None if it matches the code."""
    if i % MISMATCH_EVERY:
        return None
    return MISMATCHES[(i // MISMATCH_EVERY) % len(MISMATCHES)]


def expected_seq(kind: str, steps: int) -> int | None:
    """The journal position the check reports for a run mismatched this way (None: no step, it is held)."""
    return {RENAMED_ACTIVITY: 1, OTHER_SIGNAL: steps + 1, UNREGISTERED_VERSION: None}[kind]


def seed_runs(runs: int, steps: int, since: Any, prefix: str,
              progress: Callable[[str], None]) -> tuple[list, dict[Any, str]]:
    """Insert ``runs`` waiting runs with their journals; returns their ids and the mismatched ones' kinds."""
    from django_weft.models import RunStatus, StepKind, StepStatus, Workflow, WorkflowStep

    version = get_workflow(REPLAY_WORKFLOW).version
    data = encode({"steps": steps})
    results = [encode(i) for i in range(steps)]
    reason = f"waiting for signal {REPLAY_SIGNAL}"
    run_ids: list = []
    mismatched: dict[Any, str] = {}
    per_batch = max(1, SEED_BATCH // (steps + 1))
    for lo in range(0, runs, per_batch):
        batch, journal = [], []
        for i in range(lo, min(lo + per_batch, runs)):
            kind = mismatch_of(i)
            # Newest first is the check's order: run 0 is the newest.
            created = since + timedelta(microseconds=runs - i)
            run = Workflow(
                run_id=uuid.uuid4(), workflow_id=f"{prefix}{i}", workflow_type=REPLAY_WORKFLOW,
                version=UNREGISTERED if kind == UNREGISTERED_VERSION else version, status=RunStatus.WAITING,
                input=data, wait_reason=reason, fence=1, awaiting_signals=[REPLAY_SIGNAL],
                created_at=created, started_at=created, updated_at=created)
            batch.append(run)
            run_ids.append(run.run_id)
            if kind is not None:
                mismatched[run.run_id] = kind
            for s in range(1, steps + 1):
                name = RENAMED_ACTIVITY_NAME if kind == RENAMED_ACTIVITY and s == 1 else BENCH_ACTIVITY
                journal.append(WorkflowStep(run=run, seq=s, kind=StepKind.ACTIVITY, name=name,
                                            status=StepStatus.COMPLETED, result=results[s - 1], started_at=created,
                                            finished_at=created))
            journal.append(WorkflowStep(run=run, seq=steps + 1, kind=StepKind.SIGNAL,
                                        name=OTHER_SIGNAL_NAME if kind == OTHER_SIGNAL else REPLAY_SIGNAL,
                                        status=StepStatus.WAITING, started_at=created, finished_at=None))
        Workflow.objects.bulk_create(batch)
        WorkflowStep.objects.bulk_create(journal)
        if len(run_ids) % 10_000 < per_batch or len(run_ids) == runs:
            progress(f"seeded {len(run_ids)} of {runs} run(s)")
    return run_ids, mismatched


def run_replay_bench(*, runs: int, steps: int = 3, keep: bool = False,
                     progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Seed, check (twice: the function, the command) and return the figures. Raises :class:`BenchError` if
    the check reports other runs than the mismatched ones."""
    from django_weft.models import Workflow
    from django_weft.services.replay_check import check_runs

    using = router.db_for_write(Workflow)
    connection = connections[using]
    if connection.in_atomic_block:
        raise BenchError("called inside a transaction: the replay check would read journals seeded in it, and "
                         "nothing would be committed or timed as it is in production")
    since = clock.now()
    prefix = f"weft-bench-replay-{uuid.uuid4().hex[:12]}-"
    run_ids: list = []
    try:
        began = time.perf_counter()
        run_ids, mismatched = seed_runs(runs, steps, since, prefix, progress)
        seed_seconds = time.perf_counter() - began
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # as autovacuum would have, on a table that grew this much
                for model in ("Workflow", "WorkflowStep"):
                    cursor.execute(f"ANALYZE {connection.ops.quote_name(_table(model))}")

        progress(f"replaying {runs} run(s) with check_runs()")
        # The command's query (open runs of the type, newest first), on the bench's runs only.
        query = (Workflow.objects.open().filter(workflow_type=REPLAY_WORKFLOW, workflow_id__startswith=prefix)
                 .order_by("-created_at"))
        began = time.perf_counter()
        checked = 0
        problems = {}
        for run, problem in check_runs(query.iterator(chunk_size=500)):
            checked += 1
            if problem is not None:
                problems[run.run_id] = problem
        check_seconds = time.perf_counter() - began
        _check_problems(checked, runs, steps, problems, mismatched)

        progress(f"replaying {runs} run(s) with manage.py weft_replay_check --type {REPLAY_WORKFLOW} --since ...")
        out = StringIO()
        began = time.perf_counter()
        try:
            call_command("weft_replay_check", "--type", REPLAY_WORKFLOW, "--since", since.isoformat(), stdout=out)
            summary = out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else ""
        except CommandError as exc:  # exits 1 when a run would fail: here it must
            summary = str(exc)
        command_seconds = time.perf_counter() - began
        command = _check_command(summary, out.getvalue(), runs, mismatched)
    finally:
        if not keep:
            progress("deleting the seeded runs")
            delete_bench_runs(run_ids, REPLAY_WORKFLOW, since)

    mismatched_steps = sum((p.seq or 1) - 1 for p in problems.values())
    return {
        "mode": "replay_check",
        "vendor": connection.vendor,
        "cpus": os.cpu_count(),
        "loadavg": load_average(),
        "debug": bool(settings.DEBUG),
        "runs": runs,
        "steps_per_run": steps,
        "journal_rows": runs * (steps + 1),
        "mismatched": len(mismatched),
        "mismatched_by_kind": {kind: sum(k == kind for k in mismatched.values()) for kind in MISMATCHES},
        "seed_seconds": round(seed_seconds, 3),
        "check": {
            "runs_replayed": checked,
            "steps_replayed": (runs - len(mismatched)) * steps + mismatched_steps,
            "failing": len(problems),
            "seconds": round(check_seconds, 3),
            "runs_per_second": round(checked / check_seconds, 1) if check_seconds else None,
        },
        "command": {**command, "seconds": round(command_seconds, 3),
                    "runs_per_second": round(command["runs_replayed"] / command_seconds, 1) if command_seconds
                    else None},
        "sample_problem": next((p.line() for p in problems.values()), None),
    }


def _table(model: str) -> str:
    from django_weft import models

    return getattr(models, model)._meta.db_table


def _check_problems(checked: int, runs: int, steps: int, problems: dict, mismatched: dict[Any, str]) -> None:
    if checked != runs:
        raise BenchError(f"the replay check replayed {checked} run(s), not the {runs} seeded")
    wrong = sorted(str(pk) for pk in problems.keys() - mismatched.keys())
    missed = sorted(str(pk) for pk in mismatched.keys() - problems.keys())
    if wrong or missed:
        example = problems[next(iter(problems.keys() - mismatched.keys()))].line() if wrong else ""
        raise BenchError(
            f"the replay check reported {len(problems)} run(s) failing, not the {len(mismatched)} seeded "
            f"mismatched: {len(wrong)} matching run(s) reported (e.g. {example}), {len(missed)} mismatched run(s) "
            f"not reported (e.g. {missed[:3]})")
    for pk, kind in mismatched.items():
        problem, seq = problems[pk], expected_seq(kind, steps)
        if problem.seq != seq or (seq is None and "would be held" not in problem.message):
            raise BenchError(f"run {pk} ({kind}): the replay check reported {problem.line()!r}, expected "
                             f"{'step ' + str(seq) if seq else 'a held run'}")


def _check_command(summary: str, output: str, runs: int, mismatched: dict[Any, str]) -> dict[str, Any]:
    match = _SUMMARY.search(summary)
    if match is None:
        raise BenchError(f"weft_replay_check printed no summary ({summary!r})")
    replayed, took, failing = int(match[1]), float(match[2]), int(match[3])
    if replayed != runs or failing != len(mismatched):
        raise BenchError(f"weft_replay_check: {summary!r}; expected {runs} run(s) replayed and {len(mismatched)} "
                         "failing (the seeded mismatched runs)")
    lines = [line for line in output.splitlines() if line.startswith("run ")]
    named = {pk for pk in mismatched if any(str(pk) in line for line in lines)}
    if len(lines) != len(mismatched) or len(named) != len(mismatched):
        raise BenchError(f"weft_replay_check printed {len(lines)} run line(s) naming {len(named)} of the "
                         f"{len(mismatched)} mismatched runs")
    return {"runs_replayed": replayed, "failing": failing, "reported_seconds": took, "summary": summary}


def format_table(figures: dict[str, Any]) -> list[str]:
    """The figures as the lines the command prints (before the JSON line)."""
    f, check, command = figures, figures["check"], figures["command"]
    kinds = ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in f["mismatched_by_kind"].items())
    return [
        f"weft_bench --replay-check: {f['vendor']}, {f['cpus']} cpu(s), load {f['loadavg']}; {f['runs']} open "
        f"run(s) waiting for a signal after {f['steps_per_run']} activity step(s) ({f['journal_rows']} journal rows, "
        f"seeded in {f['seed_seconds']:.2f}s)",
        f"seeded mismatched: {f['mismatched']} ({kinds})",
        f"{'':<26} {'runs':>8} {'steps':>9} {'failing':>8} {'seconds':>9} {'runs/s':>9}",
        f"{'check_runs()':<26} {check['runs_replayed']:>8} {check['steps_replayed']:>9} {check['failing']:>8} "
        f"{check['seconds']:>9.3f} {check['runs_per_second']:>9.0f}",
        f"{'manage.py weft_replay_check':<26} {command['runs_replayed']:>8} {'':>9} {command['failing']:>8} "
        f"{command['seconds']:>9.3f} {command['runs_per_second']:>9.0f}",
        f"e.g. {f['sample_problem']}" if f["sample_problem"] else "no run reported",
    ]
