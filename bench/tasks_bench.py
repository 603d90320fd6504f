"""``weft_bench --tasks N [--task-processes 1,4]``: Django's tasks framework on django_weft beside django-tasks' own
database backend (django-tasks-db), on the same database in the same run, with its raw commit rate.

For each backend and each number of worker processes P: P workers are started (``weft_maintenance`` with one
executor thread; ``db_worker``) and left to settle, then N no-op tasks are enqueued in one transaction (enqueues
per second: that transaction), and the time from its commit until every task has succeeded gives tasks run per
second. The tasks and their results are deleted afterwards (unless --keep).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connections, router, transaction

from bench.core import BenchError, load_average, measure_commit_rate
from bench.subprocesses import READY_LINE, Children, child_env

SETTLE_SECONDS = 3.0  # a db_worker says nothing when it is up: it is given this long


def run_tasks_bench(*, tasks: int, processes: list[int], probe_seconds: float = 2.0, timeout: float = 600.0,
                    keep: bool = False, progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    from django_weft.models import Workflow

    using = router.db_for_write(Workflow)
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commits: {raw_rate:.0f}/s")
    rounds: list[dict[str, Any]] = []
    for count in processes:
        rounds.append(_round("django_weft", count, tasks, timeout, keep, progress))
        if _has_db_backend():
            rounds.append(_round("django-tasks-db", count, tasks, timeout, keep, progress))
    return {"mode": "tasks", "vendor": connections[using].vendor, "tasks": tasks, "cpus": os.cpu_count(),
            "load_average": load_average(), "raw_commits_per_second": round(raw_rate, 1),
            "probe_commits": probe_commits, "rounds": rounds,
            "db_backend": "django-tasks-db" if _has_db_backend() else "not installed"}


def _has_db_backend() -> bool:
    from django.conf import settings

    return "db" in getattr(settings, "TASKS", {})


def _round(backend: str, count: int, tasks: int, timeout: float, keep: bool,
           progress: Callable[[str], None]) -> dict[str, Any]:
    weft = backend == "django_weft"
    with Children(progress) as children:
        for n in range(count):
            if weft:
                children.start_maintenance(f"weft-{n}", "--workers", "1", "--interval", "0.05")
            else:
                children.start(f"db-worker-{n}", [sys.executable, "-c", DB_WORKER_CODE, "--backend", "db",
                                                  "--interval", "0.05", "--no-startup-delay", "--no-reload"],
                               child_env())
        for child in children.children:
            if weft:
                children.wait_for_line(child, READY_LINE)
        if not weft:
            time.sleep(SETTLE_SECONDS)
        began = time.perf_counter()
        ids = _enqueue(weft, tasks)
        committed = time.perf_counter()
        done = _wait_done(weft, ids, timeout, children)
        figures = {"backend": backend, "processes": count, "enqueued_per_second": round(tasks / (committed - began), 1),
                   "run_per_second": round(tasks / (done - committed), 1), "seconds": round(done - committed, 2)}
    progress(f"{backend}, {count} process(es): enqueue {figures['enqueued_per_second']:.0f}/s, "
             f"run {figures['run_per_second']:.0f}/s")
    if not keep:
        _delete(weft, ids)
    return figures


DB_WORKER_CODE = ("import sys, django; django.setup(); from django.core.management import call_command; "
                  "call_command('db_worker', *sys.argv[1:])")


def _enqueue(weft: bool, tasks: int) -> list[str]:
    from bench import tasks as bench_tasks

    task = bench_tasks.noop if weft else bench_tasks.db_noop
    with transaction.atomic():
        return [task.enqueue(i).id for i in range(tasks)]


def _wait_done(weft: bool, ids: list[str], timeout: float, children: Children) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _succeeded(weft, ids) >= len(ids):
            return time.perf_counter()
        dead = [child for child in children.children if not child.alive]
        if dead:
            raise BenchError("a worker exited:\n" + "\n".join(child.describe() for child in dead))
        time.sleep(0.02)
    raise BenchError(f"{len(ids) - _succeeded(weft, ids)} of {len(ids)} tasks not done after {timeout:.0f} s")


def _succeeded(weft: bool, ids: list[str]) -> int:
    if weft:
        from django_weft.models import RunStatus, Workflow

        return Workflow.objects.filter(workflow_id__in=ids, status=RunStatus.COMPLETED).count()
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.filter(id__in=ids, status="SUCCESSFUL").count()


def _delete(weft: bool, ids: list[str]) -> None:
    if weft:
        from bench.core import delete_runs
        from django_weft.models import Workflow

        delete_runs(list(Workflow.objects.filter(workflow_id__in=ids).values_list("pk", flat=True)))
    else:
        from django_tasks_db.models import DBTaskResult

        DBTaskResult.objects.filter(id__in=ids).delete()


# --- the command's side -------------------------------------------------------------------------------------


def add_arguments(parser: Any) -> None:
    parser.add_argument("--tasks", type=int, default=None, metavar="N",
                        help="Django's tasks framework: N tasks enqueued and run on django_weft's backend and on "
                             "django-tasks-db's (db_worker), with 1 and 4 worker processes (--task-processes).")
    parser.add_argument("--task-processes", default="1,4", metavar="P[,P...]",
                        help="With --tasks: the numbers of worker processes to run them with (default 1,4).")


def chosen(options: dict[str, Any]) -> bool:
    return options.get("tasks") is not None


def mode(options: dict[str, Any]) -> tuple[Callable[..., dict], Callable[[dict], list[str]]]:
    from django.core.management.base import CommandError

    tasks = options["tasks"]
    if tasks < 1:
        raise CommandError("--tasks must be at least 1")
    raw = options.get("task_processes")
    try:
        counts = [int(part) for part in str(raw).split(",")]
    except ValueError:
        raise CommandError(f"--task-processes is a list of counts (1,4), got {raw!r}") from None
    if any(count < 1 for count in counts):
        raise CommandError("--task-processes counts must be at least 1")
    return partial(run_tasks_bench, tasks=tasks, processes=counts, probe_seconds=options["probe_seconds"],
                   timeout=options["timeout"], keep=options["keep"]), format_table


def format_table(f: dict[str, Any]) -> list[str]:
    raw = f["raw_commits_per_second"]
    lines = [f"weft_bench: {f['vendor']}, {f['tasks']} tasks per round; raw commits {raw:.0f}/s; "
             f"django-tasks-db: {f['db_backend']}"]
    lines += [f"{r['backend']}, {r['processes']} worker process(es): enqueue {r['enqueued_per_second']:.0f}/s "
              f"(one transaction), run {r['run_per_second']:.0f} tasks/s ({r['seconds']:.2f} s)" for r in f["rounds"]]
    return lines
