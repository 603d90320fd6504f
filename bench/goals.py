"""Issue 36's performance goals, each measured by its own ``weft_bench`` command, in one run, in one table.

``make bench-goals`` runs it on the PostgreSQL database of DATABASE_URL (one nothing else uses). Each goal's
command runs in turn, as a subprocess with ``DJANGO_DEBUG=0``, so every figure comes with the raw
single-connection commit rate that command measured; the thread goal runs ``bench/compare_dbos.py`` (DBOS
Transact in ``.venv-dbos``, alternating rounds). Prints one Markdown table (goal, command, target, measured,
raw commits/s, met), then the CPU split behind the throughput goals (where the machine's cores went: the
database server, the client, the rest) and the highest rate those cores allow at the measured cost per run,
then the features' costs, then every command's figures as one JSON line (``--json FILE`` writes them too).

``--million`` adds goal 3's figures at a million runs (the run admin's pages and ``weft.list_runs`` /
``weft.count_runs``), on a database of their own beside DATABASE_URL's (``<name>_million``, created if missing),
so the other goals run beside no seeded history: it seeds up to a million runs with search attributes once and
keeps them for later runs (``weft_bench --find --drop-seeded`` on that database removes them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, like bench/compare_dbos.py

from bench.compare_dbos import run as run_for_json  # noqa: E402
from bench.compare_dbos import sibling_database  # noqa: E402

MILLION = 1_000_000


def weft_bench(*arguments: str) -> list[str]:
    return [sys.executable, "testproject/manage.py", "weft_bench", *arguments]


def run(command: list[str], log: Callable[[str], None], url: str | None = None) -> Any:
    """Run ``command`` from the repository's root with DEBUG off (on the database of ``url`` if given); its
    last JSON line."""
    log("$ " + " ".join(command[1:]))
    began = time.perf_counter()
    figures = run_for_json(command, {**os.environ, "DJANGO_DEBUG": "0", **({"DATABASE_URL": url} if url else {})})
    log(f"  done in {time.perf_counter() - began:.0f} s")
    return figures


def shown(command: list[str]) -> str:
    """The command as a reader would type it: ``weft_bench ...``, or ``make bench-dbos BENCH_ARGS=...``."""
    if command[1:3] == ["testproject/manage.py", "weft_bench"]:
        return "weft_bench " + " ".join(command[3:])
    arguments = list(command[2:])
    if "--dbos-python" in arguments:  # make bench-dbos passes it
        at = arguments.index("--dbos-python")
        del arguments[at:at + 2]
    return f'make bench-dbos BENCH_ARGS="{" ".join(arguments)}"'


class Goals:
    """The rows of the table, in the order measured."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}

    def add(self, goal: str, command: list[str], target: str, measured: str, raw: float | None,
            met: bool | None) -> None:
        self.rows.append({"goal": goal, "command": shown(command), "target": target, "measured": measured,
                          "raw_commits_per_second": raw, "met": met})

    def table(self) -> list[str]:
        lines = ["| goal | command | target | measured | raw commits/s | met |", "|---|---|---|---|---|---|"]
        for row in self.rows:
            raw = "" if row["raw_commits_per_second"] is None else f"{row['raw_commits_per_second']:,.0f}"
            met = {True: "yes", False: "**no**", None: "(reported)"}[row["met"]]
            lines.append(f"| {row['goal']} | `{row['command']}` | {row['target']} | {row['measured']} | {raw} "
                         f"| {met} |")
        return lines


def wake(goals: Goals, log: Callable[[str], None], rows: int) -> None:
    command = weft_bench("--continue-as-new", "--milestones", "100", "--plain-milestones", f"10,{rows}",
                         "--window", "50")
    f = goals.figures["wake"] = run(command, log)
    short, long = f["plain"][0], f["plain"][-1]
    ratio = long["ms_per_signal"] / short["ms_per_signal"]
    goals.add("1. a wake of a long run", command, "at most 2x a short run's ms per signal",
              f"{long['ms_per_signal']:.1f} ms at {long['journal_rows']:,} rows, {short['ms_per_signal']:.1f} ms at "
              f"{short['journal_rows']:,}: {ratio:.2f}x", f["raw_commits_per_second"], ratio <= 2)


def query(goals: Goals, log: Callable[[str], None], steps: int) -> None:
    command = weft_bench("--query-latency", f"10,{steps}", "--repeat", "20")
    f = goals.figures["query"] = run(command, log)
    long = f["lengths"][-1]
    goals.add("1. a query on a long run", command, f"p50 under 30 ms at {steps:,} steps",
              f"p50 {long['p50_ms']:.2f} ms (the first, which replays, {long['first_ms']:.0f} ms; nothing kept "
              f"p50 {long['replaying_p50_ms']:.0f} ms)", f["raw_commits_per_second"], long["p50_ms"] < 30)


def threads(goals: Goals, log: Callable[[str], None], dbos_python: str, workflows: int, rounds: int) -> None:
    command = [sys.executable, "bench/compare_dbos.py", "--dbos-python", dbos_python, "--workflows", str(workflows),
               "--threads", "4", "--rounds", str(rounds)]
    figures = run(command, log)
    goals.figures["threads"] = figures
    ratio = statistics.median(r["weft"]["workflows_per_second"] / r["dbos"]["workflows_per_second"]
                              for r in figures)
    weft = statistics.median(r["weft"]["workflows_per_second"] for r in figures)
    dbos = statistics.median(r["dbos"]["workflows_per_second"] for r in figures)
    raw = statistics.median(r["weft"]["raw_commits_per_second"] for r in figures)
    goals.add("2. 4 caller threads against DBOS", command, "at least 8x DBOS",
              f"{weft:.0f} against {dbos:.0f} wf/s: {ratio:.1f}x (median of {rounds} rounds)", raw, ratio >= 8)
    goals.figures["threads_bound"] = bound("4 caller threads", [r["weft"] for r in figures], 8 * dbos)


def processes(goals: Goals, log: Callable[[str], None], workflows: int) -> None:
    command = weft_bench("--workflows", str(workflows), "--processes", "4", "--prestart")
    f = goals.figures["processes"] = run(command, log)
    goals.add("2. 4 `weft_maintenance` processes", command, "`goal_ratio` at least 2.5 (wf/s x 5 / raw commits/s)",
              f"{f['workflows_per_second']:.0f} wf/s, `goal_ratio` {f['goal_ratio']:.2f}",
              f["raw_commits_per_second"], f["goal_ratio"] >= 2.5)
    goals.figures["processes_bound"] = bound("4 processes", [f], 2.5 * f["raw_commits_per_second"] / 5)


def bound(label: str, runs: list[dict[str, Any]], wanted: float) -> dict[str, Any]:
    """The CPU split of ``runs`` (medians) and the rate their cores allow at the cost per run measured."""
    splits = [r["cpu_split"] for r in runs if r.get("cpu_split", {}).get("machine_busy_cores") is not None]
    if not splits:
        return {"label": label, "measured": False}

    def median(key: str, rows: list[dict[str, Any]] = splits) -> Any:
        values = [row[key] for row in rows if row.get(key) is not None]
        return statistics.median(values) if values else None  # client_cores: None where no client was measured

    rate = statistics.median(r["workflows_per_second"] for r in runs)
    busy, database, cpus = median("machine_busy_cores"), median("database_cores"), splits[0]["cpus"]
    # The whole machine's CPU per run (client, server and the rest), from the busy cores at the rate measured.
    ms_per_run = busy * 1000 / rate
    return {"label": label, "measured": True, "workflows_per_second": rate, "cpus": cpus,
            "machine_busy_cores": busy, "database_cores": database,
            "client_cores": median("client_cores"),
            "database_cpu_ms_per_workflow": median("database_cpu_ms_per_workflow"),
            "machine_cpu_ms_per_workflow": round(ms_per_run, 3), "ceiling_workflows_per_second": round(
                cpus * 1000 / ms_per_run), "wanted_workflows_per_second": round(wanted)}


def bound_lines(figures: dict[str, Any]) -> list[str]:
    lines = []
    for key in ("threads_bound", "processes_bound"):
        b = figures.get(key)
        if not b or not b["measured"]:
            continue
        client = "" if b["client_cores"] is None else f", the client process {b['client_cores']:.2f}"
        lines.append(f"- {b['label']}: {b['workflows_per_second']:.0f} wf/s kept {b['machine_busy_cores']:.2f} of "
                     f"{b['cpus']} cores busy (the database server {b['database_cores']:.2f}{client}): "
                     f"{b['machine_cpu_ms_per_workflow']:.2f} ms of the machine's CPU a run "
                     f"({b['database_cpu_ms_per_workflow']:.2f} in the server), so its {b['cpus']} cores allow at "
                     f"most about {b['ceiling_workflows_per_second']:,} wf/s; the goal needs "
                     f"{b['wanted_workflows_per_second']:,}.")
    return lines


def latency(goals: Goals, log: Callable[[str], None], runs: int) -> None:
    command = weft_bench("--latency", str(runs))
    f = goals.figures["latency"] = run(command, log)
    on = f["notify_on"]
    row = on["start_to_completion"]["row"]
    goals.add("3. signal to resume (LISTEN/NOTIFY)", command, "p50 under 15 ms",
              f"p50 {on['p50_ms']:.1f} ms, p95 {on['p95_ms']:.1f} ms", f["raw_commits_per_second"],
              on["p50_ms"] < 15)
    goals.add("3. a 3-step run, start to completion", command, "p50 under 12 ms",
              f"p50 {row['p50_ms']:.1f} ms, p95 {row['p95_ms']:.1f} ms (as its row has it)",
              f["raw_commits_per_second"], row["p50_ms"] < 12)


def memory(goals: Goals, log: Callable[[str], None], workflows: int) -> None:
    command = weft_bench("--workflows", str(workflows), "--processes", "1", "--prestart")
    f = goals.figures["memory"] = run(command, log)
    early = f["rss_at_completions"][0]
    at_tenth, peak = early["peak_rss_mb"][0], f["peak_rss_mb"][0]
    goals.add("3. memory over many runs", command, "flat: the peak within 5% of the peak at 10% of the runs",
              f"{f['rss_ready_mb'][0]:.1f} MiB ready, peak {at_tenth:.1f} MiB at {early['completed']:,} runs, "
              f"{peak:.1f} MiB at {workflows:,}", f["raw_commits_per_second"], peak <= at_tenth * 1.05)


def million(goals: Goals, log: Callable[[str], None], url: str) -> None:
    """Seed up to a million runs (kept) on the database of ``url``, then time finding them and the run admin's
    pages over them."""
    subprocess.run([sys.executable, "testproject/manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, check=True,
                   env={**os.environ, "DATABASE_URL": url})
    seeded = seeded_runs(url)
    command = weft_bench("--find", *(["--seed-runs", str(MILLION - seeded)] if seeded < MILLION else []))
    f = goals.figures["find"] = run(command, log, url)
    pages = [q for q in f["queries"] if q["kind"] == "page"]
    counts = [q for q in f["queries"] if q["kind"] == "count"]
    worst = max(f["queries"], key=lambda q: q["p50_ms"])
    goals.add("3. finding runs at a million", command, f"every query p50 under {f['target_ms']} ms",
              f"{f['seeded_runs']:,} runs: first pages p50 {min(q['p50_ms'] for q in pages):.1f}-"
              f"{max(q['p50_ms'] for q in pages):.1f} ms, counts {min(q['p50_ms'] for q in counts):.0f}-"
              f"{max(q['p50_ms'] for q in counts):.0f} ms (slowest: {worst['name']})",
              f["raw_commits_per_second"], not f["over_target"])
    command = weft_bench("--seed-runs", "0", "--keep")
    f = goals.figures["admin"] = run(command, log, url)
    big, detail = f["admin"]["detail big run"], f["admin"]["detail"]
    slowest = max((page for name, page in f["admin"].items()), key=lambda page: page["p50_ms"])
    goals.add("3. the run admin at a million", command, "a run's page p50 under 300 ms, the 1,000-step run's too",
              f"a run's page p50 {detail['p50_ms']:.0f} ms, the 1,000-step run's p50 {big['p50_ms']:.0f} ms, p95 "
              f"{big['p95_ms']:.0f} ms; slowest page p50 {slowest['p50_ms']:.0f} ms", f["raw_commits_per_second"],
              max(detail["p50_ms"], big["p50_ms"]) < 300)


def seeded_runs(url: str) -> int:
    """Runs an earlier --million seeded (kept), counted in a subprocess so this script needs no Django."""
    done = subprocess.run([sys.executable, "testproject/manage.py", "shell", "-c",
                           "from bench import seed; print(seed.seeded_count())"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "DATABASE_URL": url})
    if done.returncode != 0:
        raise SystemExit(f"counting the seeded runs failed:\n{done.stderr[-2000:]}")
    return int(done.stdout.strip().splitlines()[-1])


def features(goals: Goals, log: Callable[[str], None], workflows: int) -> list[str]:
    command = weft_bench("--features", "--workflows", str(workflows))
    f = goals.figures["features"] = run(command, log)
    plain = f["shapes"][0]
    goals.add("4. this round's features", command, "each measured; plain runs no slower",
              f"plain runs {plain['workflows_per_second']:.0f} wf/s at {plain['cpu_ms_per_workflow']:.2f} ms CPU "
              "(the shapes below)", f["raw_commits_per_second"], None)
    lines = ["| shape | wf/s | against plain | CPU ms per run | statements per run | commits per run |",
             "|---|---|---|---|---|---|"]
    for shape in f["shapes"]:
        lines.append(f"| {shape['shape']} | {shape['workflows_per_second']:.0f} | "
                     f"{shape['workflows_per_second'] / plain['workflows_per_second']:.2f}x | "
                     f"{shape['cpu_ms_per_workflow']:.2f} | {shape['queries_per_workflow']:.1f} | "
                     f"{shape['commits_per_workflow']:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dbos-python", default=str(ROOT / ".venv-dbos" / "bin" / "python"),
                        help="The interpreter of the virtualenv holding dbos (make bench-goals makes it).")
    parser.add_argument("--rows", type=int, default=10_000, help="Goal 1: the long run's journal (default 10,000).")
    parser.add_argument("--workflows", type=int, default=2000, help="Goal 2: runs per round and thread count.")
    parser.add_argument("--rounds", type=int, default=3, help="Goal 2: alternating rounds beside DBOS.")
    parser.add_argument("--memory-runs", type=int, default=100_000, help="Goal 3: runs one process drives.")
    parser.add_argument("--million", action="store_true", help="Goal 3: also time the admin and finding at a "
                        "million seeded runs (seeded once, kept).")
    parser.add_argument("--features-runs", type=int, default=500, help="Goal 4: runs of each shape.")
    parser.add_argument("--json", metavar="FILE", default=None, help="Also write every figure to FILE.")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL database nothing else uses (DBOS runs on PostgreSQL)")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    subprocess.run([sys.executable, "testproject/manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, check=True)
    goals = Goals()
    began = time.perf_counter()
    wake(goals, log, args.rows)
    query(goals, log, args.rows)
    threads(goals, log, args.dbos_python, args.workflows, args.rounds)
    processes(goals, log, 2 * args.workflows)
    latency(goals, log, 30)
    memory(goals, log, args.memory_runs)
    if args.million:
        million(goals, log, sibling_database(url, "_million"))
    feature_lines = features(goals, log, args.features_runs)
    minutes = (time.perf_counter() - began) / 60
    lines = [f"Issue 36's goals, measured {time.strftime('%Y-%m-%d %H:%M')} in {minutes:.0f} minutes, one command "
             "after the other:", "", *goals.table(), "", "Where the CPU went (throughput goals):", "",
             *bound_lines(goals.figures), "", "What each feature costs a run (goal 4):", "", *feature_lines]
    print("\n".join(lines))
    report = {"rows": goals.rows, "figures": goals.figures}
    if args.json:
        Path(args.json).write_text(json.dumps(report, default=str))
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
