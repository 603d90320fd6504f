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
        "unless --keep. Run it on a database nothing else uses, with DEBUG off (DEBUG logs every query). "
        "With --schedules N it benchmarks the schedule tick instead: it bulk-creates N active '* * * * *' "
        "UTC schedules of 'weft.bench', all due at the same minute a day ahead (so a maintenance process on "
        "the real clock leaves them alone), times ONE fire_due_schedules() pass acting as of just after that "
        "minute (tick_seconds, runs_started_per_second; the runs are not executed), checks "
        "that it started exactly one run per schedule, and counts the statements it sent per schedule; "
        "schedules, runs and occurrence rows are deleted afterwards unless --keep. On PostgreSQL the "
        "schedule, run and occurrence tables are VACUUM ANALYZEd before the tick and after the cleanup."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--workflows", type=int, default=None, help="Runs to start (N, default 1000).")
        parser.add_argument("--schedules", type=int, default=None,
                            help="Benchmark the schedule tick with this many due schedules instead of "
                                 "driving workflows.")
        parser.add_argument("--profile", metavar="FILE", default=None,
                            help="With --schedules: write a cProfile of the tick to FILE.")
        parser.add_argument("--steps", type=int, default=3, help="Activity steps per run (K, default 3).")
        parser.add_argument("--workers", type=int, default=1, help="Executor threads (W, default 1).")
        parser.add_argument("--probe-seconds", type=float, default=2.0,
                            help="How long to measure the raw commit rate (default 2).")
        parser.add_argument("--timeout", type=float, default=600.0,
                            help="Give up if the runs have not finished after this many seconds "
                                 "(default 600).")
        parser.add_argument("--keep", action="store_true",
                            help="Keep the bench's runs instead of deleting them.")
        parser.add_argument("--seed-runs", type=int, default=None,
                            help="Seed N runs (types bench.seed.*) with --seed-steps journal rows each, then time "
                                 "the run admin's changelist (unfiltered, filtered, searched) and a detail page.")
        parser.add_argument("--seed-steps", type=int, default=10, help="With --seed-runs: journal rows per run.")

    def handle(self, *args: Any, workflows: int | None, schedules: int | None, profile: str | None, steps: int,
               workers: int, probe_seconds: float, timeout: float, keep: bool, **options: Any) -> None:
        if options.get("seed_runs") is not None:
            self.handle_seed(options["seed_runs"], options["seed_steps"], keep=keep)
            return
        if schedules is not None:
            if workflows is not None:
                raise CommandError("pass --workflows or --schedules, not both")
            self.handle_schedules(schedules=schedules, steps=steps, probe_seconds=probe_seconds, keep=keep,
                                  profile=profile)
            return
        if profile is not None:
            raise CommandError("--profile goes with --schedules")
        if workflows is None:
            workflows = 1000
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

    def handle_seed(self, runs: int, steps: int, *, keep: bool) -> None:
        if runs < 1 or steps < 0:
            raise CommandError("--seed-runs must be at least 1 and --seed-steps 0 or more")
        from django_weft import bench_seed

        def progress(line: str) -> None:
            self.stderr.write(f"weft_bench: {line}")

        report: dict[str, Any] = {"mode": "seed", "seed": bench_seed.seed(runs, steps, progress)}
        report["admin"] = bench_seed.time_admin_pages(progress=progress)
        report["cleanup"] = None if keep else bench_seed.cleanup(progress)
        self.stdout.write(json.dumps(report, default=str))

    def handle_schedules(self, *, schedules: int, steps: int, probe_seconds: float, keep: bool,
                         profile: str | None) -> None:
        if schedules < 1:
            raise CommandError("--schedules must be at least 1")
        if steps < 0:
            raise CommandError("--steps must be 0 or more")
        if probe_seconds <= 0:
            raise CommandError("--probe-seconds must be positive")

        from django_weft.bench import BenchError, run_schedule_bench

        def progress(line: str) -> None:
            self.stderr.write(f"weft_bench: {line}")

        if settings.DEBUG:
            progress("warning: DEBUG is on, so every query is logged; results are slower than production")
        try:
            figures = run_schedule_bench(schedules=schedules, steps=steps, probe_seconds=probe_seconds, keep=keep,
                                         profile=profile, progress=progress)
        except BenchError as exc:
            raise CommandError(f"weft_bench: {exc}") from None
        f = figures
        self.stdout.write(
            f"weft_bench: {f['vendor']}, {schedules} schedules due at {f['due_at']}; raw commits "
            f"{f['raw_commits_per_second']:.0f}/s; created in {f['create_seconds']:.2f}s"
        )
        self.stdout.write(
            f"tick {f['tick_seconds']:.2f}s: {f['runs_started']} runs started, "
            f"{f['runs_started_per_second']:.0f} runs/s, {f['queries_per_schedule']:.1f} queries per schedule"
        )
        self.stdout.write(json.dumps(figures, sort_keys=False))
