"""manage.py weft_bench: throughput and latency of django_weft, as ratios of the database's commit rate.

Only in projects with ``"django_weft.bench"`` in INSTALLED_APPS. ``--processes``, ``--celery-workers`` and
``--latency`` execute in subprocesses: see bench.processes, .celery_worker and .latency; ``--parallel``
compares parallel branches with sequential steps (bench.parallel), ``--replay-check`` times the
replay check over seeded runs (bench.replay_bench), ``--continue-as-new`` the wake cost of a run
looping on signals (bench.continue_bench), ``--query-latency`` handle.query() against history
length (bench.query_bench) and ``--find`` weft.list_runs / count_runs over seeded runs, which it
keeps (bench.find_bench). It refuses to run beside live executors, and deletes what it created
however it ends: normally, on an error, on Ctrl-C or SIGTERM (a second signal exits at once, without cleanup).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench import features_bench, find_bench, in_caller, published_bench, queue_bench, tasks_bench
from bench.safety import interruptible


def check_sizes(*, workflows: int, steps: int, workers: int, probe_seconds: float, timeout: float) -> None:
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
        "schedule, run and occurrence tables are VACUUM ANALYZEd before the tick and after the cleanup. "
        "With --processes P the runs are executed by P real weft_maintenance subprocesses (W executor threads "
        "each), with --celery-workers C by one Celery worker subprocess (prefork, C processes, "
        "WEFT_EXECUTOR=celery, broker --broker); the starts then overlap the drive, elapsed_seconds runs from "
        "the first start to the latest finished_at, and completion is polled from the database. With "
        "--latency M it measures the signal-to-resume latency of an idle weft_maintenance (--interval S) and the "
        "round trip of M updates: "
        "M runs wait for a signal, which is sent to each after a random pause of 0..S, with PostgreSQL "
        "NOTIFY on and off (see bench.latency). With --parallel K[,K...] it times, one run at a time, "
        "runs that gather K activities waiting --sleep-seconds each (time.sleep, and async def with "
        "asyncio.sleep) against runs doing the same K activities one ctx.run after another, and the same with "
        "activities that return at once (the overhead per branch); the gathers run with "
        "WEFT_MAX_PARALLEL_ACTIVITIES raised to at least K, and again at the configured limit for K above it "
        "(see bench.parallel). With --replay-check N it bulk-creates N open runs of "
        "'weft.bench.replay' parked at a signal wait after --steps activity steps (1% of them deliberately "
        "mismatched with the code: a renamed step, another signal, an unregistered version), replays them with "
        "the replay check (check_runs(), then manage.py weft_replay_check) and reports runs/s, seconds, steps "
        "replayed and the runs reported failing, which must be exactly the mismatched ones (see "
        "bench.replay_bench). With --continue-as-new it drives a run looping on "
        "ctx.wait_for_signal() that continues as new every --continue-every (100) signals, and at each of "
        "--milestones (100,10000,100000 signals consumed) measures --window (200) signals sent one at a time, "
        "each followed by the executions it causes: ms per signal, queries and commits per signal; the same "
        "for a run that never continues as new at --plain-milestones (100,2000; capped, since its cost grows "
        "with its journal) (see bench.continue_bench). With --query-latency [N[,N...]] (default "
        "10,1000,10000) it executes one run per N whose journal holds N steps (activities and ctx.now()) before a "
        "signal wait, then times --repeat (20) handle.query() calls on each: p50/p95/max ms, ms per 1,000 steps, "
        "and the journal load and dry replay alone (see bench.query_bench). It refuses to run while "
        "executors are live on the database (their heartbeat rows), and deletes what it created on every exit "
        "path, SIGTERM and Ctrl-C included."
    ) + find_bench.HELP + in_caller.HELP + queue_bench.HELP + published_bench.HELP + features_bench.HELP

    def progress_writer(self) -> Callable[[str], None]:
        """Progress lines go to stderr, so stdout's last line stays the JSON figures."""

        def progress(line: str) -> None:
            self.stderr.write(f"weft_bench: {line}")

        if settings.DEBUG:
            progress("warning: DEBUG is on, so every query is logged; results are slower than production")
        return progress

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
                            help="Seed N runs (types bench.seed.*) with --seed-steps journal rows each and one big "
                                 "run (1,000 journal rows, 50 code branches, retried steps, signals, timers), then "
                                 "time the run admin's changelist (unfiltered, filtered, searched), a run's page and "
                                 "the big run's page: p50/p95 ms and queries, over --repeat requests (default 20). "
                                 "0 seeds nothing and times the runs seeded before (kept with --keep).")
        parser.add_argument("--seed-steps", type=int, default=10, help="With --seed-runs: journal rows per run.")
        parser.add_argument("--processes", type=int, default=None,
                            help="Execute in this many weft_maintenance subprocesses (each with --workers "
                                 "threads) instead of in this process.")
        parser.add_argument("--celery-workers", type=int, default=None,
                            help="Execute in a Celery worker subprocess with this --concurrency (prefork), "
                                 "WEFT_EXECUTOR=celery.")
        parser.add_argument("--prestart", action="store_true",
                            help="With --processes/--celery-workers: start every run before the executors may "
                                 "take any, then time the drive alone (executor capacity, not the starter's pace).")
        parser.add_argument("--celery-app", default="testproject",
                            help="With --celery-workers: the Celery app (celery -A), default testproject.")
        parser.add_argument("--broker", default=None,
                            help="With --celery-workers: the broker URL (default "
                                 "amqp://guest:guest@127.0.0.1:5672//).")
        parser.add_argument("--latency", type=int, default=None, metavar="M",
                            help="Measure the signal-to-resume latency of an idle weft_maintenance over M "
                                 "signals, with NOTIFY on and off.")
        parser.add_argument("--parallel", default=None, metavar="K[,K...]",
                            help="Time runs gathering K activities that wait --sleep-seconds each against the "
                                 "sequential form and the overhead per branch, for each K (e.g. 1,8,32).")
        parser.add_argument("--sleep-seconds", type=float, default=None,
                            help="With --parallel: how long each activity waits (default 0.2).")
        parser.add_argument("--repeat", type=int, default=None,
                            help="With --parallel: runs per figure, whose median is reported (default 3); with "
                                 "--query-latency: queries timed per history length (default 20); with --seed-runs: "
                                 "requests timed per admin page (default 20).")
        parser.add_argument("--query-latency", nargs="?", const="10,1000,10000", default=None, metavar="N[,N...]",
                            help="Time handle.query() on runs whose journals hold N steps (default 10,1000,10000).")
        parser.add_argument("--replay-check", type=int, default=None, metavar="N",
                            help="Seed N open runs parked at a signal wait after --steps activity steps (1%% "
                                 "mismatched with the code) and time the replay check over them.")
        parser.add_argument("--continue-as-new", action="store_true",
                            help="Measure the cost per signal of a run looping on signals that continues as new "
                                 "every --continue-every signals, against one that never does.")
        parser.add_argument("--milestones", default=None, metavar="N[,N...]",
                            help="With --continue-as-new: signals consumed at which a window is measured "
                                 "(default 100,10000,100000).")
        parser.add_argument("--plain-milestones", default=None, metavar="N[,N...]",
                            help="With --continue-as-new: the same for the run that never continues as new "
                                 "(default 100,2000; none to skip it).")
        parser.add_argument("--window", type=int, default=None,
                            help="With --continue-as-new: signals sent one at a time per milestone (default 200).")
        parser.add_argument("--unkept", action="store_true", default=None,
                            help="With --continue-as-new: after each window of the run that never continues as new, "
                                 "time as many signals with WEFT_STICKY_ROWS = 0 (each wake replays the journal), "
                                 "then as many with WEFT_EXECUTOR_CACHE_ROWS = 0 too (each wake also reads the "
                                 "journal from the database).")
        parser.add_argument("--continue-every", type=int, default=None,
                            help="With --continue-as-new: signals per run before it continues as new "
                                 "(default 100).")
        find_bench.add_arguments(parser)
        in_caller.add_arguments(parser)
        queue_bench.add_arguments(parser)
        published_bench.add_arguments(parser)
        features_bench.add_arguments(parser)
        tasks_bench.add_arguments(parser)
        parser.add_argument("--interval", type=float, default=None,
                            help="Poll interval of the weft_maintenance subprocesses (--latency: default 1; "
                                 "--processes: default WEFT_POLL_INTERVAL).")

    def handle(self, *args: Any, **options: Any) -> None:
        with interruptible():
            try:
                plugged = next((m for m in (features_bench, in_caller, find_bench, queue_bench, published_bench,
                                           tasks_bench)
                               if m.chosen(options)),
                               None)
                self.run_mode(*plugged.mode(options)) if plugged else self.handle_mode(**options)
            except KeyboardInterrupt as exc:
                what = "its runs were kept (--keep)" if options["keep"] else "everything it created was deleted"
                raise CommandError(f"weft_bench: interrupted ({exc or 'SIGINT'}); {what}") from None

    def refuse_beside_live_executors(self) -> None:
        from bench.safety import live_executor_refusal

        refusal = live_executor_refusal()
        if refusal:
            raise CommandError(f"weft_bench: {refusal}")

    def run_mode(self, run: Callable[..., dict], table: Callable[[dict], list[str]] | None = None,
                 **kwargs: Any) -> dict[str, Any]:
        """Refuse beside live executors, ``run(progress=..., **kwargs)``, a BenchError as a CommandError; the
        figures (with ``table``: its lines and the JSON line printed)."""
        from bench.core import BenchError

        self.refuse_beside_live_executors()
        try:
            figures = run(progress=self.progress_writer(), **kwargs)
        except BenchError as exc:
            raise CommandError(f"weft_bench: {exc}") from None
        if table is not None:
            for line in table(figures):
                self.stdout.write(line)
            self.stdout.write(json.dumps(figures, sort_keys=False))
        return figures

    def handle_mode(self, *, workflows: int | None, schedules: int | None, profile: str | None, steps: int,
                    workers: int, probe_seconds: float, timeout: float, keep: bool, **options: Any) -> None:
        continue_options = ("milestones", "plain_milestones", "window", "continue_every", "unkept")
        others = ("seed_runs", "processes", "celery_workers", "latency", "interval", "parallel", "sleep_seconds",
                  "repeat")
        if options.get("query_latency") is not None:
            excluded = (*others[:-1], *continue_options, "replay_check")  # all but --repeat
            if workflows is not None or schedules is not None or profile is not None or options.get(
                    "continue_as_new") or any(options.get(name) is not None for name in excluded):
                raise CommandError("--query-latency goes alone (with --repeat, --probe-seconds, --keep)")
            self.handle_query_latency(options["query_latency"], options.get("repeat"), probe_seconds, keep=keep)
            return
        if options.get("replay_check") is not None:
            if workflows is not None or schedules is not None or profile is not None or options.get(
                    "continue_as_new") or any(options.get(name) is not None for name in (*others, *continue_options)):
                raise CommandError("--replay-check goes alone (with --steps, --keep)")
            self.handle_replay_check(options["replay_check"], steps, keep=keep)
            return
        if options.get("continue_as_new"):
            if workflows is not None or schedules is not None or profile is not None or any(
                    options.get(name) is not None for name in others):
                raise CommandError("--continue-as-new goes alone (with --milestones, --plain-milestones, --window, "
                                   "--continue-every, --unkept, --keep)")
            self.handle_continue_as_new(options, probe_seconds, keep=keep)
            return
        if any(options.get(name) is not None for name in continue_options):
            raise CommandError("--milestones, --plain-milestones, --window, --continue-every and --unkept go with "
                               "--continue-as-new")
        if options.get("parallel") is not None:
            alone = ("seed_runs", "processes", "celery_workers", "latency", "interval")
            if workflows is not None or schedules is not None or profile is not None or any(
                    options.get(name) is not None for name in alone):
                raise CommandError("--parallel goes alone (with --sleep-seconds, --repeat, --timeout, --keep)")
            self.handle_parallel(options["parallel"], options.get("sleep_seconds"), options.get("repeat"),
                                 timeout=timeout, keep=keep)
            return
        if options.get("seed_runs") is not None and options.get("sleep_seconds") is None:
            self.handle_seed(options["seed_runs"], options["seed_steps"], options.get("repeat"),
                             probe_seconds=probe_seconds, keep=keep)
            return
        if options.get("sleep_seconds") is not None or options.get("repeat") is not None:
            raise CommandError("--sleep-seconds and --repeat go with --parallel (--repeat also with --query-latency, "
                               "--seed-runs and --find)")
        processes, celery_workers = options.get("processes"), options.get("celery_workers")
        latency, interval = options.get("latency"), options.get("interval")
        if interval is not None and interval <= 0:
            raise CommandError("--interval must be positive")
        if latency is not None:
            if workflows is not None or schedules is not None or processes is not None or celery_workers is not None:
                raise CommandError("--latency goes alone (with --interval)")
            self.handle_latency(latency, interval, probe_seconds, keep=keep)
            return
        if processes is not None or celery_workers is not None:
            if schedules is not None:
                raise CommandError("--processes/--celery-workers go with --workflows, not --schedules")
            if processes is not None and celery_workers is not None:
                raise CommandError("pass --processes or --celery-workers, not both")
            self.handle_processes(workflows=1000 if workflows is None else workflows, steps=steps, workers=workers,
                                  processes=processes, celery_workers=celery_workers, interval=interval,
                                  probe_seconds=probe_seconds, timeout=timeout, keep=keep, options=options)
            return
        if interval is not None:
            raise CommandError("--interval goes with --processes or --latency")
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
        check_sizes(workflows=workflows, steps=steps, workers=workers, probe_seconds=probe_seconds,
                    timeout=timeout)

        # Imported here so the bench workflow is registered only when benchmarking.
        from bench.core import run_bench

        f = figures = self.run_mode(run_bench, workflows=workflows, steps=steps, workers=workers,
                                    probe_seconds=probe_seconds, timeout=timeout, keep=keep)
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

    def handle_seed(self, runs: int, steps: int, repeat: int | None, *, probe_seconds: float, keep: bool) -> None:
        if runs < 0 or steps < 0:
            raise CommandError("--seed-runs must be 0 or more (0: time the runs seeded before, kept with --keep) "
                               "and --seed-steps 0 or more")
        if repeat is not None and repeat < 1:
            raise CommandError("--repeat must be at least 1")
        if probe_seconds <= 0:
            raise CommandError("--probe-seconds must be positive")
        from bench import seed
        from bench.core import load_average, measure_commit_rate

        self.refuse_beside_live_executors()
        progress = self.progress_writer()
        using = seed._db()
        report: dict[str, Any] = {"mode": "seed", "loadavg_before": load_average()}
        raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
        report.update(raw_commits_per_second=round(raw_rate, 1), probe_commits=probe_commits)
        progress(f"raw commit rate {raw_rate:.0f}/s")
        try:
            report["seed"] = seed.seed(runs, steps, progress) if runs else None
            report["big_run"] = seed.seed_big_run()
            progress(f"big run: {report['big_run']}")
            report["seeded_runs"] = seeded_runs = seed.seeded_count()
            report["admin"] = seed.time_admin_pages(repetitions=repeat or seed.DEFAULT_REPETITIONS, progress=progress)
            report["loadavg"] = load_average()
        finally:
            report["cleanup"] = None if keep else seed.cleanup(progress)
        for name, page in report["admin"].items():
            self.stdout.write(f"{name}: p50 {page['p50_ms']} ms, p95 {page['p95_ms']} ms, {page['queries']} queries "
                              f"({page['sql_ms']} ms of SQL) at {seeded_runs:,} seeded runs")
        self.stdout.write(json.dumps(report, default=str))

    def handle_schedules(self, *, schedules: int, steps: int, probe_seconds: float, keep: bool,
                         profile: str | None) -> None:
        if schedules < 1:
            raise CommandError("--schedules must be at least 1")
        if steps < 0:
            raise CommandError("--steps must be 0 or more")
        if probe_seconds <= 0:
            raise CommandError("--probe-seconds must be positive")

        from bench.tick import run_schedule_bench

        f = figures = self.run_mode(run_schedule_bench, schedules=schedules, steps=steps, probe_seconds=probe_seconds,
                                    keep=keep, profile=profile)
        self.stdout.write(
            f"weft_bench: {f['vendor']}, {schedules} schedules due at {f['due_at']}; raw commits "
            f"{f['raw_commits_per_second']:.0f}/s; created in {f['create_seconds']:.2f}s"
        )
        self.stdout.write(
            f"tick {f['tick_seconds']:.2f}s: {f['runs_started']} runs started, "
            f"{f['runs_started_per_second']:.0f} runs/s, {f['queries_per_schedule']:.1f} queries per schedule"
        )
        self.stdout.write(json.dumps(figures, sort_keys=False))

    def handle_processes(self, *, workflows: int, steps: int, workers: int, processes: int | None,
                         celery_workers: int | None, interval: float | None, probe_seconds: float, timeout: float,
                         keep: bool, options: dict[str, Any]) -> None:
        check_sizes(workflows=workflows, steps=steps, workers=workers, probe_seconds=probe_seconds,
                    timeout=timeout)
        if processes is not None and processes < 1:
            raise CommandError("--processes must be at least 1")
        if celery_workers is not None and celery_workers < 1:
            raise CommandError("--celery-workers must be at least 1")

        from bench.celery_worker import DEFAULT_BROKER, run_celery_bench
        from bench.core import BenchError
        from bench.processes import run_process_bench

        self.refuse_beside_live_executors()
        progress = self.progress_writer()
        try:
            if processes is not None:
                figures = run_process_bench(workflows=workflows, steps=steps, processes=processes, workers=workers,
                                            interval=interval, probe_seconds=probe_seconds, timeout=timeout,
                                            keep=keep, prestart=options["prestart"], progress=progress)
                who = f"{processes} weft_maintenance process(es) x {workers} executor thread(s)"
            else:
                if interval is not None:
                    raise CommandError("--interval goes with --processes or --latency")
                assert celery_workers is not None  # handle_mode passes --processes or --celery-workers
                figures = run_celery_bench(workflows=workflows, steps=steps, celery_workers=celery_workers,
                                           celery_app=options["celery_app"], broker=options["broker"] or DEFAULT_BROKER,
                                           probe_seconds=probe_seconds, timeout=timeout, keep=keep,
                                           prestart=options["prestart"], progress=progress)
                who = f"a Celery worker with {celery_workers} prefork process(es)"
        except BenchError as exc:
            raise CommandError(f"weft_bench: {exc}") from None
        f = figures
        self.stdout.write(
            f"weft_bench: {f['vendor']}, {workflows} workflows x {steps} steps, {who}; raw commits "
            f"{f['raw_commits_per_second']:.0f}/s; starts {f['starts_per_second']:.0f}/s; load {f['loadavg_before']}"
        )
        self.stdout.write(
            f"start + drive {f['elapsed_seconds']:.2f}s: {f['workflows_per_second']:.1f} workflows/s, "
            f"{f['steps_per_second']:.0f} steps/s, p50 {f['p50_ms']:.0f} ms, p95 {f['p95_ms']:.0f} ms; "
            f"goal_ratio {f['goal_ratio']:.2f} (target {f['goal_ratio_target']})"
        )
        self.stdout.write(json.dumps(figures, sort_keys=False))

    def handle_latency(self, runs: int, interval: float | None, probe_seconds: float, *, keep: bool) -> None:
        if runs < 1:
            raise CommandError("--latency must be at least 1")

        from bench.latency import DEFAULT_LATENCY_INTERVAL, run_latency_bench

        figures = self.run_mode(run_latency_bench, runs=runs, keep=keep, probe_seconds=probe_seconds,
                                interval=DEFAULT_LATENCY_INTERVAL if interval is None else interval)
        self.stdout.write(f"weft_bench: {figures['vendor']}, signal-to-resume latency over {runs} signal(s), "
                          f"loop polling every {figures['interval']:g}s; raw commits "
                          f"{figures['raw_commits_per_second']:.0f}/s")
        for key in ("notify_on", "notify_off"):
            f = figures[key]
            u = f["update_round_trip"]
            self.stdout.write(f"{key.replace('_', ' ')} ({f['wakeups']}): p50 {f['p50_ms']:.0f} ms, "
                              f"p95 {f['p95_ms']:.0f} ms, max {f['max_ms']:.0f} ms; update round trip: "
                              f"p50 {u['p50_ms']:.0f} ms, p95 {u['p95_ms']:.0f} ms, max {u['max_ms']:.0f} ms")
        self.stdout.write(json.dumps(figures, sort_keys=False))

    def handle_parallel(self, parallel: str, sleep_seconds: float | None, repeat: int | None, *, timeout: float,
                        keep: bool) -> None:
        from bench.parallel import (
            DEFAULT_REPEAT,
            DEFAULT_SLEEP_SECONDS,
            format_table,
            parse_branch_counts,
            run_parallel_bench,
        )

        try:
            branch_counts = parse_branch_counts(parallel)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        sleep_seconds = DEFAULT_SLEEP_SECONDS if sleep_seconds is None else sleep_seconds
        repeat = DEFAULT_REPEAT if repeat is None else repeat
        if sleep_seconds <= 0:
            raise CommandError("--sleep-seconds must be positive")
        if repeat < 1:
            raise CommandError("--repeat must be at least 1")
        if timeout <= 0:
            raise CommandError("--timeout must be positive")

        self.run_mode(run_parallel_bench, format_table, branch_counts=branch_counts, sleep_seconds=sleep_seconds,
                      repeat=repeat, timeout=timeout, keep=keep)

    def handle_replay_check(self, runs: int, steps: int, *, keep: bool) -> None:
        if runs < 1:
            raise CommandError("--replay-check must be at least 1")
        if steps < 1:
            raise CommandError("--steps must be at least 1 with --replay-check (the runs' recorded activity steps)")

        from bench.replay_bench import format_table, run_replay_bench

        self.run_mode(run_replay_bench, format_table, runs=runs, steps=steps, keep=keep)

    def handle_continue_as_new(self, options: dict[str, Any], probe_seconds: float, *, keep: bool) -> None:
        from bench.continue_bench import (
            DEFAULT_EVERY,
            DEFAULT_MILESTONES,
            DEFAULT_PLAIN_MILESTONES,
            DEFAULT_WINDOW,
            check_spacing,
            format_table,
            parse_milestones,
            run_continue_bench,
        )

        window = DEFAULT_WINDOW if options.get("window") is None else options["window"]
        every = DEFAULT_EVERY if options.get("continue_every") is None else options["continue_every"]
        if window < 1:
            raise CommandError("--window must be at least 1")
        if every < 1:
            raise CommandError("--continue-every must be at least 1")
        if probe_seconds <= 0:
            raise CommandError("--probe-seconds must be positive")
        try:
            milestones = (list(DEFAULT_MILESTONES) if options.get("milestones") is None
                          else parse_milestones(options["milestones"], "--milestones"))
            plain = (list(DEFAULT_PLAIN_MILESTONES) if options.get("plain_milestones") is None
                     else parse_milestones(options["plain_milestones"], "--plain-milestones"))
            if not milestones:
                raise ValueError("--milestones needs at least one signal count")
            check_spacing(milestones, window, "--milestones")
            unkept = bool(options.get("unkept"))
            check_spacing(plain, window * (3 if unkept else 1), "--plain-milestones")
        except ValueError as exc:
            raise CommandError(str(exc)) from None

        self.run_mode(run_continue_bench, format_table, milestones=milestones, plain_milestones=plain, window=window,
                      every=every, keep=keep, unkept=unkept, probe_seconds=probe_seconds)

    def handle_query_latency(self, lengths: str, repeat: int | None, probe_seconds: float, *, keep: bool) -> None:
        from bench.query_bench import DEFAULT_QUERIES, format_table, parse_lengths, run_query_bench

        try:
            parsed = parse_lengths(lengths)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        repeat = DEFAULT_QUERIES if repeat is None else repeat
        if repeat < 1:
            raise CommandError("--repeat must be at least 1")
        if probe_seconds <= 0:
            raise CommandError("--probe-seconds must be positive")
        self.run_mode(run_query_bench, format_table, lengths=parsed, repeat=repeat, probe_seconds=probe_seconds,
                      keep=keep)
