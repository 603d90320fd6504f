"""`make demo`: migrate a SQLite database, seed examples, then serve the admin beside weft_maintenance.

Environment: ``DEMO_PORT`` (default 8000) is the port runserver listens on at 127.0.0.1; ``DEMO_DB`` (default
testproject/demo.sqlite3) is the SQLite file. ``DATABASE_URL`` is ignored: the demo always runs on SQLite.

Ctrl-C (SIGINT), SIGTERM and SIGHUP stop the demo: each child (weft_maintenance and runserver) gets exactly
one SIGINT, and is killed if it has not exited after ``STOP_TIMEOUT`` seconds (a second signal to this script
kills them at once). If a child exits on its own the other is stopped the same way. Exit codes: 0 after a
requested stop, 1 if a child or a setup step failed or the port is taken, 2 for an invalid ``DEMO_PORT``.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANAGE = [sys.executable, str(HERE / "manage.py")]
HOST = "127.0.0.1"
DEFAULT_PORT = 8000
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT = 15.0  # seconds a child has to exit after its SIGINT before it is killed
POLL = 0.1

_received: list[int] = []  # stop signals received, in order (appended by the handler, read by the main loop)


class DemoError(Exception):
    """A clear message for the user and the exit code that goes with it."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _on_signal(signum: int, frame: object) -> None:
    _received.append(signum)  # nothing else here: the main loop notices it within POLL seconds


def demo_port(value: str | None) -> int:
    """``DEMO_PORT`` as a port number (unset or empty: 8000); DemoError (exit code 2) if it is not one."""
    if value is None or not value.strip():
        return DEFAULT_PORT
    try:
        port = int(value.strip())
    except ValueError:
        raise DemoError(f"DEMO_PORT must be an integer port number (1-65535), got {value!r}", code=2) from None
    if not 1 <= port <= 65535:
        raise DemoError(f"DEMO_PORT must be between 1 and 65535, got {port}", code=2)
    return port


def check_port_free(port: int) -> None:
    """DemoError unless runserver could listen on HOST:port (bound as runserver binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            sock.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DemoError(f"port {port} on {HOST} is already in use (another `make demo`?); stop that "
                                "process or choose another port, e.g. DEMO_PORT=8100 make demo") from None
            raise DemoError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}; choose another port "
                            "with DEMO_PORT") from None


def demo_env() -> dict[str, str]:
    env = {**os.environ}
    env.pop("DATABASE_URL", None)  # the demo always uses its own SQLite file...
    if env.get("DEMO_DB"):  # ...testproject/demo.sqlite3 unless DEMO_DB names another
        env["DATABASE_URL"] = f"sqlite:///{Path(env['DEMO_DB']).expanduser().resolve()}"
    return env


def say(message: str) -> None:
    print(f"run_demo: {message}", file=sys.stderr, flush=True)


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    # Its own session: Ctrl-C in the terminal reaches only this script, which decides what each child gets
    # (a second SIGINT would make weft_maintenance exit without finishing its current step).
    return subprocess.Popen(argv, env=env, start_new_session=True)


def stop(children: dict[str, subprocess.Popen]) -> list[str]:
    """One SIGINT to each running child, then wait; kill those still running after STOP_TIMEOUT seconds (or
    at once on another stop signal). The names of the children that had to be killed."""
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
    seen = len(_received)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(child.poll() is None for child in children.values()):
        if len(_received) > seen or time.monotonic() > deadline:
            break
        time.sleep(POLL)
    killed = []
    for name, child in children.items():
        if child.poll() is None:
            killed.append(name)
            child.kill()
            child.wait()
    return killed


def run_step(name: str, argv: list[str], env: dict[str, str]) -> None:
    """Run a setup step to completion; DemoError if it fails, or if a stop signal interrupts it."""
    step = start(argv, env)
    while step.poll() is None:
        if _received:
            stop({name: step})
            raise DemoError(f"interrupted by {signal.Signals(_received[0]).name} during {name}", code=0)
        time.sleep(POLL)
    if step.returncode != 0:
        raise DemoError(f"{name} failed with exit code {step.returncode}")


def run(port: int) -> int:
    env = demo_env()
    run_step("migrate", [*MANAGE, "migrate", "--verbosity", "0"], env)
    run_step("demo_seed", [*MANAGE, "demo_seed"], env)
    check_port_free(port)  # again: it may have been taken while the database was being prepared
    children = {
        "weft_maintenance": start([*MANAGE, "weft_maintenance", "--workers", "2"], env),
    }
    try:
        children["runserver"] = start([*MANAGE, "runserver", f"{HOST}:{port}", "--noreload"], env)
        say(f"weft_maintenance pid {children['weft_maintenance'].pid}, runserver pid {children['runserver'].pid}")
        say(f"the demo admin is at http://{HOST}:{port}/admin/ (user demo, password demo); "
            "Ctrl-C (or SIGTERM/SIGHUP) stops it")
        while not _received:
            died = next((name for name, child in children.items() if child.poll() is not None), None)
            if died is not None:
                say(f"{died} exited on its own with code {children[died].returncode}; stopping the demo")
                return 1
            time.sleep(POLL)
        say(f"{signal.Signals(_received[0]).name} received; stopping the demo")
        return 0
    finally:
        killed = stop(children)
        if killed:
            say(f"killed {', '.join(killed)} (still running {STOP_TIMEOUT:g}s after its SIGINT, or a second "
                "stop signal)")
        say("stopped")


def main() -> int:
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)
    try:
        port = demo_port(os.environ.get("DEMO_PORT"))
        check_port_free(port)  # before anything starts: no half-started demo on a taken port
        return run(port)
    except DemoError as exc:
        say(str(exc))
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
