"""weft_bench's memory figures (--processes: peak RSS of each weft_maintenance process, RSS at 10% and 100% of
the completions) and start-to-completion latency (--latency: one three-step run at a time on an idle loop),
run end to end at a tiny size on PostgreSQL; the figures are checked for plausibility only."""

from __future__ import annotations

import os
import sys

import pytest
from django.db import connection

from bench.subprocesses import proc_memory_mb
from django_weft.models import Executor, Workflow
from tests.test_bench_command import run_bench_command, subprocess_env  # noqa: F401  (a fixture)

linux_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS/VmHWM come from /proc (Linux)")


@linux_proc
def test_proc_memory_mb_reads_this_process_and_gives_none_for_a_missing_one():
    mine = proc_memory_mb(os.getpid())
    assert mine["VmRSS"] > 10 and mine["VmHWM"] >= mine["VmRSS"], mine
    assert proc_memory_mb(2**22 + 12345) == {"VmRSS": None, "VmHWM": None}  # above any pid_max


@linux_proc
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_weft_bench_processes_reports_the_peak_rss_of_each_process(postgres_only, subprocess_env):  # noqa: F811
    figures, _ = run_bench_command("--workflows", "20", "--steps", "3", "--processes", "1",
                                   "--interval", "0.2", "--probe-seconds", "0.2", "--timeout", "60")
    assert figures["raw_commits_per_second"] > 0
    peak = figures["peak_rss_mb"]
    assert len(peak) == 1 and 10 < peak[0] < 4096, figures
    assert figures["peak_rss_max_mb"] == max(peak)
    ready = figures["rss_ready_mb"]
    assert len(ready) == 1 and 10 < ready[0] <= peak[0], figures
    assert figures["rss_samples"] >= 2
    at = figures["rss_at_completions"]
    assert [(entry["completed"], entry["fraction"]) for entry in at] == [(2, 0.1), (20, 1.0)], at
    for entry in at:
        assert 10 < entry["rss_mb"][0] <= entry["peak_rss_mb"][0] <= peak[0], entry
        assert entry["sampled_after_ms"] >= 0 and entry["at_seconds"] >= 0, entry
    assert at[0]["at_seconds"] <= at[1]["at_seconds"]
    assert Workflow.objects.count() == 0 and not Executor.objects.exists()


@linux_proc
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_weft_bench_processes_reports_a_peak_for_every_process(postgres_only, subprocess_env):  # noqa: F811
    figures, _ = run_bench_command("--workflows", "6", "--steps", "1", "--processes", "2", "--prestart",
                                   "--interval", "0.2", "--probe-seconds", "0.2", "--timeout", "60")
    assert len(figures["peak_rss_mb"]) == 2 and all(10 < mb < 4096 for mb in figures["peak_rss_mb"]), figures
    assert figures["peak_rss_max_mb"] == max(figures["peak_rss_mb"])
    assert all(len(entry["rss_mb"]) == 2 for entry in figures["rss_at_completions"])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_weft_bench_latency_times_three_step_runs_from_start_to_completion(postgres_only, subprocess_env):  # noqa: F811
    figures, progress = run_bench_command("--latency", "5", "--interval", "0.5")
    assert connection.vendor == "postgresql" and figures["notify_applies"] is True
    for key in ("notify_on", "notify_off"):
        f = figures[key]
        # The signal-to-resume figures are still there.
        assert f["samples"] == 5 and 0 < f["p50_ms"] <= f["p95_ms"] <= f["max_ms"], f
        s = f["start_to_completion"]
        assert s["steps"] == 3 and s["samples"] == 5, s
        assert 0 < s["min_ms"] <= s["p50_ms"] <= s["p95_ms"] <= s["max_ms"] < 5000, s
        row = s["row"]
        assert row["samples"] == 5 and 0 < row["min_ms"] <= row["p50_ms"] <= row["p95_ms"] <= row["max_ms"], row
        # The engine's own timestamps lie inside the span the bench timed around them.
        assert row["max_ms"] <= s["max_ms"], s
    # With NOTIFY the start wakes the loop; without it the loop waits for its poll (every 0.5 s).
    assert figures["notify_on"]["start_to_completion"]["p50_ms"] < 400, figures["notify_on"]
    assert "starting 5 run(s) of weft.bench x 3 steps one by one" in progress
    assert Workflow.objects.count() == 0 and not Executor.objects.exists()
