"""weft_bench --replay-check and --continue-as-new at tiny sizes: their tables' structure, their checks and the
runs they leave with --keep (figures are never asserted)."""

from __future__ import annotations

import re
from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test.utils import override_settings

from bench import replay_bench
from bench.continue_bench import CONTINUE_WORKFLOW, check_spacing, parse_milestones
from bench.core import BENCH_ACTIVITY
from bench.replay_bench import (
    OTHER_SIGNAL,
    RENAMED_ACTIVITY,
    REPLAY_WORKFLOW,
    UNREGISTERED_VERSION,
    expected_seq,
    mismatch_of,
)
from django_weft.common.codec import decode
from django_weft.models import (
    RunStatus,
    Signal,
    StepKind,
    StepStatus,
    Workflow,
    WorkflowStep,
)
from django_weft.services import client
from django_weft.services.maintenance import run_maintenance
from django_weft.store import transitions
from tests.bench_helpers import bench
from tests.procs import executor_row

# --- --replay-check ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_replay_check_bench_reports_exactly_the_mismatched_runs_and_deletes_them():
    figures, lines = bench("--replay-check", "250", "--steps", "2")

    assert figures["mode"] == "replay_check" and figures["runs"] == 250 and figures["steps_per_run"] == 2
    assert figures["journal_rows"] == 250 * 3
    # Runs 0, 100 and 200 are mismatched, one of each kind.
    assert figures["mismatched"] == 3
    assert figures["mismatched_by_kind"] == {RENAMED_ACTIVITY: 1, OTHER_SIGNAL: 1, UNREGISTERED_VERSION: 1}
    check, command = figures["check"], figures["command"]
    assert check["runs_replayed"] == command["runs_replayed"] == 250
    assert check["failing"] == command["failing"] == 3
    # Clean runs replay both activities; the one waiting on another signal replays them too, the renamed and
    # the held ones none.
    assert check["steps_replayed"] == 247 * 2 + 2
    assert check["seconds"] > 0 and check["runs_per_second"] > 0 and command["seconds"] > 0
    assert command["summary"].startswith("250 run(s) replayed in ")
    assert "recorded activity 'weft.bench.step.before_rename'" in figures["sample_problem"]
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists()

    assert lines[0].startswith("weft_bench --replay-check: ") and "250 open run(s)" in lines[0]
    assert lines[1] == "seeded mismatched: 3 (1 renamed activity, 1 other signal, 1 unregistered version)"
    assert re.match(r"^check_runs\(\)\s+250\s+496\s+3\s+[\d.]+\s+\d+$", lines[3]), lines
    assert re.match(r"^manage\.py weft_replay_check\s+250\s+3\s+[\d.]+\s+\d+$", lines[4]), lines


@pytest.mark.django_db(transaction=True)
def test_replay_check_bench_seeds_runs_the_engine_executes_like_its_own_with_keep():
    figures, _ = bench("--replay-check", "101", "--steps", "3", "--keep")
    assert figures["mismatched"] == 2 and figures["check"]["failing"] == 2

    runs = Workflow.objects.filter(workflow_type=REPLAY_WORKFLOW)
    assert runs.count() == 101 and set(runs.values_list("status", flat=True)) == {RunStatus.WAITING}
    assert WorkflowStep.objects.filter(run__workflow_type=REPLAY_WORKFLOW).count() == 101 * 4
    # The operator's command sees the same: two would fail (it exits 1).
    out = StringIO()
    with pytest.raises(CommandError, match=r"^101 run\(s\) replayed in [\d.]+s; 2 would fail"):
        call_command("weft_replay_check", "--type", REPLAY_WORKFLOW, stdout=out)
    assert len(out.getvalue().strip().splitlines()) == 2

    # A matching run, signalled, completes from its seeded journal (the activities are not run again);
    # the renamed one fails on its first step, as the check said it would.
    prefix = runs.values_list("workflow_id", flat=True).first().rsplit("-", 1)[0]
    clean, renamed = f"{prefix}-1", f"{prefix}-0"
    assert mismatch_of(1) is None and mismatch_of(0) == RENAMED_ACTIVITY
    client.signal(clean, "go")
    client.signal(renamed, "go")
    run_maintenance()
    done = Workflow.objects.get(workflow_id=clean)
    assert done.status == RunStatus.COMPLETED and decode(done.result) == 0 + 1 + 2
    assert WorkflowStep.objects.filter(run=done, kind=StepKind.ACTIVITY).count() == 3
    failed = Workflow.objects.get(workflow_id=renamed)
    assert failed.status == RunStatus.FAILED and failed.error["type"].endswith("NonDeterminismError")


@pytest.mark.django_db(transaction=True)
def test_replay_check_bench_fails_loudly_when_the_check_misses_a_mismatch(monkeypatch):
    # The "renamed" runs are seeded with the name the code asks for: nothing to report for them.
    monkeypatch.setattr(replay_bench, "RENAMED_ACTIVITY_NAME", BENCH_ACTIVITY)
    with pytest.raises(CommandError, match=r"reported 2 run\(s\) failing, not the 3 seeded mismatched: 0 matching "
                                           r"run\(s\) reported .*1 mismatched run\(s\) not reported"):
        bench("--replay-check", "201", "--steps", "1")
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists()


@pytest.mark.django_db
def test_replay_check_bench_refuses_to_run_inside_a_transaction():
    with pytest.raises(CommandError, match="inside a transaction"):
        bench("--replay-check", "2")
    assert not Workflow.objects.exists()


def test_mismatches_take_turns_one_run_in_a_hundred():
    kinds = [mismatch_of(i) for i in range(600)]
    assert [i for i, kind in enumerate(kinds) if kind] == [0, 100, 200, 300, 400, 500]
    assert [kind for kind in kinds if kind] == [RENAMED_ACTIVITY, OTHER_SIGNAL, UNREGISTERED_VERSION] * 2
    assert [expected_seq(kind, 3) for kind in (RENAMED_ACTIVITY, OTHER_SIGNAL, UNREGISTERED_VERSION)] == [1, 4, None]


# --- --continue-as-new -------------------------------------------------------------------------------------


ROW = re.compile(r"^\s*[\d,]+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+$")
TINY = ["--continue-as-new", "--milestones", "3,10", "--plain-milestones", "2,5", "--window", "2",
        "--continue-every", "4", "--probe-seconds", "0.2"]


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_bench_measures_each_milestone_for_both_forms_and_deletes_its_runs():
    figures, lines = bench(*TINY)

    assert figures["mode"] == "continue_as_new"
    assert (figures["window"], figures["continue_every"]) == (2, 4)
    assert figures["raw_commits_per_second"] > 0 and figures["probe_commits"] > 0
    continuing, plain = figures["continuing"], figures["plain"]
    assert [row["signals"] for row in continuing] == [3, 10] and [row["signals"] for row in plain] == [2, 5]
    # Journal rows of the open run at each milestone: its consumed signals and the wait for the next one. The
    # continuing run has consumed 3 (of 4) at 3, and 10 - 2 x 4 at 10.
    assert [row["journal_rows"] for row in continuing] == [4, 3]
    assert [row["journal_rows"] for row in plain] == [3, 6]
    # The windows 3..5 and 10..12 each cross one multiple of 4.
    assert [row["continued"] for row in continuing] == [1, 1] and [row["continued"] for row in plain] == [0, 0]
    assert [row["fast_forward_signals"] for row in continuing] == [3, 5]
    assert [row["fast_forward_signals"] for row in plain] == [2, 1]
    for row in continuing + plain:
        for key in ("ms_per_signal", "p50_ms", "p95_ms", "send_ms", "execute_ms", "queries_per_signal",
                    "transactions_per_signal", "write_commits_per_signal"):
            assert row[key] > 0, (key, row)
        assert row["write_commits_per_signal"] <= row["transactions_per_signal"] <= row["queries_per_signal"]
    # 12 signals and the stop: runs of 4, 4, 4 and the last one; 7 and the stop in one run.
    assert [(c["signals"], c["runs"]) for c in figures["chains"]] == [(12, 4), (7, 1)]
    assert figures["runs"] == 5 and figures["signals"] == 13 + 8
    assert figures["continuing_growth"] is not None and figures["plain_growth"] is not None
    assert not Workflow.objects.exists() and not Signal.objects.exists() and not WorkflowStep.objects.exists()

    assert lines[0].startswith("weft_bench --continue-as-new: ")
    assert "with ctx.continue_as_new() every 4 signals" in lines
    assert any(line.startswith("never continuing as new: capped at 5 signals") for line in lines)
    rows = [line for line in lines if ROW.match(line)]
    assert [int(line.split()[0]) for line in rows] == [3, 10, 2, 5], lines
    assert lines[-1].startswith("ms/signal at the last milestone / at the first: with continue_as_new ")


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_bench_keeps_a_chain_whose_handle_follows_it():
    figures, lines = bench("--continue-as-new", "--milestones", "5", "--plain-milestones", "none", "--window", "3",
                           "--continue-every", "2", "--keep")
    assert figures["plain"] == [] and figures["plain_growth"] is None and figures["continuing_growth"] is None
    assert not any(line.startswith("never continuing") for line in lines)

    chain = list(Workflow.objects.filter(workflow_type=CONTINUE_WORKFLOW).order_by("created_at"))
    # 8 signals, a run every 2, and the stop in the fifth.
    assert [run.status for run in chain] == [RunStatus.CONTINUED] * 4 + [RunStatus.COMPLETED]
    assert [decode(run.input)["count"] for run in chain] == [0, 2, 4, 6, 8]
    assert [run.restarted_from_id for run in chain] == [None] + [run.pk for run in chain[:-1]]
    assert len({run.workflow_id for run in chain}) == 1
    # The first run's handle follows the chain to its result.
    assert client.get_handle(chain[0].workflow_id, chain[0].run_id).result(timeout=1) == 8
    consumed = Counter(WorkflowStep.objects.filter(run__in=chain, kind=StepKind.SIGNAL, status=StepStatus.COMPLETED)
                       .values_list("run_id", flat=True))
    assert [consumed[run.pk] for run in chain] == [2, 2, 2, 2, 1]
    assert not Signal.objects.filter(consumed_at__isnull=True).exists() and Signal.objects.count() == 9


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_bench_fails_loudly_on_a_continuation_that_drops_buffered_signals(monkeypatch):
    original = transitions.continue_as_new

    def dropping(claim, now, following):  # an engine that forgets the signals it should move
        original(claim, now, following)
        Signal.objects.filter(run=following, consumed_at__isnull=True).delete()

    monkeypatch.setattr(transitions, "continue_as_new", dropping)
    with pytest.raises(CommandError, match=r"weft_bench: weft-bench-continuing-\w+: 12 signal\(s\) sent, the chain "
                                           r"counts 4 consumed and 0 still buffered"):
        bench("--continue-as-new", "--milestones", "12", "--plain-milestones", "none", "--window", "1",
              "--continue-every", "4")
    assert not Workflow.objects.exists() and not Signal.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("args, message", [
    (["--plain-milestones", "8", "--continue-every", "4"],
     r"--plain-milestones 8 \+ --window 2: .*WEFT_MAX_HISTORY \(10\)"),
    (["--plain-milestones", "none", "--continue-every", "10"],
     r"--continue-every 10: .*WEFT_MAX_HISTORY \(10\) first"),
])
def test_continue_as_new_bench_refuses_runs_past_the_history_limit(args, message):
    with override_settings(WEFT_MAX_HISTORY=10), pytest.raises(CommandError, match=message):
        bench("--continue-as-new", "--milestones", "3", "--window", "2", *args)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_bench_runs_up_to_the_history_limit():
    # 7 + 2 signals and the stop: journal rows 1..10, the last the stop's (the limit is not passed).
    with override_settings(WEFT_MAX_HISTORY=10):
        figures, _ = bench("--continue-as-new", "--milestones", "3", "--plain-milestones", "7", "--window", "2",
                           "--continue-every", "9")
    assert [(c["signals"], c["runs"]) for c in figures["chains"]] == [(5, 1), (9, 1)]
    assert [row["journal_rows"] for row in figures["plain"]] == [8]


@pytest.mark.django_db
def test_continue_as_new_bench_refuses_to_run_inside_a_transaction():
    with pytest.raises(CommandError, match="inside a transaction"):
        bench("--continue-as-new", "--milestones", "2", "--plain-milestones", "none", "--window", "1")
    assert not Workflow.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("args", [["--replay-check", "2"], ["--continue-as-new"]])
def test_evolving_benches_refuse_to_run_beside_a_live_executor(args):
    executor_row(alive=True)
    with pytest.raises(CommandError, match="refusing to run beside live executors"):
        bench(*args)
    assert not Workflow.objects.exists()


@pytest.mark.parametrize("args, message", [
    (["--replay-check", "0"], "--replay-check must be at least 1"),
    (["--replay-check", "5", "--steps", "0"], "--steps must be at least 1 with --replay-check"),
    (["--replay-check", "5", "--workflows", "3"], "--replay-check goes alone"),
    (["--replay-check", "5", "--continue-as-new"], "--replay-check goes alone"),
    (["--replay-check", "5", "--window", "3"], "--replay-check goes alone"),
    (["--continue-as-new", "--parallel", "2"], "--continue-as-new goes alone"),
    (["--continue-as-new", "--workflows", "2"], "--continue-as-new goes alone"),
    (["--continue-as-new", "--window", "0"], "--window must be at least 1"),
    (["--continue-as-new", "--continue-every", "0"], "--continue-every must be at least 1"),
    (["--continue-as-new", "--milestones", "100,50"], "--milestones takes increasing signal counts"),
    (["--continue-as-new", "--milestones", "none"], "--milestones needs at least one signal count"),
    (["--continue-as-new", "--plain-milestones", "1,x"], "--plain-milestones takes increasing signal counts"),
    (["--continue-as-new", "--milestones", "100,250"], "--milestones: 250 falls inside the window of 200"),
    (["--workflows", "2", "--milestones", "5"], "go with --continue-as-new"),
    (["--continue-every", "5"], "go with --continue-as-new"),
])
def test_evolving_benches_reject_bad_arguments(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("weft_bench", *args, stdout=StringIO(), stderr=StringIO())


def test_milestones_parse_and_space():
    assert parse_milestones("100,10000,100000", "--milestones") == [100, 10_000, 100_000]
    assert parse_milestones(" 100 , 10_000 ", "--milestones") == [100, 10_000]
    assert parse_milestones("none", "--plain-milestones") == [] == parse_milestones("", "--plain-milestones")
    for bad in ("0", "5,5", "-1", "1.5"):
        with pytest.raises(ValueError):
            parse_milestones(bad, "--milestones")
    check_spacing([100, 300], 200, "--milestones")
    with pytest.raises(ValueError, match="299 falls inside"):
        check_spacing([100, 299], 200, "--milestones")


@pytest.mark.django_db(transaction=True)
def test_continue_as_new_bench_with_unkept_times_each_plain_window_again_reading_the_journal():
    figures, lines = bench("--continue-as-new", "--milestones", "3", "--plain-milestones", "2,9", "--window", "2",
                           "--continue-every", "4", "--unkept")
    assert figures["unkept"] is True
    # Each plain milestone's window is followed by as many signals replayed and as many with nothing kept:
    # 2 + 2 + 2 + 2, then 9 + 2 + 2 + 2.
    assert [row["journal_rows"] for row in figures["plain"]] == [3, 10]
    assert [(c["signals"], c["runs"]) for c in figures["chains"]][1] == (15, 1)
    for row in figures["plain"]:
        assert row["unkept_ms_per_signal"] > 0 and row["unkept_p50_ms"] > 0
        assert row["replayed_ms_per_signal"] > 0 and row["replayed_p50_ms"] > 0
    assert any("unkept ms/signal" in line for line in lines)
    assert not Workflow.objects.exists()
