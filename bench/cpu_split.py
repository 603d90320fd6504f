"""Where the machine's CPU went while a measurement ran: the database server's processes, everything else, idle.

On a small machine the database server and the client share the cores, so a throughput figure alone cannot say
whether more runs a second were possible. :class:`CpuSplit` reads ``/proc`` (Linux only; every figure is
``None`` elsewhere) before and after: the machine's busy time from ``/proc/stat`` and the CPU time of every
process named like a database server (``postgres``, ``mariadbd``, ``mysqld``) from ``/proc/<pid>/stat``. It
reports each as cores (CPU seconds over wall seconds), so ``machine_busy_cores`` close to ``cpus`` means the
machine had nothing left to give. A server process that exits inside the window takes its time with it, so a
bench keeps its connections open until the window ends; reading ``/proc`` costs about a millisecond.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

SERVER_NAMES = frozenset({"postgres", "mariadbd", "mysqld"})
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal; idle (3) and iowait (4) are not busy


def _machine_busy_ticks() -> int | None:
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))


def _server_ticks() -> dict[int, int] | None:
    """utime + stime of every live database server process by pid (``None`` where ``/proc`` is not there)."""
    if not Path("/proc/self/stat").exists():
        return None
    ticks = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, _, rest = text.partition("(")[2].rpartition(")")
        if name.split(":", 1)[0].strip() in SERVER_NAMES:
            fields = rest.split()
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return ticks


def _server_delta(before: dict[int, int] | None, after: dict[int, int] | None) -> int | None:
    """The server's CPU ticks in between: what each process alive at the end spent since the start (all of it,
    for one that started meanwhile); a process that exited meanwhile took its ticks with it."""
    if before is None or after is None:
        return None
    return sum(spent - before.get(pid, 0) for pid, spent in after.items())


class CpuSplit:
    """``split.start()`` and ``split.stop()`` (or ``with CpuSplit() as split:``) around the measured window,
    then ``split.figures(client_cpu_seconds, workflows)``."""

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._busy: int | None = None
        self._server: dict[int, int] | None = None
        self._seconds = 0.0
        self._busy_delta: int | None = None
        self._server_delta: int | None = None

    def start(self) -> CpuSplit:
        self._wall = time.perf_counter()
        self._busy, self._server = _machine_busy_ticks(), _server_ticks()
        return self

    def stop(self) -> None:
        self._seconds = time.perf_counter() - self._wall
        busy, server = _machine_busy_ticks(), _server_ticks()
        self._busy_delta = None if busy is None or self._busy is None else busy - self._busy
        self._server_delta = _server_delta(self._server, server)

    def __enter__(self) -> CpuSplit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def figures(self, client_cpu_seconds: float | None, workflows: int) -> dict[str, Any]:
        """Cores busy in all, in the database server, in the measured client, in the rest; and per run, the
        server's CPU milliseconds."""
        seconds = max(self._seconds, 1e-9)

        def cores(ticks: int | None) -> float | None:
            return None if ticks is None else round(ticks / _TICKS / seconds, 2)

        client = None if client_cpu_seconds is None else round(client_cpu_seconds / seconds, 2)
        busy, server = cores(self._busy_delta), cores(self._server_delta)
        # The rest: other processes on the machine (with no client figure, the client is part of it).
        rest = None if busy is None or server is None else round(busy - server - (client or 0.0), 2)
        return {
            "cpus": os.cpu_count(),
            "machine_busy_cores": busy,
            "database_cores": server,
            "client_cores": client,
            "other_cores": rest,
            "database_cpu_ms_per_workflow": (None if self._server_delta is None or not workflows else
                                             round(self._server_delta / _TICKS * 1000 / workflows, 3)),
        }
