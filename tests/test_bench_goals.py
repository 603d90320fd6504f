"""bench/goals.py (``make bench-goals``): the command it shows for each goal, and what it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import goals

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("url", [None, "sqlite:///tmp/x.sqlite3", "mysql://root@127.0.0.1/x"])
def test_goals_refuse_a_database_other_than_postgresql_before_measuring_anything(url):
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    if url:
        env["DATABASE_URL"] = url
    done = subprocess.run([sys.executable, "bench/goals.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "set DATABASE_URL to a PostgreSQL database nothing else uses" in done.stderr
    assert "$ " not in done.stderr  # no command ran


def test_goals_show_each_command_as_a_reader_would_type_it():
    assert goals.shown(goals.weft_bench("--latency", "30")) == "weft_bench --latency 30"
    dbos = [sys.executable, "bench/compare_dbos.py", "--dbos-python", "/somewhere/.venv-dbos/bin/python",
            "--workflows", "2000", "--threads", "4", "--rounds", "3"]
    assert goals.shown(dbos) == 'make bench-dbos BENCH_ARGS="--workflows 2000 --threads 4 --rounds 3"'


def test_the_ceiling_of_a_cpu_bound_rate_is_the_cores_over_the_machines_cpu_per_run():
    run = {"workflows_per_second": 500.0, "cpu_split": {"cpus": 2, "machine_busy_cores": 1.6, "database_cores": 0.7,
                                                        "client_cores": 0.8, "database_cpu_ms_per_workflow": 1.4}}
    bound = goals.bound("4 caller threads", [run], wanted=1100)
    # 1.6 cores at 500 runs a second is 3.2 ms of the machine's CPU a run: two cores run at most 625 a second.
    assert bound["machine_cpu_ms_per_workflow"] == 3.2 and bound["ceiling_workflows_per_second"] == 625
    assert "allow at most about 625 wf/s; the goal needs 1,100" in goals.bound_lines({"threads_bound": bound})[0]
    assert goals.bound("none", [{"workflows_per_second": 1.0}], 1)["measured"] is False
