"""``weft_bench --queues``: what flow control costs (design 9.3).

In one process and one thread, beside the raw single-connection commit rate of the same run, it times:

* **starts without a queue**: N ``weft.start()`` calls (one INSERT each): the path every run without a queue
  takes, which flow control must leave as it was;
* **starts on a queue**: N starts on a queue without limits, each followed (after its commit) by an admission
  pass that admits it: the cost a caller pays for a queued start;
* **admission**: N runs queued first (their type paused), then admitted by admission passes alone, as a
  maintenance pass does: admissions per second, on a queue without limits and on one whose every limit
  (concurrency, per key, rate, rate per key) is set but never reached, so every check runs.

No run is executed: the runs it made are deleted afterwards (unless --keep).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connections, router
from django.test.utils import override_settings

from bench import in_caller
from bench.core import BENCH_WORKFLOW, BenchError, bench_workflow, delete_bench_runs, load_average, measure_commit_rate

QUEUE_FREE = "weft.bench.free"
QUEUE_LIMITED = "weft.bench.limited"
KEYS = 50


def _limits(workflows: int) -> dict[str, dict[str, Any]]:
    # Limits that are all checked and never reached: the cost of checking, not of waiting.
    return {QUEUE_FREE: {}, QUEUE_LIMITED: {"concurrency": workflows * 2, "concurrency_per_key": workflows,
                                            "rate": f"{workflows * 100}/s", "rate_per_key": f"{workflows * 100}/s"}}


def run_queue_bench(*, workflows: int, probe_seconds: float = 2.0, keep: bool = False,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    import django_weft as weft
    from django_weft.common import clock
    from django_weft.models import QueueState, RunStatus, Workflow
    from django_weft.store import admissions

    using = router.db_for_write(Workflow)
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    since = clock.now()
    run_ids: list = []
    figures: dict[str, Any] = {}

    def timed_starts(label: str, **options: Any) -> float:
        began = time.perf_counter()
        for i in range(workflows):
            run_ids.append(weft.start(bench_workflow, 0, **{k: (v(i) if callable(v) else v)
                                                            for k, v in options.items()}).run_id)
        rate = workflows / (time.perf_counter() - began)
        progress(f"{label}: {rate:.0f}/s")
        return rate

    try:
        with override_settings(WEFT_QUEUES=_limits(workflows)):
            figures["starts_per_second_no_queue"] = round(timed_starts("starts without a queue"), 1)
            figures["starts_per_second_on_a_queue"] = round(timed_starts("starts on a queue", queue=QUEUE_FREE), 1)
            for name, field in ((QUEUE_FREE, "admissions_per_second_no_limits"),
                                (QUEUE_LIMITED, "admissions_per_second_all_limits")):
                weft.pause_type(BENCH_WORKFLOW)
                before = len(run_ids)
                timed_starts(f"queued on {name}", queue=name, concurrency_key=lambda i: f"key-{i % KEYS}")
                queued = run_ids[before:]
                _resume_without_admitting(BENCH_WORKFLOW)
                began = time.perf_counter()
                admitted = 0
                while admitted < workflows:
                    step = admissions.admit(name)
                    if step == 0:
                        raise BenchError(f"admission of {name} stopped after {admitted} of {workflows} runs")
                    admitted += step
                seconds = time.perf_counter() - began
                if Workflow.objects.filter(pk__in=queued, status=RunStatus.QUEUED).exists():
                    raise BenchError(f"runs of {name} were left queued")
                figures[field] = round(workflows / seconds, 1)
                progress(f"admission on {name}: {figures[field]:.0f}/s")
    finally:
        weft.resume_type(BENCH_WORKFLOW)
        if not keep:
            delete_bench_runs(run_ids, BENCH_WORKFLOW, since)
            QueueState.objects.filter(name__in=[QUEUE_FREE, QUEUE_LIMITED]).delete()
    return {
        "mode": "queues",
        "vendor": connections[using].vendor,
        "workflows": workflows,
        "cpus": os.cpu_count(),
        "load_average": load_average(),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        **figures,
        "max_runs_per_admission_pass": 500,
    }


def _resume_without_admitting(workflow_type: str) -> None:
    """Resume the type without the admission pass resume_type runs, so that the timed passes admit every run."""
    from django_weft.models import PausedType
    from django_weft.store import admissions

    PausedType.objects.filter(workflow_type=workflow_type).delete()
    admissions.forget_paused_types()


# --- the command's side -------------------------------------------------------------------------------------

HELP = (" With --queues it times what flow control costs, in one thread: N starts without a queue and N on a "
        "queue (each followed by the admission pass that admits it), then admission passes alone over N queued "
        "runs, on a queue without limits and on one with every limit set but never reached (see "
        "bench.queue_bench); no run is executed.")
OTHER_MODES = in_caller.OTHER_MODES  # the options of the modes that do not combine with this one


def add_arguments(parser: Any) -> None:
    parser.add_argument("--queues", action="store_true", dest="queue_costs",
                        help="Time starts on queues and admission passes (flow control's costs).")


def chosen(options: dict[str, Any]) -> bool:
    return bool(options.get("queue_costs"))


def mode(options: dict[str, Any]) -> tuple[Callable[..., dict], Callable[[dict], list[str]]]:
    from django.core.management.base import CommandError

    others = [name for name in OTHER_MODES if options.get(name) is not None]
    if others or options.get("continue_as_new") or options.get("prestart") or options.get("find") or \
            options.get("in_caller"):
        raise CommandError("--queues goes alone (with --workflows, --probe-seconds, --keep)")
    workflows = 1000 if options.get("workflows") is None else options["workflows"]
    if workflows < 1:
        raise CommandError("--workflows must be at least 1")
    return partial(run_queue_bench, workflows=workflows, probe_seconds=options["probe_seconds"],
                   keep=options["keep"]), format_table


def format_table(f: dict[str, Any]) -> list[str]:
    raw = f["raw_commits_per_second"]
    return [f"weft_bench: {f['vendor']}, {f['workflows']} runs per figure, one thread; raw commits {raw:.0f}/s",
            f"starts: {f['starts_per_second_no_queue']:.0f}/s without a queue, "
            f"{f['starts_per_second_on_a_queue']:.0f}/s on a queue (admitted after each)",
            f"admission passes: {f['admissions_per_second_no_limits']:.0f} runs/s without limits, "
            f"{f['admissions_per_second_all_limits']:.0f} runs/s with every limit checked"]
