"""manage.py weft_bench: throughput and latency of django_weft, as ratios of the database's commit rate."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Benchmark django_weft against this database. Measures the raw single-connection commit rate "
        "(one-row INSERT per transaction into a real table weft_bench_probe, dropped afterwards), then "
        "starts N K-step 'weft.bench' workflows with weft.start(), one transaction each (timed as "
        "starts_per_second), then drives them to completion with an in-process worker of W executor "
        "threads (timed as elapsed_seconds; workflows_per_second and steps_per_second are for this drive "
        "phase, end_to_end_workflows_per_second covers start + drive). p50_ms/p95_ms are per run "
        "finished_at - created_at (queueing included); exec_p50_ms/exec_p95_ms are finished_at - "
        "started_at. commit_floor_ratio = workflows_per_second * (K + 2) / raw_commits_per_second and "
        "goal_ratio = workflows_per_second * 5 / raw_commits_per_second (goal: >= 0.6 on PostgreSQL with "
        "one worker and K=3). The last line of output is one JSON object. Runs are deleted afterwards "
        "unless --keep. Run it on a database nothing else uses, with DEBUG off (DEBUG logs every query)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--workflows", type=int, default=1000, help="Runs to start (N, default 1000).")
        parser.add_argument("--steps", type=int, default=3, help="Activity steps per run (K, default 3).")
        parser.add_argument("--workers", type=int, default=1, help="Executor threads (W, default 1).")
        parser.add_argument("--probe-seconds", type=float, default=2.0,
                            help="How long to measure the raw commit rate (default 2).")
        parser.add_argument("--timeout", type=float, default=600.0,
                            help="Give up if the runs have not finished after this many seconds "
                                 "(default 600).")
        parser.add_argument("--keep", action="store_true",
                            help="Keep the bench's runs instead of deleting them.")

    def handle(self, *args: Any, workflows: int, steps: int, workers: int, probe_seconds: float,
               timeout: float, keep: bool, **options: Any) -> None:
        if workflows < 1:
            raise CommandError("--workflows must be at least 1")
        if steps < 0:
            raise CommandError("--steps must be 0 or more")
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if probe_seconds <= 0:
            raise CommandError("--probe-seconds must be positive")
        if timeout <= 0:
            raise CommandError("--timeout must be positive")

        # Imported here so the bench workflow is registered only when benchmarking.
        from django_weft.bench import BenchError, run_bench

        def progress(line: str) -> None:
            self.stderr.write(f"weft_bench: {line}")

        if settings.DEBUG:
            progress("warning: DEBUG is on, so every query is logged; results are slower than production")
        try:
            figures = run_bench(workflows=workflows, steps=steps, workers=workers,
                                probe_seconds=probe_seconds, timeout=timeout, keep=keep, progress=progress)
        except BenchError as exc:
            raise CommandError(f"weft_bench: {exc}") from None
        f = figures
        self.stdout.write(
            f"weft_bench: {f['vendor']}, {workflows} workflows x {steps} steps, "
            f"{workers} executor thread(s); raw commits {f['raw_commits_per_second']:.0f}/s; "
            f"starts {f['starts_per_second']:.0f}/s"
        )
        self.stdout.write(
            f"drive {f['elapsed_seconds']:.2f}s: {f['workflows_per_second']:.1f} workflows/s, "
            f"{f['steps_per_second']:.0f} steps/s, p50 {f['p50_ms']:.0f} ms, p95 {f['p95_ms']:.0f} ms; "
            f"goal_ratio {f['goal_ratio']:.2f} (target {f['goal_ratio_target']})"
        )
        self.stdout.write(json.dumps(figures, sort_keys=False))
