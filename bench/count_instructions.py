"""CPU per run as instructions, counted by valgrind's callgrind: a figure that noisy machines do not move.

Wall-clock CPU time on a shared 2-core machine moves by 30% from one round to the next; the instructions a
process executes do not. This runs a child process under ``valgrind --tool=callgrind`` twice, executing N1 and
then N2 three-step runs after the same warm-up, and reports (I(N2) - I(N1)) / (N2 - N1): the instructions one
run costs the client (Python, Django, psycopg and libpq; not the kernel, not the database server), with start-up
and warm-up cancelled out. Two shapes:

* ``in-caller``: ``weft.run()`` (the run started already claimed and executed in the calling thread);
* ``drive``: ``weft.start()`` for each run, then ``weft.run_maintenance()`` until they have all completed (the
  synchronous drive; it exists in every release of the engine, so releases compare like for like).

Usage (Debian: ``apt-get install valgrind``; DATABASE_URL as for the tests, a database nothing else uses)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/count_instructions.py --shape drive

Run it from another checkout's root to measure that release with the same script (it imports the package of
the checkout it is run from).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

WARM_UP = 20


def child(shape: str, count: int) -> None:
    root = Path.cwd()
    sys.path[:0] = [str(root / "testproject"), str(root)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ["DJANGO_DEBUG"] = "0"
    import django

    django.setup()
    import django_weft as weft
    from bench.core import BENCH_WORKFLOW, bench_workflow
    from django_weft.models import Workflow

    def in_caller(n: int) -> None:
        from django_weft.worker.in_caller import run

        for _ in range(n):
            run(bench_workflow, 3)

    def drive(n: int) -> None:
        for _ in range(n):
            weft.start(bench_workflow, 3)
        while Workflow.objects.filter(workflow_type=BENCH_WORKFLOW).exclude(status="completed").exists():
            weft.run_maintenance()

    if shape == "cleanup":
        Workflow.objects.filter(workflow_type=BENCH_WORKFLOW).delete()
        return
    print(Path(weft.__file__).parent)  # the package measured
    body = in_caller if shape == "in-caller" else drive
    body(WARM_UP)
    body(count)  # the runs are deleted by another child, whose cost (it grows with N) is not counted


def instructions(shape: str, count: int) -> tuple[int, str]:
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--child", shape, str(count)],
        capture_output=True, text=True,
    )
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the child failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}")
    return int(found[1]), done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("in-caller", "drive"), default="in-caller")
    parser.add_argument("--n1", type=int, default=100)
    parser.add_argument("--n2", type=int, default=300)
    parser.add_argument("--child", nargs=2, metavar=("SHAPE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL database nothing else uses")
    if args.n2 <= args.n1:
        raise SystemExit("--n2 must be larger than --n1")
    def clean() -> None:  # each measured child starts from the same table
        subprocess.run([sys.executable, __file__, "--child", "cleanup", "0"], check=True)

    try:
        clean()
        low, package = instructions(args.shape, args.n1)
        clean()
        high, _ = instructions(args.shape, args.n2)
    finally:
        clean()
    per_run = (high - low) / (args.n2 - args.n1)
    print(f"{package} {args.shape}: {per_run / 1e6:.2f} million instructions per three-step run "
          f"({args.n1} runs: {low:,}; {args.n2} runs: {high:,})")


if __name__ == "__main__":
    main()
