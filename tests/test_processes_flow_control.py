"""Flow control under real concurrency (PostgreSQL and MariaDB): three weft_maintenance processes, SIGKILLed and
replaced while they work, admit and execute runs of a queue, and its limits hold the whole time; a rate limit
holds over every one-second window; ``--queues`` keeps an executor to its queues.

Like the other process tests, it commits its data (``transaction=True``) so that the subprocesses see it; every
wait has a deadline; every subprocess is killed when the test ends.
"""

from __future__ import annotations

import bisect
import signal
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Count

import django_weft as weft
from django_weft.models import ActivitySlot, RunStatus, StepKind, Workflow, WorkflowStep
from tests.procs import SHORT_LEASE, outputs, wait_until
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 1000
KEYS = 20
CONCURRENCY, PER_KEY = 5, 1  # the "tenants" queue of tests/settings.py
DEADLINE = 300.0


class Sampler(threading.Thread):
    """Reads the queue's admitted runs per key, in one statement (one snapshot), as often as it can."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.stop = threading.Event()
        self.samples = 0
        self.max_total = 0
        self.max_per_key = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                counts = dict(Workflow.objects.filter(queue=self.queue, status__in=RunStatus.admitted_values())
                              .values("concurrency_key").annotate(n=Count("pk")).values_list("concurrency_key", "n")
                              .order_by())
                self.samples += 1
                self.max_total = max(self.max_total, sum(counts.values()))
                self.max_per_key = max(self.max_per_key, max(counts.values(), default=0))
                time.sleep(0.005)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            connection.close()


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one moment (an end before a begin at the same instant)."""
    events = sorted([(begin, 1) for begin, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def executed_intervals() -> dict[str, list[tuple[float, float]]]:
    """Per key, the (begin, end) of every execution of the work that finished (one killed mid-way has no end)."""
    begins: dict[str, list[float]] = defaultdict(list)
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, at in Execution.objects.filter(key__startswith="begin:").values_list("key", "created_at"):
        begins[key.removeprefix("begin:")].append(at.timestamp())
    for key, at in Execution.objects.filter(key__startswith="end:").values_list("key", "created_at"):
        label = key.removeprefix("end:")
        end = at.timestamp()
        begin = max(b for b in begins[label] if b <= end)
        intervals[label.split("/")[0]].append((begin, end))
    return intervals


def test_three_killed_and_replaced_executors_never_admit_more_than_the_limits(row_locks, maintenance):
    procs = [maintenance(f"executor{i}", "--workers", "3", "--interval", "0.2", **SHORT_LEASE) for i in range(3)]
    sampler = Sampler("tenants")
    sampler.start()
    handles = [weft.start("flowctl.job", {"label": f"k{i % KEYS}/{i}", "seconds": 0.005}, queue="tenants",
                          concurrency_key=f"k{i % KEYS}") for i in range(RUNS)]
    ids = [h.run_id for h in handles]

    def completed() -> int:
        return Workflow.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count()

    try:
        for round_, threshold in enumerate((RUNS // 4, RUNS // 2, 3 * RUNS // 4)):
            wait_until(lambda t=threshold: completed() >= t, f"{threshold} runs to complete", DEADLINE, procs)
            victim = procs[round_ % 3]
            victim.popen.send_signal(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
            procs[round_ % 3] = maintenance(f"replacement{round_}", "--workers", "3", "--interval", "0.2",
                                            **SHORT_LEASE)
        wait_until(lambda: completed() == RUNS, "every run to complete", DEADLINE, procs)
    finally:
        sampler.stop.set()
        sampler.join(10)
    assert not sampler.errors, sampler.errors
    assert sampler.samples > 100, f"only {sampler.samples} samples"
    print(f"\n{sampler.samples} samples of the admitted set: at most {sampler.max_total} admitted, "
          f"{sampler.max_per_key} per key")
    assert sampler.max_total <= CONCURRENCY and sampler.max_per_key <= PER_KEY
    assert sampler.max_total == CONCURRENCY, "the queue was used to its limit"

    # What ran says the same: executions of the work that finished never overlapped beyond the limits.
    intervals = executed_intervals()
    assert max(most_at_once(spans) for spans in intervals.values()) <= PER_KEY
    assert most_at_once([span for spans in intervals.values() for span in spans]) <= CONCURRENCY
    # Every run done once: one run per start, each admitted once, one completed work step each.
    assert Workflow.objects.filter(workflow_type="flowctl.job").count() == RUNS
    assert not Workflow.objects.filter(pk__in=ids, admitted_at__isnull=True).exists()
    steps = Counter(WorkflowStep.objects.filter(run_id__in=ids, kind=StepKind.ACTIVITY, status="completed")
                    .values_list("run_id", flat=True))
    assert len(steps) == RUNS and set(steps.values()) == {1}
    assert sum(1 for spans in intervals.values() for _ in spans) >= RUNS
    assert "Traceback" not in outputs(procs).replace("SIGKILL", ""), outputs(procs)


def test_a_rate_limit_of_50_per_second_holds_over_every_window(row_locks, maintenance):
    procs = [maintenance(f"executor{i}", "--workers", "2", "--interval", "0.1") for i in range(3)]
    count = 2000
    # All of them queued first (their type paused), so that the limit, not the pace of the starts, sets the pace.
    weft.pause_type("flowctl.job")
    handles = [weft.start("flowctl.job", {"label": f"r{i}"}, queue="limited") for i in range(count)]
    ids = [h.run_id for h in handles]
    weft.resume_type("flowctl.job")
    wait_until(lambda: not Workflow.objects.filter(pk__in=ids, admitted_at__isnull=True).exists(),
               "every run to be admitted", DEADLINE, procs)
    moments = sorted(t.timestamp() for t in Workflow.objects.filter(pk__in=ids).values_list("admitted_at", flat=True))
    # The most admissions in any one-second window: windows that begin at an admission are the ones to check.
    worst = max(bisect.bisect_left(moments, start + 1.0) - i for i, start in enumerate(moments))
    spread = moments[-1] - moments[0]
    print(f"\n{count} admissions over {spread:.1f}s; the worst 1-second window holds {worst}")
    assert worst <= 50
    assert spread >= (count - 50) / 50 - 1, "never faster than the limit"
    assert spread <= (count / 50) * 1.5, "and close to the limit: the windows are reused as they reopen"
    wait_until(lambda: Workflow.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == count,
               "every run to complete", DEADLINE, procs)


def test_an_executor_serves_only_its_queues(row_locks, maintenance):
    emails_only = maintenance("emails-only", "--queues", "emails", "--interval", "0.1")
    wait_until(lambda: "running with" in emails_only.stdout(), "the executor to start", 30, [emails_only])
    assert "for queues emails" in emails_only.stdout()
    mail = weft.start("flowctl.job", {"label": "mail"}, queue="emails")
    other = weft.start("flowctl.job", {"label": "other"}, queue="open")
    plain = weft.start("flowctl.job", {"label": "plain"})
    wait_until(lambda: mail.status == RunStatus.COMPLETED, "the emails run to complete", 30, [emails_only])
    time.sleep(1.5)
    assert (other.status, plain.status) == (RunStatus.PENDING, RunStatus.PENDING), "admitted, but not its queue"
    everything = maintenance("everything", "--interval", "0.1")
    wait_until(lambda: other.status == plain.status == RunStatus.COMPLETED, "the others to complete", 30,
               [emails_only, everything])
    started = Execution.objects.filter(key__startswith="begin:")
    assert {key: pid for key, pid in started.values_list("key", "pid")} == {
        "begin:mail": emails_only.pid, "begin:other": everything.pid, "begin:plain": everything.pid}


def test_a_paused_type_waits_across_processes_and_resumes(row_locks, maintenance):
    proc = maintenance("executor", "--interval", "0.1")
    weft.pause_type("flowctl.job")
    held = [weft.start("flowctl.job", {"label": f"held{i}"}, queue="emails") for i in range(3)]
    time.sleep(1.5)
    assert {h.status for h in held} == {RunStatus.QUEUED}
    weft.resume_type("flowctl.job")
    wait_until(lambda: all(h.status == RunStatus.COMPLETED for h in held), "the held runs to complete", 30, [proc])
    assert Workflow.objects.filter(admitted_at__isnull=False).count() == 3
    assert timedelta(0) <= max(h.refresh().admitted_at for h in held) - min(h.refresh().created_at for h in held)


def test_a_limited_activity_never_runs_more_attempts_than_its_concurrency_across_killed_executors(
        row_locks, maintenance):
    """flowctl.provider takes two attempts at once, in every process: sequential calls and gathers of 16 runs
    in three executors (4 threads each), one SIGKILLed and replaced while they work."""
    procs = [maintenance(f"executor{i}", "--workers", "4", "--interval", "0.2", **SHORT_LEASE) for i in range(3)]
    handles = [weft.start("flowctl.calls", {"prefix": f"c{i}-", "count": 3, "seconds": 0.1}) for i in range(8)]
    handles += [weft.start("flowctl.fan_out", {"prefix": f"g{i}-", "count": 4, "seconds": 0.1}) for i in range(8)]
    ids = [h.run_id for h in handles]
    total = 8 * 3 + 8 * 4
    wait_until(lambda: Execution.objects.filter(key__startswith="end:").count() >= total // 3,
               "a third of the attempts to run", DEADLINE, procs)
    procs[0].popen.send_signal(signal.SIGKILL)
    assert procs[0].wait(10) == -signal.SIGKILL
    procs[0] = maintenance("replacement", "--workers", "4", "--interval", "0.2", **SHORT_LEASE)
    wait_until(lambda: Workflow.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == len(ids),
               "every run to complete", DEADLINE, procs)
    spans = [span for per_key in executed_intervals().values() for span in per_key]
    print(f"\n{len(spans)} attempts finished; at most {most_at_once(spans)} at once")
    assert len(spans) >= total
    assert most_at_once(spans) == 2
    for handle in handles:
        assert len(handle.result()) in (3, 4)
    assert not ActivitySlot.objects.exists(), "no slot left held or waiting"


def test_a_rate_limit_of_an_activity_holds_over_the_moments_its_attempts_begin(row_locks, maintenance):
    """flowctl.rated lets 5 attempts begin a second; each returns the moment its body began. An attempt granted
    while its run was parked begins when the run resumes, hundreds of milliseconds later: the window counts the
    moment it begins, not the grant. What is left between the moment counted (under the activity's lock) and the
    body's first line is the commit and the call, milliseconds: windows of 0.9 s leave it that much."""
    procs = [maintenance(f"executor{i}", "--workers", "2", "--interval", "0.2") for i in range(3)]
    handles = [weft.start("flowctl.rated_calls", 2) for _ in range(20)]
    ids = [h.run_id for h in handles]
    wait_until(lambda: Workflow.objects.filter(pk__in=ids, status=RunStatus.COMPLETED).count() == len(ids),
               "every run to complete", DEADLINE, procs)
    moments = sorted(datetime.fromisoformat(at).timestamp() for h in handles for at in h.result())
    worst = max(bisect.bisect_left(moments, start + 0.9) - i for i, start in enumerate(moments))
    print(f"\n{len(moments)} attempts over {moments[-1] - moments[0]:.1f}s; the worst 0.9-second window holds {worst}")
    assert worst <= 5
    assert moments[-1] - moments[0] >= (len(moments) - 5) / 5 - 1, "never faster than the limit"
    assert not ActivitySlot.objects.exists(), "no slot left"
