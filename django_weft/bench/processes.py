"""``manage.py weft_bench`` modes that execute in other processes: real ``weft_maintenance`` processes, a
Celery worker, and the signal-to-resume latency of an idle loop.

Importing this module registers the bench workflows (``weft.bench`` through :mod:`django_weft.bench.core`, and
``weft.bench.wait`` here), so only the bench command and the processes it starts import it.

* :func:`run_process_bench` (``--processes P``): P ``weft_maintenance`` subprocesses with W executor threads
  each; or :func:`run_celery_bench` (``--celery-workers C``): one Celery worker subprocess (prefork, C
  processes) with ``WEFT_EXECUTOR = "celery"``. Both measure the raw commit rate first (the probe of
  :mod:`django_weft.bench.core`), wait until the executors are up, then time N ``weft.bench`` starts (one
  transaction each, from this process, while the executors already run) and the drive until every run has
  finished. Completion is seen by polling the database (execution happens elsewhere): ``elapsed_seconds``
  goes from the first start to the latest ``finished_at``, so it includes the starts; ``drain_seconds`` is
  the part after the last start. Latency is ``finished_at - created_at`` per run.
* :func:`run_latency_bench` (``--latency M``): for NOTIFY on and off, one ``weft_maintenance`` subprocess
  polling every S seconds, M runs of ``weft.bench.wait`` parked in ``wait_for_signal``; the signals are then
  sent one at a time after a random pause (uniform 0..S, so they fall at random phases of the poll), and
  each latency is the run's ``finished_at`` minus the wall time just before ``signal()``.

Subprocesses inherit this process's environment (``DJANGO_SETTINGS_MODULE``, ``DATABASE_URL``...) and
``sys.path`` (as ``PYTHONPATH``); a ``weft_maintenance`` child refuses to run when its database is not the
bench's. Their output goes to files whose tail every :class:`~django_weft.bench.core.BenchError` quotes; every
wait is bounded. At the end they get SIGTERM (SIGKILL after :data:`STOP_SECONDS`); on any error, SIGKILL.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.test.utils import override_settings

from .. import clock
from ..conf import weft_settings
from ..registry import workflow
from .core import (
    BENCH_WORKFLOW,
    CHUNK,
    GOAL_COMMITS_PER_WORKFLOW,
    GOAL_RATIO_TARGET,
    BenchError,
    bench_workflow,
    delete_bench_runs,
    measure_commit_rate,
    percentile,
)

WAIT_WORKFLOW = "weft.bench.wait"
WAIT_SIGNAL = "go"
READY_LINE = "weft_maintenance: running with"
READY_SECONDS = 60.0  # a process must be up within this long
STOP_SECONDS = 20.0  # after SIGTERM, before SIGKILL
POLL_SECONDS = 0.03  # completion polling in the throughput modes
LATENCY_POLL_SECONDS = 0.01
TAIL_LINES = 15
DEFAULT_LATENCY_INTERVAL = 1.0
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
# Environment of a weft_maintenance child: the database NAME it must use, and WEFT_NOTIFY ("1"/"0") if set.
ENV_DB_NAME = "WEFT_BENCH_DB_NAME"
ENV_NOTIFY = "WEFT_BENCH_NOTIFY"
# Environment of the bench's Celery worker: the queue of the bench, for the tasks it sends itself too.
ENV_CELERY_QUEUE = "WEFT_BENCH_CELERY_QUEUE"
# --prestart: a weft_maintenance child waits until this file exists before it starts executing.
ENV_GO = "WEFT_BENCH_GO"
WAITING_LINE = "weft_bench child: ready, waiting for go"
CHILD_CODE = (
    "import django; django.setup(); "
    "from django_weft.bench.processes import maintenance_child; maintenance_child()"
)

__all__ = ["BENCH_WORKFLOW", "WAIT_WORKFLOW", "run_celery_bench", "run_latency_bench", "run_process_bench"]


if os.environ.get(ENV_CELERY_QUEUE):  # imported (-I) by the bench's Celery worker
    settings.WEFT_CELERY_QUEUE = os.environ[ENV_CELERY_QUEUE]


@workflow(name=WAIT_WORKFLOW)
def wait_workflow(ctx: Any) -> None:
    """Parks until the signal ``go`` arrives, then completes."""
    ctx.wait_for_signal(WAIT_SIGNAL)


def maintenance_child() -> None:
    """Body of a ``weft_maintenance`` subprocess (after ``django.setup()``): check that it uses the bench's
    database, apply the bench's WEFT_NOTIFY, then run the command with the arguments after ``-c CODE``."""
    from django.core.management import call_command

    from ..models import Workflow

    expected = os.environ.get(ENV_DB_NAME)
    actual = str(connections[router.db_for_write(Workflow)].settings_dict["NAME"])
    if expected is not None and actual != expected:
        sys.stderr.write(f"weft_bench child: this process would use database {actual!r}, the bench uses "
                         f"{expected!r}; start the bench with the environment that selects it\n")
        sys.exit(3)
    if os.environ.get(ENV_NOTIFY):
        settings.WEFT_NOTIFY = os.environ[ENV_NOTIFY] == "1"
    # The project's code-defined schedules are not synced into the bench's database.
    settings.WEFT_SCHEDULES = {}
    go = os.environ.get(ENV_GO)
    if go:  # --prestart: every process starts executing at the same moment, after every run is started
        print(WAITING_LINE, flush=True)
        while not os.path.exists(go):
            time.sleep(0.002)
    call_command("weft_maintenance", *sys.argv[1:])


# --- subprocesses --------------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment, its ``sys.path`` ahead of any PYTHONPATH, unbuffered output, ``extra``."""
    env = dict(os.environ)
    paths = [os.getcwd() if not entry else entry for entry in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.exists(p)))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class Child:
    """One subprocess in its own session (so its whole process group can be killed), output in files."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], directory: Path) -> None:
        self.name = name
        self.stdout_path = directory / f"{name}.stdout"
        self.stderr_path = directory / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(list(argv), env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stdout(self) -> str:
        try:
            return self.stdout_path.read_text(errors="replace")
        except OSError:
            return ""

    def line_with(self, text: str) -> str | None:
        return next((line for line in self.stdout().splitlines() if text in line), None)

    def describe(self) -> str:
        return (f"--- {self.name} (pid {self.pid}, exit code {self.popen.poll()}) stderr tail:\n"
                f"{_tail(self.stderr_path)}\n--- {self.name} stdout tail:\n{_tail(self.stdout_path)}")

    def terminate(self) -> None:
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the process and whatever is left of its process group (Celery's pool processes)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass


class Children:
    """The bench's subprocesses. Used as a context manager: leaving it kills whatever still runs (after
    :meth:`stop` nothing does), and removes the output files."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.children: list[Child] = []
        self.directory = Path(tempfile.mkdtemp(prefix="weft-bench-"))
        self.began = clock.now()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in self.children:
            child.kill()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.forget_executors()

    def forget_executors(self) -> int:
        """Delete the heartbeat rows the children left (a child killed, not stopped, keeps its row until
        it expires, and the next bench would refuse to run until then): rows of their pids on this host,
        and Celery rows of this host since the children started (pool processes, whose pids are not
        known here; the bench refused to start beside live executors, so they are the bench's)."""
        from django.db.models import Q

        from ..models import Executor, ExecutorKind

        pids = [child.pid for child in self.children]
        if not pids:
            return 0
        mine = Q(pid__in=pids) | Q(kind=ExecutorKind.CELERY, started_at__gte=self.began)
        try:
            return Executor.objects.filter(mine, host=socket.gethostname()[:255]).delete()[0]
        except Exception as exc:
            self.progress(f"note: could not delete the subprocesses' executor rows: {exc}")
            return 0

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        child = Child(name, argv, env, self.directory)
        self.children.append(child)
        self.progress(f"started {name} (pid {child.pid})")
        return child

    def start_maintenance(self, name: str, *args: str, notify: bool | None = None,
                          go: Path | None = None) -> Child:
        from ..models import Workflow

        extra = {ENV_DB_NAME: str(connections[router.db_for_write(Workflow)].settings_dict["NAME"])}
        if notify is not None:
            extra[ENV_NOTIFY] = "1" if notify else "0"
        if go is not None:
            extra[ENV_GO] = str(go)
        return self.start(name, [sys.executable, "-c", CHILD_CODE, *args], child_env(**extra))

    def describe(self) -> str:
        return "\n".join(child.describe() for child in self.children)

    def check_alive(self, what: str) -> None:
        for child in self.children:
            if not child.alive:
                raise BenchError(f"{child.name} exited while {what}\n{self.describe()}")

    def wait_for_line(self, child: Child, text: str, timeout: float = READY_SECONDS) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = child.line_with(text)
            if line is not None:
                return line
            if not child.alive:
                raise BenchError(f"{child.name} exited before printing {text!r}\n{self.describe()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{child.name} did not print {text!r} within {timeout:g}s\n{self.describe()}")
            time.sleep(0.05)

    def stop(self, timeout: float = STOP_SECONDS) -> list[int | None]:
        """SIGTERM all, wait up to ``timeout`` seconds, SIGKILL the rest; their exit codes."""
        for child in self.children:
            child.terminate()
        deadline = time.monotonic() + timeout
        for child in self.children:
            try:
                child.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.progress(f"{child.name} did not exit within {timeout:g}s of SIGTERM; killing it")
            child.kill()
        return [child.popen.returncode for child in self.children]


# --- measuring helpers ---------------------------------------------------------------------------------


def _loadavg() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _chunked(items: list) -> list[list]:
    return [items[i:i + CHUNK] for i in range(0, len(items), CHUNK)]


def wait_finished(run_ids: list, children: Children, timeout: float, poll: float = POLL_SECONDS) -> dict:
    """Poll the database until every run is finished; their statuses. Raises BenchError at the deadline or
    when a subprocess exits meanwhile."""
    from ..models import RunStatus, Workflow

    terminal = RunStatus.terminal_values()
    pending = set(run_ids)
    statuses: dict = {}
    deadline = time.monotonic() + timeout
    while True:
        for ids in _chunked(list(pending)):
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
    from ..models import RunStatus, Workflow

    bad = [pk for pk, status in statuses.items() if status != RunStatus.COMPLETED]
    if bad:
        sample = Workflow.objects.get(pk=bad[0])
        raise BenchError(f"{len(bad)} run(s) did not complete, e.g. {sample.pk} ({sample.status}): {sample.error}")


def _throughput(run_ids: list, began_wall: float, starts_done_wall: float) -> dict[str, Any]:
    """Figures from the runs' timestamps: elapsed from ``began_wall`` to the latest finished_at, latencies."""
    from ..models import Workflow

    total_ms: list[float] = []
    exec_ms: list[float] = []
    last_finish = began_wall
    for ids in _chunked(run_ids):
        for created, started, ended in Workflow.objects.filter(pk__in=ids).values_list(
            "created_at", "started_at", "finished_at"
        ):
            assert started is not None and ended is not None  # every run finished (wait_finished)
            total_ms.append((ended - created).total_seconds() * 1000)
            exec_ms.append((ended - started).total_seconds() * 1000)
            last_finish = max(last_finish, ended.timestamp())
    return {
        "elapsed": last_finish - began_wall,
        "drain": max(0.0, last_finish - starts_done_wall),
        "p50_ms": _ms(percentile(total_ms, 50)),
        "p95_ms": _ms(percentile(total_ms, 95)),
        "max_ms": _ms(max(total_ms, default=None)),
        "exec_p50_ms": _ms(percentile(exec_ms, 50)),
        "exec_p95_ms": _ms(percentile(exec_ms, 95)),
    }


def _drive_bench(*, mode: str, workflows: int, steps: int, probe_seconds: float, timeout: float, keep: bool,
                 progress: Callable[[str], None], launch: Callable[[Children], dict[str, Any]],
                 extra: dict[str, Any], go: Callable[[], None] | None = None) -> dict[str, Any]:
    """The common part of the throughput modes: probe, ``launch`` the executors (returns report fields),
    time the starts and the drive, stop the executors, report. ``launch`` runs inside the Children block.

    With ``go`` (--prestart) the executors launched hold off until it is called, after every run is
    started: the drive is then timed alone, from ``go`` to the last finish, free of the starter's pace."""
    from .. import client
    from ..models import Workflow

    using = router.db_for_write(Workflow)
    conn = connections[using]
    open_before = Workflow.objects.open().count()
    if open_before:
        progress(f"note: {open_before} open run(s) already in the database; the executors run them too")
    load_before = _loadavg()
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commit rate {raw_rate:.0f}/s ({probe_commits} commits in {probe_seconds:g}s)")

    run_ids: list = []
    since = clock.now()
    try:
        with Children(progress) as children:
            launched = launch(children)
            progress(f"executors ready; starting {workflows} run(s) of {BENCH_WORKFLOW} x {steps} steps")
            began_wall = time.time()
            began = time.perf_counter()
            for _ in range(workflows):
                run_ids.append(client.start(bench_workflow, steps).run_id)
            start_seconds = time.perf_counter() - began
            starts_done_wall = time.time()
            progress(f"started {workflows} run(s) in {start_seconds:.2f}s; "
                     + ("executors go" if go else "waiting for them to finish"))
            if go is not None:
                began_wall = starts_done_wall = time.time()
                go()
            statuses = wait_finished(run_ids, children, timeout)
            polled_seconds = time.perf_counter() - began
            load_after = _loadavg()
            exit_codes = children.stop()
            stopped = [child.line_with("weft_maintenance: stopped") for child in children.children]
        _check_completed(statuses)
        figures = _throughput(run_ids, began_wall, starts_done_wall)
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
        return _drive_bench(mode="processes", workflows=workflows, steps=steps, probe_seconds=probe_seconds,
                            timeout=timeout, keep=keep, progress=progress, launch=launch,
                            go=go_file.touch if prestart else None,
                            extra={"processes": processes, "workers_per_process": workers, "interval": interval})
    finally:
        shutil.rmtree(go_dir, ignore_errors=True)


# --- a Celery worker -----------------------------------------------------------------------------------


def _sanitize(url: str) -> str:
    from kombu.utils.url import maybe_sanitize_url

    return maybe_sanitize_url(url)


def _reset_producers(app: Any) -> None:
    """Drop the app's cached broker connection and producer pools, so the next send uses its current
    ``broker_url`` (what Celery itself does after a fork)."""
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def run_celery_bench(*, workflows: int, steps: int, celery_workers: int, celery_app: str = "testproject",
                     broker: str = DEFAULT_BROKER, probe_seconds: float = 2.0, timeout: float = 600.0,
                     keep: bool = False, prestart: bool = False,
                     progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """A Celery worker (prefork, ``celery_workers`` processes) executes ``workflows`` bench runs started
    from this process with ``WEFT_EXECUTOR = "celery"``: each start sends ``django_weft.drive`` after commit.
    With ``prestart`` the worker stops consuming its queue until every run is started.

    The tasks go to a queue of this bench alone (``weft_bench.<tag>``, deleted afterwards), consumed by a
    worker named ``weft-bench-<tag>@<host>``, so other workers on the same broker neither take them nor
    answer the readiness ping. Raises BenchError if runs fail or time out."""
    from celery._state import get_current_app
    from celery.app.utils import find_app

    try:
        app = find_app(celery_app)
    except Exception as exc:
        raise BenchError(f"cannot load the Celery app {celery_app!r}: {exc}") from None
    tag = uuid.uuid4().hex[:8]
    queue = f"weft_bench.{tag}"
    node = f"weft-bench-{tag}@{socket.gethostname()}"
    previous_app = get_current_app()
    previous_conf = {key: app.conf.get(key) for key in ("broker_url", "task_always_eager")}

    def purge_and_delete(delete: bool) -> int | None:
        try:
            with app.connection_for_write() as conn:
                channel = conn.default_channel
                purged = channel.queue_purge(queue)
                if delete:
                    channel.queue_delete(queue)
                return purged
        except Exception as exc:
            progress(f"note: could not {'delete' if delete else 'purge'} queue {queue}: {exc}")
            return None

    def launch(children: Children) -> dict[str, Any]:
        env = child_env(WEFT_EXECUTOR="celery", CELERY_BROKER_URL=broker, **{ENV_CELERY_QUEUE: queue})
        env.pop("CELERY_TASK_ALWAYS_EAGER", None)
        argv = [sys.executable, "-m", "celery", "-A", celery_app, "worker", "--concurrency", str(celery_workers),
                "--pool", "prefork", "-I", __name__, "-Q", queue, "-n", node, "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        worker = children.start("celery-worker", argv, env)
        deadline = time.monotonic() + READY_SECONDS
        while True:
            children.check_alive("waiting for it to answer a ping")
            try:
                replies = app.control.ping(destination=[node], timeout=1.0)
            except Exception as exc:
                raise BenchError(f"cannot reach the broker {_sanitize(broker)}: {exc}\n{children.describe()}") from None
            if replies:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"the Celery worker {node} did not answer a ping within {READY_SECONDS:g}s\n"
                                 f"{children.describe()}")
        progress(f"celery worker {node} (pid {worker.pid}) is up, consuming {queue}")
        purged = purge_and_delete(False)
        if prestart:
            app.control.cancel_consumer(queue, destination=[node], reply=True, timeout=5.0)
            progress(f"the worker stopped consuming {queue} until every run is started")
        return {"celery_queue": queue, "purged_before": purged}

    def go() -> None:
        app.control.add_consumer(queue, destination=[node], reply=True, timeout=5.0)

    app.set_current()
    app.conf.broker_url = broker
    app.conf.task_always_eager = False
    _reset_producers(app)
    try:
        with override_settings(WEFT_EXECUTOR="celery", WEFT_CELERY_QUEUE=queue):
            return _drive_bench(mode="celery", workflows=workflows, steps=steps, probe_seconds=probe_seconds,
                                timeout=timeout, keep=keep, progress=progress, launch=launch,
                                go=go if prestart else None,
                                extra={"celery_workers": celery_workers, "celery_pool": "prefork",
                                       "celery_app": celery_app, "broker": _sanitize(broker)})
    finally:
        purge_and_delete(True)
        for key, value in previous_conf.items():
            app.conf[key] = value
        _reset_producers(app)
        previous_app.set_current()


# --- signal-to-resume latency ------------------------------------------------------------------------


def _wait_all_waiting(run_ids: list, children: Children, timeout: float) -> None:
    from ..models import RunStatus, Workflow

    deadline = time.monotonic() + timeout
    while True:
        counts: dict[str, int] = {}
        for ids in _chunked(run_ids):
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


def _finished_at(run_id: Any, children: Children, timeout: float) -> datetime:
    from ..models import RunStatus, Workflow

    deadline = time.monotonic() + timeout
    while True:
        status, finished_at, error = Workflow.objects.filter(pk=run_id).values_list(
            "status", "finished_at", "error").get()
        if finished_at is not None:
            if status != RunStatus.COMPLETED:
                raise BenchError(f"run {run_id} ended {status} after its signal: {error}")
            return finished_at
        if time.monotonic() > deadline:
            raise BenchError(f"run {run_id} had not finished {timeout:g}s after its signal ({status})\n"
                             f"{children.describe()}")
        children.check_alive("waiting for a signalled run")
        time.sleep(LATENCY_POLL_SECONDS)


def _latency_pass(*, runs: int, interval: float, notify: bool, keep: bool, rng: random.Random,
                  progress: Callable[[str], None]) -> dict[str, Any]:
    from .. import client

    label = "on" if notify else "off"
    run_ids: list = []
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
            load_before = _loadavg()
            for handle in handles:
                time.sleep(rng.uniform(0, interval))
                sent = time.time()
                client.signal(handle.workflow_id, WAIT_SIGNAL)
                finished_at = _finished_at(handle.run_id, children, max(30.0, 10 * interval))
                latencies.append((finished_at.timestamp() - sent) * 1000)
            load_after = _loadavg()
            children.stop()
    finally:
        if not keep:
            delete_bench_runs(run_ids, WAIT_WORKFLOW, since)
    return {
        "notify": notify,
        "wakeups": line.split(", ", 1)[-1].split(";")[0],
        "samples": len(latencies),
        "p50_ms": _ms(percentile(latencies, 50)),
        "p95_ms": _ms(percentile(latencies, 95)),
        "max_ms": _ms(max(latencies)),
        "min_ms": _ms(min(latencies)),
        "mean_ms": _ms(sum(latencies) / len(latencies)),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def run_latency_bench(*, runs: int, interval: float = DEFAULT_LATENCY_INTERVAL, keep: bool = False,
                      seed: int | None = None,
                      progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Signal-to-resume latency of an idle ``weft_maintenance`` loop (``--interval``), NOTIFY on and off."""
    from ..models import Workflow

    if weft_settings.EXECUTOR == "celery":
        raise BenchError("WEFT_EXECUTOR is 'celery' here: signals would send Celery tasks; run --latency with "
                         "the loop executor")
    vendor = connections[router.db_for_write(Workflow)].vendor
    if vendor != "postgresql":
        progress(f"note: {vendor} has no LISTEN/NOTIFY; the loop polls with NOTIFY on and off alike")
    rng = random.Random(seed)
    results = {}
    for notify in (True, False):
        results["on" if notify else "off"] = _latency_pass(runs=runs, interval=interval, notify=notify,
                                                           keep=keep, rng=rng, progress=progress)
    return {
        "mode": "latency",
        "vendor": vendor,
        "runs": runs,
        "interval": interval,
        "notify_applies": vendor == "postgresql",
        "cpus": os.cpu_count(),
        "debug": bool(settings.DEBUG),
        "measured_at": datetime.now(UTC).isoformat(),
        "notify_on": results["on"],
        "notify_off": results["off"],
        "kept": keep,
    }
