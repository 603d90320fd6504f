"""`make demo` (testproject/run_demo.py) run for real: it stops both of its children, weft_maintenance and
runserver, on SIGTERM, SIGHUP and SIGINT, and when one of them dies on its own; DEMO_PORT is validated.

Each run gets a free port (DEMO_PORT), its own SQLite file (DEMO_DB) and a unique marker in its environment,
which every descendant inherits: the processes are found through /proc/<pid>/environ, whatever run_demo
prints, and all of them are killed when the test ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_DEMO = REPO_ROOT / "testproject" / "run_demo.py"
STARTUP_TIMEOUT = 60.0
EXIT_TIMEOUT = 60.0  # run_demo allows each child 15 s after its SIGINT before it kills it
POLL = 0.1

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds processes through /proc")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def can_listen(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port again (with SO_REUSEADDR, as runserver binds)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        except OSError:
            return False
        return True


def marked_processes(marker: str) -> dict[int, str]:
    """pid -> command line of the live processes with ``marker`` in their environment (zombies have none)."""
    needle = marker.encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours
            continue
        found[int(entry.name)] = cmdline
    return found


class Demo:
    """One run_demo.py subprocess, its output in files."""

    def __init__(self, tmp_path: Path, port: str) -> None:
        self.port = port
        self.db = tmp_path / "demo.sqlite3"
        self.marker = f"WEFT_DEMO_TEST_MARKER={uuid.uuid4().hex}"
        env = {key: value for key, value in os.environ.items()
               if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "WEFT_TEST_DB_NAME", "WEFT_EXECUTOR")}
        name, value = self.marker.split("=")
        env.update({"DEMO_PORT": port, "DEMO_DB": str(self.db), "PYTHONUNBUFFERED": "1", name: value})
        self.stdout_path = tmp_path / "run_demo.stdout"
        self.stderr_path = tmp_path / "run_demo.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen([sys.executable, str(RUN_DEMO)], cwd=REPO_ROOT, env=env, stdout=out,
                                          stderr=err, stdin=subprocess.DEVNULL)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        return (f"--- run_demo (pid {self.popen.pid}, exit code {self.popen.poll()}) stdout:\n"
                f"{self.stdout_path.read_text(errors='replace')}--- run_demo stderr:\n{self.stderr()}")

    def children(self) -> dict[int, str]:
        return {pid: cmd for pid, cmd in marked_processes(self.marker).items() if pid != self.popen.pid}

    def wait_until_serving(self) -> None:
        url = f"http://127.0.0.1:{self.port}/admin/login/"
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if self.popen.poll() is not None:
                pytest.fail(f"run_demo exited before {url} answered\n{self.output()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{url} did not answer 200 within {STARTUP_TIMEOUT}s\n{self.output()}")
            time.sleep(POLL)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run_demo did not exit within {timeout}s\n{self.output()}\n"
                        f"still running: {marked_processes(self.marker)}")

    def kill_all(self) -> None:
        for pid in marked_processes(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.popen.poll() is None:
            self.popen.kill()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass


@pytest.fixture
def demo(tmp_path: Path):
    """``demo(port)`` starts run_demo.py; everything it started is killed when the test ends."""
    started: list[Demo] = []

    def begin(port: str) -> Demo:
        started.append(Demo(tmp_path, port))
        return started[-1]

    try:
        yield begin
    finally:
        for run in started:
            run.kill_all()


def start_serving(demo) -> tuple[Demo, int, dict[int, str]]:
    port = free_port()
    run = demo(str(port))
    run.wait_until_serving()
    children = run.children()
    commands = " | ".join(children.values())
    assert "weft_maintenance" in commands and "runserver" in commands, (
        f"expected weft_maintenance and runserver children, found {children}\n{run.output()}")
    return run, port, children


def assert_all_gone(run: Demo, port: int, children: dict[int, str]) -> None:
    deadline = time.monotonic() + 10  # run_demo waits for its children, so this is normally at once
    while (left := marked_processes(run.marker)) and time.monotonic() < deadline:
        time.sleep(POLL)
    assert not left, f"still running after run_demo exited: {left} (its children were {children})\n{run.output()}"
    assert can_listen(port), f"port {port} is still taken after run_demo exited\n{run.output()}"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_stops_both_children_and_frees_the_port(demo, signum: signal.Signals) -> None:
    run, port, children = start_serving(demo)

    run.popen.send_signal(signum)  # to run_demo alone: its children are in sessions of their own

    code = run.wait(EXIT_TIMEOUT)
    assert_all_gone(run, port, children)
    assert code == 0, f"run_demo exited with {code} after {signum.name}\n{run.output()}"
    assert "killed" not in run.stderr(), f"a child needed SIGKILL, not one SIGINT\n{run.output()}"
    assert f"http://127.0.0.1:{port}/admin/" in run.stderr(), f"no URL with the port\n{run.output()}"


def test_a_child_dying_on_its_own_stops_the_other(demo) -> None:
    run, port, children = start_serving(demo)
    runserver = next(pid for pid, cmd in children.items() if "runserver" in cmd)

    os.kill(runserver, signal.SIGKILL)

    code = run.wait(EXIT_TIMEOUT)
    assert code != 0, f"run_demo exited with 0 although runserver died on its own\n{run.output()}"
    assert "runserver exited on its own" in run.stderr(), run.output()
    assert_all_gone(run, port, children)


@pytest.mark.parametrize("value", ["abc", "80.5", "0", "-1", "65536"])
def test_an_invalid_demo_port_is_refused_before_anything_starts(demo, value: str) -> None:
    run = demo(value)
    code = run.wait(20)
    assert code == 2, f"exit code {code} for DEMO_PORT={value!r}\n{run.output()}"
    assert "DEMO_PORT must be" in run.stderr() and value in run.stderr(), run.output()
    assert not run.db.exists(), "the database was prepared although DEMO_PORT is invalid"
    assert not run.children(), run.output()


def test_a_port_in_use_is_reported_before_anything_starts(demo) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = demo(str(port))
        code = run.wait(20)
    assert code == 1, f"exit code {code} for a port in use\n{run.output()}"
    assert f"port {port} on 127.0.0.1 is already in use" in run.stderr(), run.output()
    assert not run.db.exists(), "the database was prepared although the port is taken"
    assert not run.children(), run.output()
