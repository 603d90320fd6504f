"""django_weft beside DBOS Transact, on the same PostgreSQL server, in alternating rounds.

``make bench-dbos`` runs it (``BENCH_ARGS="--workflows 2000 --threads 1,4 --rounds 3"``): it makes the peer's
virtualenv (``.venv-dbos``, DBOS and psycopg only; never a dependency of the project) and calls this with the
project's interpreter. For each thread count and round, in turn: ``bench/dbos_peer.py`` (DBOS starts and runs
each three-step workflow in the calling thread) and ``manage.py weft_bench --in-caller`` (``weft.run()``, the
same shape), weft first in odd rounds and DBOS first in even ones. DBOS gets a database of its own on the
server of DATABASE_URL (``<name>_dbos``, created if missing). Prints a table of medians, with the raw commit
rate weft_bench measured in each round, and the rounds as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


def last_json(output: str) -> Any:
    """The last line of ``output`` that is JSON: an object (a bench's figures) or a list (this script's rounds)."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise SystemExit(f"no JSON line in:\n{output}")


def sibling_database(url: str, suffix: str) -> str:
    """The PostgreSQL database ``<name><suffix>`` on the server of ``url``, created if missing; its URL."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/") + suffix
    admin = urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(("postgresql", parts.netloc, "/" + name, "", ""))


def peer_database(url: str) -> str:
    """The DBOS database beside DATABASE_URL's."""
    return sibling_database(url, "_dbos")


def run(command: list[str], env: dict[str, str] | None = None) -> Any:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return last_json(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dbos-python", required=True, help="The interpreter of the virtualenv holding dbos.")
    parser.add_argument("--workflows", type=int, default=2000)
    parser.add_argument("--threads", default="1,4", help="Thread counts, comma-separated (default 1,4).")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL database nothing else uses (DBOS runs on PostgreSQL)")
    dbos_url = peer_database(url)
    env = {**os.environ, "DJANGO_DEBUG": "0"}
    manage = [sys.executable, "testproject/manage.py"]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
    rounds: list[dict] = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for number in range(1, args.rounds + 1):
            weft_command = [*manage, "weft_bench", "--in-caller", "--workflows", str(args.workflows),
                            "--workers", str(threads)]
            dbos_command = [args.dbos_python, "bench/dbos_peer.py", dbos_url, str(args.workflows), str(threads)]
            order = [("weft", weft_command), ("dbos", dbos_command)]
            figures = {name: run(command, env) for name, command in (order if number % 2 else order[::-1])}
            rounds.append({"threads": threads, "round": number, "weft": figures["weft"], "dbos": figures["dbos"]})
            print(f"threads {threads} round {number}: weft {figures['weft']['workflows_per_second']} wf/s, dbos "
                  f"{figures['dbos']['workflows_per_second']} wf/s, raw commits "
                  f"{figures['weft']['raw_commits_per_second']}/s", file=sys.stderr)
    print("| threads | django_weft wf/s | DBOS wf/s | ratio | weft CPU ms/run | DBOS CPU ms/run | raw commits/s |")
    print("|---|---|---|---|---|---|---|")
    for threads in sorted({r["threads"] for r in rounds}):
        mine = [r for r in rounds if r["threads"] == threads]

        def median(who: str, key: str, rows: list[dict] = mine) -> float:
            return statistics.median(r[who][key] for r in rows)

        ratio = statistics.median(r["weft"]["workflows_per_second"] / r["dbos"]["workflows_per_second"] for r in mine)
        print(f"| {threads} | {median('weft', 'workflows_per_second'):.0f} | "
              f"{median('dbos', 'workflows_per_second'):.0f} | {ratio:.1f}x | "
              f"{median('weft', 'cpu_ms_per_workflow'):.2f} | {median('dbos', 'cpu_ms_per_workflow'):.2f} | "
              f"{median('weft', 'raw_commits_per_second'):,.0f} |")
    print(json.dumps(rounds))


if __name__ == "__main__":
    main()
