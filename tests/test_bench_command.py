"""weft_bench runs end to end at a tiny size (its figures are reported, never asserted)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_weft.models import Executor, RunStatus, Schedule, Workflow
from tests.procs import MANAGE, executor_row, wait_until


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("args", [
    ["--workflows", "5", "--steps", "2", "--workers", "2"],
    ["--schedules", "5"],
])
def test_weft_bench_prints_its_figures_as_the_last_line_and_cleans_up(args):
    out = StringIO()
    call_command("weft_bench", *args, "--probe-seconds", "0.2", stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    assert figures["raw_commits_per_second"] > 0
    assert Workflow.objects.count() == 0 and Schedule.objects.count() == 0


# --- refusing to run beside live executors, cleaning up however it ends --------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("args", [
    ["--workflows", "2"],
    ["--schedules", "2"],
    ["--seed-runs", "2"],
    ["--processes", "1", "--workflows", "2"],
    ["--latency", "1"],
])
def test_weft_bench_refuses_to_run_beside_a_live_executor(args):
    executor_row(alive=True)
    with pytest.raises(CommandError, match="refusing to run beside live executors") as refused:
        call_command("weft_bench", *args, "--probe-seconds", "0.1", stdout=StringIO(), stderr=StringIO())
    assert "weft_maintenance on worker-7 pid 4242 (2 executor thread(s), last seen 3s ago)" in str(refused.value)
    assert not Workflow.objects.exists() and not Schedule.objects.exists()
    assert "weft_bench_probe" not in connection.introspection.table_names()


@pytest.mark.django_db(transaction=True)
def test_weft_bench_runs_beside_the_row_of_a_dead_executor():
    executor_row(alive=False)
    call_command("weft_bench", "--workflows", "2", "--steps", "1", "--probe-seconds", "0.1", stdout=StringIO(),
                 stderr=StringIO())
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_weft_bench_deletes_its_runs_when_it_fails():
    with pytest.raises(CommandError, match=r"had not finished after 0\.001s"):
        call_command("weft_bench", "--workflows", "30", "--steps", "3", "--timeout", "0.001",
                     "--probe-seconds", "0.1", stdout=StringIO(), stderr=StringIO())
    assert not Workflow.objects.exists()
    assert not Executor.objects.exists()  # its in-process worker's row went with it


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum, phase", [(signal.SIGTERM, "starting"), (signal.SIGINT, "driving")])
def test_weft_bench_deletes_everything_it_created_when_interrupted(processes, signum, phase):
    bench = processes("bench", [sys.executable, MANAGE, "weft_bench", "--workflows", "1500", "--steps", "3",
                                "--probe-seconds", "0.1"], DJANGO_DEBUG="0")
    if phase == "starting":
        wait_until(lambda: Workflow.objects.exists(), "the bench to start runs", 60, [bench])
    else:
        wait_until(lambda: Workflow.objects.filter(status=RunStatus.COMPLETED).exists(),
                   "the bench to complete a run", 60, [bench])
    bench.send(signum)
    assert bench.wait(60) == 1, bench.output()
    assert f"interrupted ({signal.Signals(signum).name})" in bench.stderr(), bench.output()
    assert not Workflow.objects.exists(), bench.output()
    assert not Executor.objects.exists()
    assert "weft_bench_probe" not in connection.introspection.table_names()


@pytest.mark.django_db(transaction=True)
def test_weft_bench_in_caller_runs_each_run_in_its_callers_thread_and_splits_the_machines_cpu():
    figures, _ = run_bench_command("--in-caller", "--workflows", "12", "--steps", "2", "--workers", "2",
                                   "--probe-seconds", "0.2")
    assert figures["mode"] == "in_caller" and figures["outcomes"] == {"completed": 12 + 2 * 20}  # warm-up too
    assert figures["workflows_per_second"] > 0 and figures["commits_per_workflow"] >= 3
    split = figures["cpu_split"]
    assert split["cpus"] == os.cpu_count()
    if sys.platform == "linux":
        # The database server's share counts only CPU spent inside the window, never less than none (a caller's
        # closed connection once made it negative); the client is this process.
        assert split["machine_busy_cores"] > 0 and split["client_cores"] > 0
        assert split["database_cores"] >= 0 and split["database_cpu_ms_per_workflow"] >= 0
    assert not Workflow.objects.exists()


def test_weft_bench_is_an_app_of_its_own():
    from django.apps import apps
    from django.core.management import get_commands

    assert get_commands()["weft_bench"] == "bench"
    assert apps.get_app_config("weft_bench").name == "bench"


def test_weft_bench_rejects_bad_sizes():
    with pytest.raises(CommandError, match="--workers must be at least 1"):
        call_command("weft_bench", "--workers", "0")


# --- the modes that execute in subprocesses -------------------------------------------------------------


def rabbitmq_reachable(host: str = "127.0.0.1", port: int = 5672) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def subprocess_env(monkeypatch):
    """The bench's subprocesses inherit os.environ: point them at the test database."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
    monkeypatch.setenv("WEFT_TEST_DB_NAME", str(connection.settings_dict["NAME"]))
    monkeypatch.setenv("DJANGO_DEBUG", "0")
    monkeypatch.delenv("WEFT_EXECUTOR", raising=False)


def run_bench_command(*args: str) -> tuple[dict, str]:
    out, err = StringIO(), StringIO()
    call_command("weft_bench", *args, stdout=out, stderr=err)
    return json.loads(out.getvalue().strip().splitlines()[-1]), err.getvalue()


def assert_throughput_figures(figures: dict, workflows: int) -> None:
    assert figures["workflows"] == workflows
    for key in ("raw_commits_per_second", "workflows_per_second", "steps_per_second", "elapsed_seconds",
                "p50_ms", "p95_ms", "goal_ratio"):
        assert figures[key] is not None and figures[key] > 0, (key, figures)
    assert figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert all(code == 0 for code in figures["exit_codes"]), figures["exit_codes"]
    assert Workflow.objects.count() == 0  # the bench deleted its runs
    assert not Executor.objects.exists()  # and its executors' heartbeat rows went with them


@pytest.mark.django_db(transaction=True)
def test_weft_bench_processes_runs_every_workflow_in_weft_maintenance_subprocesses(subprocess_env):
    figures, progress = run_bench_command("--workflows", "6", "--steps", "2", "--processes", "2",
                                          "--interval", "0.2", "--probe-seconds", "0.2", "--timeout", "60")
    assert figures["mode"] == "processes" and figures["processes"] == 2
    assert_throughput_figures(figures, 6)
    # Both processes came up and stopped cleanly; between them they completed all six runs.
    assert progress.count("weft_maintenance: running with") == 2
    completed = sum(int(n) for line in figures["stopped"] for n in re.findall(r"'completed': (\d+)", line))
    assert len(figures["stopped"]) == 2 and completed == 6, figures["stopped"]


@pytest.mark.django_db(transaction=True)
def test_weft_bench_prestart_holds_the_processes_until_every_run_is_started(subprocess_env):
    figures, progress = run_bench_command("--workflows", "6", "--steps", "1", "--processes", "2", "--prestart",
                                          "--interval", "0.2", "--probe-seconds", "0.2", "--timeout", "60")
    assert figures["prestart"] is True
    assert_throughput_figures(figures, 6)
    assert "executors go" in progress
    completed = sum(int(n) for line in figures["stopped"] for n in re.findall(r"'completed': (\d+)", line))
    assert len(figures["stopped"]) == 2 and completed == 6, figures["stopped"]


@pytest.mark.django_db(transaction=True)
def test_weft_bench_celery_prestart_holds_the_worker_until_every_run_is_started(subprocess_env):
    if not rabbitmq_reachable():
        pytest.skip("needs RabbitMQ at 127.0.0.1:5672 (the default --broker)")
    figures, progress = run_bench_command("--workflows", "6", "--steps", "1", "--celery-workers", "1",
                                          "--prestart", "--probe-seconds", "0.2", "--timeout", "60")
    assert figures["prestart"] is True and "stopped consuming" in progress
    assert_throughput_figures(figures, 6)


@pytest.mark.django_db(transaction=True)
def test_weft_bench_latency_measures_both_notify_settings(subprocess_env):
    figures, _ = run_bench_command("--latency", "3", "--interval", "0.5", "--probe-seconds", "0.2")
    assert figures["mode"] == "latency" and figures["runs"] == 3
    assert figures["raw_commits_per_second"] > 0 and figures["probe_commits"] > 0
    assert figures["notify_applies"] == (connection.vendor == "postgresql")
    for key in ("notify_on", "notify_off"):
        f = figures[key]
        assert f["samples"] == 3
        assert None not in (f["p50_ms"], f["p95_ms"], f["max_ms"])
        # Each signal resumed its run after it was sent, and (polling every 0.5 s) well within seconds.
        assert 0 < f["min_ms"] <= f["p50_ms"] <= f["p95_ms"] <= f["max_ms"] < 5000, f
        u = f["update_round_trip"]  # each update was answered with its own payload, as the bench checks
        assert u["samples"] == 3 and 0 < u["min_ms"] <= u["p50_ms"] <= u["p95_ms"] <= u["max_ms"], u
    if connection.vendor == "postgresql":
        assert "LISTEN/NOTIFY" in figures["notify_on"]["wakeups"]
    assert figures["notify_off"]["wakeups"] == "polling every 0.5s"
    assert Workflow.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_weft_bench_celery_workers_runs_every_workflow_in_a_celery_worker(subprocess_env):
    if not rabbitmq_reachable():
        pytest.skip("needs RabbitMQ at 127.0.0.1:5672 (the default --broker)")
    figures, _ = run_bench_command("--workflows", "6", "--steps", "2", "--celery-workers", "1",
                                   "--probe-seconds", "0.2", "--timeout", "60")
    assert figures["mode"] == "celery" and figures["celery_workers"] == 1
    assert_throughput_figures(figures, 6)
    assert settings.WEFT_EXECUTOR != "celery"  # the bench restored the executor setting


@pytest.mark.parametrize("args, message", [
    (["--processes", "0"], "--processes must be at least 1"),
    (["--processes", "1", "--celery-workers", "1"], "not both"),
    (["--latency", "0"], "--latency must be at least 1"),
    (["--latency", "2", "--processes", "1"], "--latency goes alone"),
    (["--interval", "0"], "--interval must be positive"),
])
def test_weft_bench_rejects_bad_process_options(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("weft_bench", *args)


@pytest.mark.django_db(transaction=True)
def test_weft_bench_tasks_runs_tasks_on_our_backend_and_on_django_tasks_db(subprocess_env):
    figures, progress = run_bench_command("--tasks", "5", "--task-processes", "1", "--probe-seconds", "0.1")
    assert figures["mode"] == "tasks" and figures["tasks"] == 5 and figures["raw_commits_per_second"] > 0
    assert [r["backend"] for r in figures["rounds"]] == ["django_weft", "django-tasks-db"], progress
    assert all(r["processes"] == 1 and r["run_per_second"] > 0 and r["enqueued_per_second"] > 0
               for r in figures["rounds"])
    assert not Workflow.objects.exists() and not Executor.objects.exists()  # the bench deleted what it made
