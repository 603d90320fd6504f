"""``manage.py weft_bench --processes P``: P real ``weft_maintenance`` subprocesses execute the runs.

:func:`run_process_bench` starts P ``weft_maintenance`` subprocesses with W executor threads each;
:mod:`.celery_worker` (``--celery-workers C``) starts one Celery worker instead, and both are timed by
:func:`drive_bench`: it measures the raw commit rate first (the probe of :mod:`bench.core`),
waits until the executors are up, then times N ``weft.bench`` starts (one transaction each, from this
process, while the executors already run) and the drive until every run has finished. Completion is seen
by polling the database (execution happens elsewhere): ``elapsed_seconds`` goes from the first start to the
latest ``finished_at``, so it includes the starts; ``drain_seconds`` is the part after the last start.
Latency is ``finished_at - created_at`` per run.

Memory (``--processes``): a thread of the bench reads each ``weft_maintenance`` process's ``VmRSS`` and
``VmHWM`` from ``/proc/<pid>/status`` every :data:`RSS_SAMPLE_SECONDS` (no database, microseconds a read),
from the moment the processes are ready until just before the bench stops them. The report gives
``rss_ready_mb`` (before the first start), ``rss_at_completions`` (the first sample after the moment, from the
runs' ``finished_at``, the completions passed 10% and 100% of N) and ``peak_rss_mb`` (``VmHWM`` just before
the stop), each a list with one figure per process, in MiB; None where /proc is not there (not Linux).
"""

from __future__ import annotations

import bisect
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections, router

from bench.core import (
    BENCH_WORKFLOW,
    GOAL_COMMITS_PER_WORKFLOW,
    GOAL_RATIO_TARGET,
    BenchError,
    bench_workflow,
    chunks,
    delete_bench_runs,
    load_average,
    measure_commit_rate,
    percentile,
    round_ms,
)
from bench.cpu_split import CpuSplit
from bench.subprocesses import READY_LINE, WAITING_LINE, Child, Children
from django_weft.common import clock
from django_weft.conf import weft_settings

POLL_SECONDS = 0.03  # completion polling in the throughput modes
RSS_SAMPLE_SECONDS = 0.1  # --processes: VmRSS/VmHWM of each weft_maintenance process read this often
RSS_MILESTONES = (0.1, 1.0)  # ... and reported as of the moment completions passed these fractions of N


# --- memory of the executors ---------------------------------------------------------------------------


class MemorySampler:
    """``VmRSS`` and ``VmHWM`` of ``children``, read every ``every`` seconds by a daemon thread between
    :meth:`start` and :meth:`stop` (each of which takes one sample itself). ``samples``: (wall time, one
    :func:`~bench.subprocesses.proc_memory_mb` dict per child) in the order taken."""

    def __init__(self, children: list[Child], every: float = RSS_SAMPLE_SECONDS) -> None:
        self.children = list(children)
        self.every = every
        self.samples: list[tuple[float, list[dict[str, float | None]]]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="weft-bench-rss", daemon=True)

    def sample(self) -> list[dict[str, float | None]]:
        taken = (time.time(), [child.memory_mb() for child in self.children])
        self.samples.append(taken)
        return taken[1]

    def _loop(self) -> None:
        while not self._stopping.wait(self.every):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> list[dict[str, float | None]]:
        """Stop the thread; the last sample, taken now."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.sample()

    def first_after(self, moment: float) -> tuple[float, list[dict[str, float | None]]]:
        """The first sample taken at or after ``moment`` (wall time); the last one if none was."""
        times = [taken for taken, _ in self.samples]
        return self.samples[min(bisect.bisect_left(times, moment), len(self.samples) - 1)]


def _field(sample: list[dict[str, float | None]], name: str) -> list[float | None]:
    return [memory[name] for memory in sample]


def _max(values: list[float | None]) -> float | None:
    return max((value for value in values if value is not None), default=None)


def memory_figures(sampler: MemorySampler, finished: list[float], began_wall: float) -> dict[str, Any]:
    """The report's memory fields (see the module's docstring) from ``sampler`` after :meth:`stop` and the
    runs' sorted ``finished_at`` wall times."""
    ready = sampler.samples[0][1]
    peak = _field(sampler.samples[-1][1], "VmHWM")  # taken by stop(), just before the processes are stopped
    at_completions = []
    for fraction in RSS_MILESTONES:
        if not finished:
            break
        count = min(len(finished), max(1, math.ceil(len(finished) * fraction)))
        moment = finished[count - 1]
        taken, memory = sampler.first_after(moment)
        at_completions.append({
            "completed": count,
            "fraction": fraction,
            "at_seconds": round(taken - began_wall, 3),
            "sampled_after_ms": round_ms((taken - moment) * 1000),
            "rss_mb": _field(memory, "VmRSS"),
            "peak_rss_mb": _field(memory, "VmHWM"),
        })
    return {
        "rss_sample_seconds": sampler.every,
        "rss_samples": len(sampler.samples),
        "rss_ready_mb": _field(ready, "VmRSS"),
        "rss_at_completions": at_completions,
        "peak_rss_mb": peak,
        "peak_rss_max_mb": _max(peak),
    }


# --- the throughput drive ------------------------------------------------------------------------------


def wait_finished(run_ids: list, children: Children, timeout: float, poll: float = POLL_SECONDS) -> dict:
    """Poll the database until every run is finished; their statuses. Raises BenchError at the deadline or
    when a subprocess exits meanwhile."""
    from django_weft.models import RunStatus, Workflow

    terminal = RunStatus.terminal_values()
    pending = set(run_ids)
    statuses: dict = {}
    deadline = time.monotonic() + timeout
    while True:
        for ids in chunks(list(pending)):
            for pk, status in Workflow.objects.filter(pk__in=ids, status__in=terminal).values_list("pk", "status"):
                statuses[pk] = status
                pending.discard(pk)
        if not pending:
            return statuses
        children.check_alive(f"{len(pending)} of {len(run_ids)} run(s) were still open")
        if time.monotonic() > deadline:
            raise BenchError(f"{len(pending)} of {len(run_ids)} run(s) had not finished after {timeout:g}s\n"
                             f"{children.describe()}")
        time.sleep(poll)


def _check_completed(statuses: dict) -> None:
    from django_weft.models import RunStatus, Workflow

    bad = [pk for pk, status in statuses.items() if status != RunStatus.COMPLETED]
    if bad:
        sample = Workflow.objects.get(pk=bad[0])
        raise BenchError(f"{len(bad)} run(s) did not complete, e.g. {sample.pk} ({sample.status}): {sample.error}")


def _throughput(run_ids: list, began_wall: float, starts_done_wall: float) -> dict[str, Any]:
    """Figures from the runs' timestamps: elapsed from ``began_wall`` to the latest finished_at, latencies."""
    from django_weft.models import Workflow

    total_ms: list[float] = []
    exec_ms: list[float] = []
    finished: list[float] = []
    last_finish = began_wall
    for ids in chunks(run_ids):
        for created, started, ended in Workflow.objects.filter(pk__in=ids).values_list(
            "created_at", "started_at", "finished_at"
        ):
            assert started is not None and ended is not None  # every run finished (wait_finished)
            total_ms.append((ended - created).total_seconds() * 1000)
            exec_ms.append((ended - started).total_seconds() * 1000)
            last_finish = max(last_finish, ended.timestamp())
            finished.append(ended.timestamp())
    finished.sort()
    return {
        "finished": finished,  # sorted wall times, for memory_figures (not reported)
        "elapsed": last_finish - began_wall,
        "drain": max(0.0, last_finish - starts_done_wall),
        "p50_ms": round_ms(percentile(total_ms, 50)),
        "p95_ms": round_ms(percentile(total_ms, 95)),
        "max_ms": round_ms(max(total_ms, default=None)),
        "exec_p50_ms": round_ms(percentile(exec_ms, 50)),
        "exec_p95_ms": round_ms(percentile(exec_ms, 95)),
    }


def drive_bench(*, mode: str, workflows: int, steps: int, probe_seconds: float, timeout: float, keep: bool,
                progress: Callable[[str], None], launch: Callable[[Children], dict[str, Any]],
                extra: dict[str, Any], go: Callable[[], None] | None = None,
                memory: bool = False) -> dict[str, Any]:
    """The common part of the throughput modes: probe, ``launch`` the executors (returns report fields),
    time the starts and the drive, stop the executors, report. ``launch`` runs inside the Children block.

    With ``go`` (--prestart) the executors launched hold off until it is called, after every run is
    started: the drive is then timed alone, from ``go`` to the last finish, free of the starter's pace."""
    from django_weft.models import Workflow
    from django_weft.services import client

    using = router.db_for_write(Workflow)
    conn = connections[using]
    open_before = Workflow.objects.open().count()
    if open_before:
        progress(f"note: {open_before} open run(s) already in the database; the executors run them too")
    load_before = load_average()
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commit rate {raw_rate:.0f}/s ({probe_commits} commits in {probe_seconds:g}s)")

    run_ids: list = []
    since = clock.now()
    try:
        with Children(progress) as children:
            launched = launch(children)
            sampler = MemorySampler(children.children) if memory else None
            if sampler is not None:
                sampler.start()
            try:
                progress(f"executors ready; starting {workflows} run(s) of {BENCH_WORKFLOW} x {steps} steps")
                began_wall = time.time()
                began = time.perf_counter()
                split = CpuSplit().start()
                for _ in range(workflows):
                    run_ids.append(client.start(bench_workflow, steps).run_id)
                start_seconds = time.perf_counter() - began
                starts_done_wall = time.time()
                progress(f"started {workflows} run(s) in {start_seconds:.2f}s; "
                         + ("executors go" if go else "waiting for them to finish"))
                if go is not None:
                    began_wall = starts_done_wall = time.time()
                    split.start()  # the drive alone
                    go()
                statuses = wait_finished(run_ids, children, timeout)
                split.stop()
                polled_seconds = time.perf_counter() - began
                load_after = load_average()
            finally:
                if sampler is not None:
                    sampler.stop()  # its last sample (VmHWM just before the stop) is the peak reported
            exit_codes = children.stop()
            stopped = [child.line_with("weft_maintenance: stopped") for child in children.children]
        _check_completed(statuses)
        figures = _throughput(run_ids, began_wall, starts_done_wall)
        memory_report = {} if sampler is None else memory_figures(sampler, figures["finished"], began_wall)
    finally:
        if not keep:
            delete_bench_runs(run_ids, BENCH_WORKFLOW, since)

    elapsed = figures["elapsed"]
    wps = workflows / elapsed
    return {
        "mode": mode,
        "prestart": go is not None,
        "vendor": conn.vendor,
        "workflows": workflows,
        "steps": steps,
        **extra,
        **launched,
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "debug": bool(settings.DEBUG),
        "claim_batch_size": weft_settings.CLAIM_BATCH_SIZE,
        "open_runs_before": open_before,
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "start_seconds": round(start_seconds, 3),
        "starts_per_second": round(workflows / start_seconds, 1),
        # From the first start (--prestart: from go) to the latest finished_at.
        "elapsed_seconds": round(elapsed, 3),
        "drain_seconds": round(figures["drain"], 3),
        "polled_seconds": round(polled_seconds, 3),
        "workflows_per_second": round(wps, 2),
        "steps_per_second": round(wps * steps, 1),
        "p50_ms": figures["p50_ms"],
        "p95_ms": figures["p95_ms"],
        "max_ms": figures["max_ms"],
        "exec_p50_ms": figures["exec_p50_ms"],
        "exec_p95_ms": figures["exec_p95_ms"],
        "floor_commits_per_workflow": steps + 2,
        "commit_floor_ratio": round(wps * (steps + 2) / raw_rate, 3),
        "goal_ratio": round(wps * GOAL_COMMITS_PER_WORKFLOW / raw_rate, 3),
        "goal_ratio_target": GOAL_RATIO_TARGET,
        **memory_report,
        # The machine's cores over the drive (with --prestart; else from the first start): busy in all, in the
        # database server; "other_cores" is the executors and the bench's own polling.
        "cpu_split": split.figures(None, workflows),
        "exit_codes": exit_codes,
        "stopped": [line for line in stopped if line],
        "kept": keep,
    }


# --- weft_maintenance processes ------------------------------------------------------------------------


def run_process_bench(*, workflows: int, steps: int, processes: int, workers: int = 1,
                      interval: float | None = None, probe_seconds: float = 2.0, timeout: float = 600.0,
                      keep: bool = False, prestart: bool = False,
                      progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """``processes`` real ``weft_maintenance`` processes with ``workers`` executor threads each execute
    ``workflows`` bench runs started from this process (with ``prestart``, all started before any process
    executes). Raises BenchError if runs fail or time out."""
    if weft_settings.EXECUTOR == "celery":
        raise BenchError("WEFT_EXECUTOR is 'celery' here: the bench's starts would send Celery tasks; "
                         "run --processes with the loop executor")

    def launch(children: Children) -> dict[str, Any]:
        args = ["--workers", str(workers)]
        if interval is not None:
            args += ["--interval", str(interval)]
        started = [children.start_maintenance(f"maintenance-{i + 1}", *args, go=go_file if prestart else None)
                   for i in range(processes)]
        if prestart:
            for child in started:
                children.wait_for_line(child, WAITING_LINE)
            return {"wakeups": "held at a barrier until every run is started"}
        lines = [children.wait_for_line(child, READY_LINE) for child in started]
        children.check_alive("starting up")
        for line in lines:
            progress(line)
        return {"wakeups": lines[0].split(", ", 1)[-1].split(";")[0] if lines else None}

    go_dir = Path(tempfile.mkdtemp(prefix="weft-bench-go-"))
    go_file = go_dir / "go"
    try:
        return drive_bench(mode="processes", workflows=workflows, steps=steps, probe_seconds=probe_seconds,
                           timeout=timeout, keep=keep, progress=progress, launch=launch,
                           go=go_file.touch if prestart else None, memory=True,
                           extra={"processes": processes, "workers_per_process": workers, "interval": interval})
    finally:
        shutil.rmtree(go_dir, ignore_errors=True)
