"""Subprocess plumbing for the tests that run real processes: ``weft_maintenance``, Celery workers and beat,
helper scripts, each on the test database with its output kept in files.

Tests using it commit their data (``transaction=True``) so that the processes, each on its own connection,
see it. Every wait is bounded by a deadline, every process is killed when its test ends, whatever happened,
and failure messages carry the processes' output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_weft.models import Executor, ExecutorKind, WorkflowStep
from tests.testapp.models import Execution

REPO_ROOT = Path(__file__).resolve().parent.parent
MANAGE = "testproject/manage.py"
# A short lease, so that a killed process's run is recovered within seconds.
SHORT_LEASE = {"WEFT_LEASE_SECONDS": "3", "WEFT_HEARTBEAT_SECONDS": "1"}
POLL = 0.05


def bound_lock_waits(seconds: int) -> None:
    """Inside a transaction: its lock waits give up after ``seconds`` (PostgreSQL: this transaction only;
    MySQL/MariaDB: this session's InnoDB lock wait timeout)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"SET LOCAL lock_timeout = '{int(seconds)}s'")
        elif connection.vendor == "mysql":
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")


# --- subprocess plumbing -------------------------------------------------------------------------------


def process_env(**env: str) -> dict[str, str]:
    """The environment of a subprocess on the test database (DATABASE_URL, or its absence, passes through)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "WEFT_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONUNBUFFERED": "1",
        **env,
    }


class Proc:
    """One subprocess (``argv``, run from the repository root) on the test database, its output in files."""

    def __init__(self, name: str, directory: Path, argv: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        self.stdout_path = directory / f"{name}.stdout"
        self.stderr_path = directory / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                list(argv), cwd=REPO_ROOT, env=process_env(**env), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        return (f"--- {self.name} (pid {self.pid}, exit code {self.popen.poll()}) stdout:\n{self.stdout()}"
                f"--- {self.name} stderr:\n{self.stderr()}")

    def send(self, signum: int) -> None:
        assert self.alive, f"{self.name} exited before it could be sent signal {signum}\n{self.output()}"
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test if the process is still running after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit within {timeout}s\n{self.output()}")

    def kill(self) -> None:
        if self.alive:
            self.popen.kill()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass


class Maintenance(Proc):
    """One ``manage.py weft_maintenance`` subprocess."""

    def __init__(self, name: str, directory: Path, args: Iterable[str], env: dict[str, str]) -> None:
        super().__init__(name, directory, [sys.executable, MANAGE, "weft_maintenance", *args], env)


@pytest.fixture
def processes(tmp_path: Path):
    """``processes(name, argv, **env)`` starts any subprocess (a Proc); all are killed at the end."""
    started: list[Proc] = []

    def start(name: str, argv: Sequence[str], **env: str) -> Proc:
        proc = Proc(name, tmp_path, argv, env)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


@pytest.fixture
def maintenance(processes):
    """``maintenance(name, *args, **env)`` starts a weft_maintenance subprocess; all are killed at the end.

    The ``django_db`` machinery is set up by autouse fixtures before this one, so it is torn down after
    it: processes are dead before the test database is flushed.
    """

    def start(name: str, *args: str, **env: str) -> Proc:
        return processes(name, [sys.executable, MANAGE, "weft_maintenance", *args], **env)

    return start


def outputs(procs: Iterable[Proc]) -> str:
    return "\n".join(proc.output() for proc in procs)


def wait_until(predicate: Callable[[], object], what: str, timeout: float,
               procs: Iterable[Proc] = (), describe: Callable[[], str] = lambda: "") -> None:
    """Poll ``predicate`` until it is true; fail (with the processes' output) at the deadline, or at once
    if one of ``procs`` (which must keep running meanwhile) exits."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while not predicate():
        for proc in procs:
            if not proc.alive:
                pytest.fail(f"{proc.name} exited while waiting for {what}\n{describe()}\n{outputs(procs)}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{describe()}\n{outputs(procs)}")
        time.sleep(POLL)


def run_once(name: str, tmp_path: Path, timeout: float = 60, **env: str) -> Maintenance:
    """Run ``weft_maintenance --once`` to completion; fail unless it exits with 0."""
    proc = Maintenance(name, tmp_path, ["--once"], env)
    try:
        code = proc.wait(timeout)
    finally:
        proc.kill()
    assert code == 0, f"{name} exited with {code}\n{proc.output()}"
    return proc


def journal(run_id: object) -> list[tuple[int, str, str, str]]:
    """The run's journal as (seq, kind, name, status), in seq order."""
    return list(WorkflowStep.objects.filter(run_id=run_id).order_by("seq")
                .values_list("seq", "kind", "name", "status"))


def pids_of(key: str) -> list[int]:
    return list(Execution.objects.filter(key=key).order_by("id").values_list("pid", flat=True))


def assert_ran_in(key: str, *expected: Proc) -> None:
    """Activity executions marked ``key`` happened once in each of ``expected``, in that order."""
    names = {proc.pid: proc.name for proc in expected}
    actual = [names.get(pid, f"pid {pid}") for pid in pids_of(key)]
    assert actual == [proc.name for proc in expected], (
        f"{key!r} executed in {actual}, expected in {[proc.name for proc in expected]}")


def in_threads(count: int, action: Callable[[int], object], timeout: float = 60) -> list:
    """``action(i)`` in ``count`` threads that start together (each connected first, so the actions themselves
    race); their results, or the exceptions they raised, by index."""
    results: list = [None] * count
    barrier = threading.Barrier(count)

    def target(index: int) -> None:
        try:
            connection.ensure_connection()
            barrier.wait(30)
            results[index] = action(index)
        except BaseException as exc:  # reported by the callers' assertions
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), f"threads did not finish within {timeout:g}s"
    return results


def executor_row(*, alive: bool) -> Executor:
    """The Executor row of a loop on another host (no process here): live, or with its lease run out."""
    now = timezone.now()
    return Executor.objects.create(kind=ExecutorKind.LOOP, host="worker-7", pid=4242, threads=2,
                                   started_at=now - timedelta(minutes=5), last_seen=now - timedelta(seconds=3),
                                   expires_at=now + timedelta(seconds=27 if alive else -60))
