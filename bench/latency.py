"""``manage.py weft_bench --latency M``: the signal-to-resume latency of an idle ``weft_maintenance`` loop, and
the round trip of an update (``handle.update``: validated, stored, applied by the run, reply returned).

:func:`run_latency_bench`: for NOTIFY on and off, one ``weft_maintenance`` subprocess polling every S
seconds, M runs of ``weft.bench.wait`` parked in ``wait_for_signal``; the signals are then sent one at a
time after a random pause (uniform 0..S, so they fall at random phases of the poll), and each latency is
the run's ``finished_at`` minus the wall time just before ``signal()``.

The update pass, in the same loop, sends M updates one at a time (again after a random pause) to one run of
``weft.bench.updates`` parked in ``wait_condition``, and times each ``handle.update()`` call as the caller sees
it; with NOTIFY on, both the loop's wake-up and the caller's wait for the reply use LISTEN/NOTIFY.

The start pass, last in the same loop, starts M runs of ``weft.bench`` (:data:`START_STEPS` steps) one at a
time, again after a random pause, each once the previous one has completed (so the loop is idle at each
start): ``start_to_completion`` times each from just before ``weft.start()`` to the moment the bench sees it
completed (polling its row every :data:`LATENCY_POLL_SECONDS`), and ``row`` its ``finished_at - created_at``
(the engine's own timestamps: the start's commit to the completion's). With NOTIFY on, the start's NOTIFY
wakes the loop; off, the loop finds the run at its next poll.

Importing this module registers the ``weft.bench.wait`` and ``weft.bench.updates`` workflows; every
``weft_maintenance`` child of the bench imports it (:func:`~bench.subprocesses.maintenance_child`)
to execute those runs.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.test.utils import override_settings

from bench.core import (
    BENCH_WORKFLOW,
    BenchError,
    bench_workflow,
    chunks,
    delete_bench_runs,
    load_average,
    measure_commit_rate,
    percentile,
    round_ms,
)
from bench.subprocesses import READY_LINE, Children
from django_weft.common import clock
from django_weft.common.registry import workflow
from django_weft.conf import weft_settings

WAIT_WORKFLOW = "weft.bench.wait"
WAIT_SIGNAL = "go"
LATENCY_POLL_SECONDS = 0.01
DEFAULT_LATENCY_INTERVAL = 1.0
START_STEPS = 3  # the steps of each run of the start pass


@workflow(name=WAIT_WORKFLOW)
def wait_workflow(ctx: Any) -> None:
    """Parks until the signal ``go`` arrives, then completes."""
    ctx.wait_for_signal(WAIT_SIGNAL)


UPDATE_WORKFLOW = "weft.bench.updates"


@workflow(name=UPDATE_WORKFLOW)
def update_workflow(ctx: Any) -> int:
    """Replies to each ``ping`` with its payload; completes after ``stop``."""
    state = {"pings": 0, "stopped": False}

    def ping(value: Any) -> Any:
        state["pings"] += 1
        return value

    ctx.set_update_handler("ping", ping)
    ctx.set_update_handler("stop", lambda: state.update(stopped=True))
    ctx.wait_condition(lambda: state["stopped"])
    return state["pings"]


def _update_round_trips(count: int, interval: float, rng: random.Random, children: Children) -> list[float]:
    from django_weft.services import client

    handle = client.start(update_workflow)
    _wait_all_waiting([handle.run_id], children, max(30.0, 10 * interval))
    timeout = max(30.0, 10 * interval)
    latencies = []
    try:
        for number in range(count):
            time.sleep(rng.uniform(0, interval))
            started = time.perf_counter()
            if handle.update("ping", number, timeout=timeout) != number:
                raise BenchError(f"update {number} of run {handle.run_id} was answered with another reply")
            latencies.append((time.perf_counter() - started) * 1000)
        handle.update("stop", timeout=timeout)
    except TimeoutError as exc:
        raise BenchError(f"{exc}\n{children.describe()}") from None
    children.check_alive("the updates were sent")
    return latencies


def _summary(latencies: list[float]) -> dict[str, Any]:
    return {
        "samples": len(latencies),
        "p50_ms": round_ms(percentile(latencies, 50)),
        "p95_ms": round_ms(percentile(latencies, 95)),
        "max_ms": round_ms(max(latencies)),
        "min_ms": round_ms(min(latencies)),
        "mean_ms": round_ms(sum(latencies) / len(latencies)),
    }


def _wait_all_waiting(run_ids: list, children: Children, timeout: float) -> None:
    from django_weft.models import RunStatus, Workflow

    deadline = time.monotonic() + timeout
    while True:
        counts: dict[str, int] = {}
        for ids in chunks(run_ids):
            for status in Workflow.objects.filter(pk__in=ids).values_list("status", flat=True):
                counts[status] = counts.get(status, 0) + 1
        if counts.get(RunStatus.WAITING, 0) == len(run_ids):
            return
        finished = sum(counts.get(status, 0) for status in RunStatus.terminal_values())
        if finished:
            raise BenchError(f"{finished} {WAIT_WORKFLOW} run(s) finished before their signal: {counts}")
        children.check_alive("the runs were starting")
        if time.monotonic() > deadline:
            raise BenchError(f"the {WAIT_WORKFLOW} runs were not all waiting after {timeout:g}s: {counts}\n"
                             f"{children.describe()}")
        time.sleep(0.05)


def _start_to_completion(count: int, steps: int, interval: float, rng: random.Random, children: Children,
                         run_ids: list) -> tuple[list[float], list[float]]:
    """Start ``count`` ``steps``-step bench runs one at a time, each after a random pause once the previous
    one completed; (ms from just before ``start()`` to the bench seeing it completed, ms ``finished_at -
    created_at``) per run. Appends each run's id to ``run_ids`` (for the clean-up) as soon as it exists."""
    from django_weft.models import Workflow
    from django_weft.services import client

    timeout = max(30.0, 10 * interval)
    seen: list[float] = []
    row: list[float] = []
    for _ in range(count):
        time.sleep(rng.uniform(0, interval))
        before = time.perf_counter()
        run_id = client.start(bench_workflow, steps).run_id
        run_ids.append(run_id)
        finished_at = _finished_at(run_id, children, timeout, after="its start")
        seen.append((time.perf_counter() - before) * 1000)
        created_at = Workflow.objects.filter(pk=run_id).values_list("created_at", flat=True).get()
        row.append((finished_at - created_at).total_seconds() * 1000)
    return seen, row


def _finished_at(run_id: Any, children: Children, timeout: float, after: str = "its signal") -> datetime:
    from django_weft.models import RunStatus, Workflow

    deadline = time.monotonic() + timeout
    while True:
        status, finished_at, error = Workflow.objects.filter(pk=run_id).values_list(
            "status", "finished_at", "error").get()
        if finished_at is not None:
            if status != RunStatus.COMPLETED:
                raise BenchError(f"run {run_id} ended {status} after {after}: {error}")
            return finished_at
        if time.monotonic() > deadline:
            raise BenchError(f"run {run_id} had not finished {timeout:g}s after {after} ({status})\n"
                             f"{children.describe()}")
        children.check_alive(f"waiting for a run to finish after {after}")
        time.sleep(LATENCY_POLL_SECONDS)


def _latency_pass(*, runs: int, interval: float, notify: bool, keep: bool, rng: random.Random,
                  progress: Callable[[str], None], steps: int = START_STEPS) -> dict[str, Any]:
    from django_weft.services import client

    label = "on" if notify else "off"
    run_ids: list = []
    start_ids: list = []
    latencies: list[float] = []
    since = clock.now()
    try:
        with override_settings(WEFT_NOTIFY=notify), Children(progress) as children:
            child = children.start_maintenance(f"maintenance-notify-{label}", "--workers", "1",
                                               "--interval", str(interval), notify=notify)
            line = children.wait_for_line(child, READY_LINE)
            progress(line)
            handles = [client.start(wait_workflow) for _ in range(runs)]
            run_ids = [handle.run_id for handle in handles]
            _wait_all_waiting(run_ids, children, max(30.0, 10 * interval))
            progress(f"notify {label}: {runs} run(s) waiting; signalling them one by one")
            load_before = load_average()
            for handle in handles:
                time.sleep(rng.uniform(0, interval))
                sent = time.time()
                client.signal(handle.workflow_id, WAIT_SIGNAL)
                finished_at = _finished_at(handle.run_id, children, max(30.0, 10 * interval))
                latencies.append((finished_at.timestamp() - sent) * 1000)
            progress(f"notify {label}: sending {runs} update(s) one by one")
            updates = _update_round_trips(runs, interval, rng, children)
            progress(f"notify {label}: starting {runs} run(s) of {BENCH_WORKFLOW} x {steps} steps one by one")
            load_starts = load_average()
            seen, row = _start_to_completion(runs, steps, interval, rng, children, start_ids)
            load_after = load_average()
            children.stop()
    finally:
        if not keep:
            delete_bench_runs(run_ids, WAIT_WORKFLOW, since)
            delete_bench_runs([], UPDATE_WORKFLOW, since)
            delete_bench_runs(start_ids, BENCH_WORKFLOW, since)
    return {
        "notify": notify,
        "wakeups": line.split(", ", 1)[-1].split(";")[0],
        **_summary(latencies),
        "update_round_trip": _summary(updates),
        # Just before weft.start() to the bench seeing the run completed; "row": its finished_at - created_at.
        "start_to_completion": {"steps": steps, **_summary(seen), "row": _summary(row),
                                "loadavg_before": load_starts},
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def run_latency_bench(*, runs: int, interval: float = DEFAULT_LATENCY_INTERVAL, keep: bool = False,
                      seed: int | None = None, steps: int = START_STEPS, probe_seconds: float = 2.0,
                      progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Signal-to-resume latency of an idle ``weft_maintenance`` loop (``--interval``), the update round trip
    and the start-to-completion of ``steps``-step runs, NOTIFY on and off."""
    from django_weft.models import Workflow

    if weft_settings.EXECUTOR == "celery":
        raise BenchError("WEFT_EXECUTOR is 'celery' here: signals would send Celery tasks; run --latency with "
                         "the loop executor")
    using = router.db_for_write(Workflow)
    vendor = connections[using].vendor
    if vendor != "postgresql":
        progress(f"note: {vendor} has no LISTEN/NOTIFY; the loop polls with NOTIFY on and off alike")
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)  # as every mode reports it
    rng = random.Random(seed)
    results = {}
    for notify in (True, False):
        results["on" if notify else "off"] = _latency_pass(runs=runs, interval=interval, notify=notify,
                                                           keep=keep, rng=rng, progress=progress, steps=steps)
    return {
        "mode": "latency",
        "vendor": vendor,
        "runs": runs,
        "interval": interval,
        "notify_applies": vendor == "postgresql",
        "cpus": os.cpu_count(),
        "debug": bool(settings.DEBUG),
        "measured_at": datetime.now(UTC).isoformat(),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "notify_on": results["on"],
        "notify_off": results["off"],
        "kept": keep,
    }
