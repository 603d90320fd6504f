"""The bench's subprocesses: start them, read their output, wait for a line, stop them, clean up after them.

:mod:`.processes`, :mod:`.celery_worker` and :mod:`.latency` run their executors this way. Subprocesses
inherit this process's environment (``DJANGO_SETTINGS_MODULE``, ``DATABASE_URL``...) and ``sys.path`` (as
``PYTHONPATH``); a ``weft_maintenance`` child (:func:`maintenance_child`) refuses to run when its database
is not the bench's. Their output goes to files whose tail every :class:`~bench.core.BenchError`
quotes; every wait is bounded. At the end they get SIGTERM (SIGKILL after :data:`STOP_SECONDS`); on any
error, SIGKILL.

:func:`proc_memory_mb` reads a child's resident set (``VmRSS``) and its peak (``VmHWM``, the high-water mark)
from ``/proc/<pid>/status``: Linux only, None elsewhere (and for a process already gone).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from django.conf import settings
from django.db import connections, router

from bench.core import BenchError
from django_weft.common import clock
from django_weft.conf import weft_settings

READY_LINE = "weft_maintenance: running with"
READY_SECONDS = 60.0  # a process must be up within this long
STOP_SECONDS = 20.0  # after SIGTERM, before SIGKILL
TAIL_LINES = 15
# Environment of a weft_maintenance child: the database NAME it must use, and WEFT_NOTIFY ("1"/"0") if set.
ENV_DB_NAME = "WEFT_BENCH_DB_NAME"
ENV_NOTIFY = "WEFT_BENCH_NOTIFY"
# --prestart: a weft_maintenance child waits until this file exists before it starts executing.
ENV_GO = "WEFT_BENCH_GO"
WAITING_LINE = "weft_bench child: ready, waiting for go"
CHILD_CODE = (
    "import django; django.setup(); "
    "from bench.subprocesses import maintenance_child; maintenance_child()"
)


def maintenance_child() -> None:
    """Body of a ``weft_maintenance`` subprocess (after ``django.setup()``): check that it uses the bench's
    database, apply the bench's WEFT_NOTIFY, then run the command with the arguments after ``-c CODE``."""
    from django.core.management import call_command

    from bench import latency  # noqa: F401  (registers weft.bench.wait, which --latency children execute)
    from django_weft.models import Workflow

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
    weft_settings.reload()  # read again: assigned directly
    go = os.environ.get(ENV_GO)
    if go:  # --prestart: every process starts executing at the same moment, after every run is started
        print(WAITING_LINE, flush=True)
        while not os.path.exists(go):
            time.sleep(0.002)
    call_command("weft_maintenance", *sys.argv[1:])


# --- memory of a process -------------------------------------------------------------------------------

MEMORY_FIELDS = ("VmRSS", "VmHWM")


def proc_memory_mb(pid: int) -> dict[str, float | None]:
    """``VmRSS`` and ``VmHWM`` of process ``pid`` in MiB (from ``/proc/<pid>/status``, which gives kB), one
    decimal; None for each when there is no such file (not Linux, or the process is gone)."""
    found: dict[str, float | None] = dict.fromkeys(MEMORY_FIELDS)
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in found:
                    found[name] = round(int(value.split()[0]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return dict.fromkeys(MEMORY_FIELDS)
    return found


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

    def memory_mb(self) -> dict[str, float | None]:
        """Its ``VmRSS`` and ``VmHWM`` now, in MiB (None each while not readable: see :func:`proc_memory_mb`)."""
        return proc_memory_mb(self.pid) if self.alive else dict.fromkeys(MEMORY_FIELDS)

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

        from django_weft.models import Executor, ExecutorKind

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
        from django_weft.models import Workflow

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
