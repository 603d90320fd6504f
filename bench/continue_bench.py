"""``manage.py weft_bench --continue-as-new``: the wake cost of a run that loops forever on signals.

One run of the ``weft.bench.continue_as_new`` workflow loops on ``ctx.wait_for_signal("tick")`` and calls
``ctx.continue_as_new(...)`` every ``--continue-every`` (100) signals, so its journal never holds more than
100 rows. At each of ``--milestones`` (100, 10,000, 100,000 signals consumed by the chain) a window of
``--window`` (200) signals is sent ONE AT A TIME: ``weft.signal()`` (its own transaction), then
:func:`django_weft.services.maintenance.execute_runnable` (the engine's normal path: claim, replay the journal,
consume, park; a continue-as-new ends the run and the next one is claimed and parks in the same call) until
nothing is runnable. Each signal's cost is the wall time of both; the window reports its mean (ms/signal),
p50/p95, the split between sending and executing, and the statements and committed transactions per signal
(counted on the connection).

The same window is measured for the form that never continues as new, at ``--plain-milestones`` (100 and
2,000): its journal grows with the signals consumed, which is why it is capped (and WEFT_MAX_HISTORY ends
such a run; the default allows 20,000 rows). Its wakes find its code where it parked, on this thread
(django_weft.runtime.sticky_runs), and go on from there. With ``--unkept`` two more windows at each plain
milestone time the wakes with ``WEFT_STICKY_ROWS = 0`` (each replays the whole journal this process kept when
it parked the run, django_weft.runtime.kept_journals), then with ``WEFT_EXECUTOR_CACHE_ROWS = 0`` as well (each
also reads the journal from the database).

Between milestones the runs are fast-forwarded: signals are sent in batches (one transaction per batch,
locking the run once and delivering each signal as ``weft.signal()`` does), and a parked run that finds
several buffered signals consumes them all in one execution. Nothing of that is timed. After each
window the bench checks the chain: exactly one open run, waiting, no signal left unconsumed, and the count
of signals consumed (the run's input carries the chain's count, its journal the rest) equal to the signals
sent. At the end a ``"stop"`` signal ends each loop; the handle of the first run
(``result()`` follows the chain) must return the number of signals consumed, every continued run must hold
exactly ``--continue-every`` consumed signals and the chain exactly one run per continuation plus one.

Runs execute in this thread, on the configured database, outside any transaction; the bench's runs are
deleted afterwards unless ``--keep``. Importing this module registers the ``weft.bench.continue_as_new``
workflow.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.test import override_settings

from bench.core import BenchError, SqlCounter, delete_bench_runs, load_average, measure_commit_rate, percentile
from django_weft.common import clock
from django_weft.common.registry import workflow
from django_weft.conf import weft_settings
from django_weft.store import inbox

CONTINUE_WORKFLOW = "weft.bench.continue_as_new"
TICK = "tick"
STOP = "stop"
DEFAULT_EVERY = 100
DEFAULT_MILESTONES = (100, 10_000, 100_000)
DEFAULT_PLAIN_MILESTONES = (100, 2_000)
DEFAULT_WINDOW = 200
# Signals per fast-forward transaction (at least one run's worth for the continuing form).
MIN_BATCH = 100
PLAIN_BATCH = 1000
# What an execution of the loop may end as (anything else fails the bench).
EXPECTED_OUTCOMES = {"waiting", "continued"}


@workflow(name=CONTINUE_WORKFLOW)
def signal_loop(ctx: Any, state: dict) -> int:
    """``state``: ``count`` (signals the chain consumed before this run), ``every`` (continue as new after this
    many; 0: never). Returns the chain's count when a ``"stop"`` payload arrives."""
    count, every = state["count"], state["every"]
    consumed = 0
    while True:
        if ctx.wait_for_signal(TICK) == STOP:
            return count
        count += 1
        consumed += 1
        if every and consumed == every:
            ctx.continue_as_new({"count": count, "every": every})


def parse_milestones(text: str, option: str) -> list[int]:
    """``"100,10000,100000"`` as a list of increasing signal counts; ``"none"`` (or nothing) as []."""
    text = str(text).strip()
    if text.lower() in ("", "none"):
        return []
    milestones: list[int] = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        if not part.isdigit() or int(part) < 1 or (milestones and int(part) <= milestones[-1]):
            raise ValueError(f"{option} takes increasing signal counts of at least 1, separated by commas "
                             f"(e.g. 100,10000,100000), or none; got {text!r}")
        milestones.append(int(part))
    return milestones


def check_spacing(milestones: list[int], window: int, option: str) -> None:
    """Each window starts at its milestone: the next milestone must not fall inside it."""
    for earlier, later in itertools.pairwise(milestones):
        if later < earlier + window:
            raise ValueError(f"{option}: {later} falls inside the window of {window} signal(s) measured from "
                             f"{earlier}; space milestones at least --window apart")


class _Loop:
    """One chain of the loop workflow, driven in this thread: its signals sent, its runs executed, checked."""

    def __init__(self, form: str, every: int) -> None:
        self.form = form
        self.every = every
        self.workflow_id = f"weft-bench-{form}-{uuid.uuid4().hex[:12]}"
        self.consumed = 0
        self.handle: Any = None
        self.outcomes: Counter = Counter()

    def start(self) -> None:
        from django_weft.services import client

        self.handle = client.start(signal_loop, {"count": 0, "every": self.every}, workflow_id=self.workflow_id)
        self.drain()
        self.check()

    def drain(self) -> Counter:
        """Execute every runnable run until none is left; the outcomes of this call."""
        from django_weft.services.maintenance import MaintenanceReport, default_owner, execute_runnable

        report = MaintenanceReport()
        execute_runnable(None, report, default_owner())
        self.outcomes.update(report.outcomes)
        unexpected = {k: n for k, n in report.outcomes.items() if k not in EXPECTED_OUTCOMES and n}
        if unexpected:
            raise BenchError(f"{self.workflow_id}: executions ended {dict(report.outcomes)} "
                             f"({self.describe()})")
        return report.outcomes

    def fast_forward(self, signals: int, batch: int) -> None:
        """Send ``signals`` in transactions of ``batch``, executing the run after each.

        Each transaction locks the open run once and stores its signals with the engine's own delivery
        (:func:`django_weft.store.inbox.deliver_signal`, what ``weft.signal()`` calls once it holds the lock),
        so a batch costs two statements a signal instead of a savepoint and a lock each."""
        from django_weft.common.codec import encode
        from django_weft.models import Workflow

        payload = encode(None)
        while signals > 0:
            count = min(signals, batch)
            with transaction.atomic():
                run = Workflow.objects.open().select_for_update().get(workflow_id=self.workflow_id)
                now = clock.now()
                for _ in range(count):
                    inbox.deliver_signal(run, TICK, payload, None, now)
            self.drain()
            self.consumed += count
            signals -= count

    def window(self, signals: int, using: str) -> dict[str, Any]:
        """Send ``signals`` one at a time, each followed by the executions it causes; the figures."""
        from django_weft.services import client

        connection = connections[using]
        sends: list[float] = []
        executes: list[float] = []
        outcomes: Counter = Counter()
        before = self.consumed
        with SqlCounter(using) as counter, connection.execute_wrapper(counter):
            counter.active = True
            for _ in range(signals):
                began = time.perf_counter()
                client.signal(self.workflow_id, TICK)
                sent = time.perf_counter()
                outcomes.update(self.drain())
                ended = time.perf_counter()
                sends.append(sent - began)
                executes.append(ended - sent)
            counter.active = False
        self.consumed += signals
        continues = self.consumed // self.every - before // self.every if self.every else 0
        if outcomes["waiting"] != signals or outcomes["continued"] != continues:
            raise BenchError(f"{self.workflow_id}: {signals} signal(s) sent one at a time caused {dict(outcomes)}, "
                             f"not {signals} park(s) and {continues} continuation(s)")
        walls = [s + e for s, e in zip(sends, executes, strict=True)]
        counts = counter.counts

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 3)

        return {
            "ms_per_signal": ms(sum(walls) / signals),
            "p50_ms": ms(percentile(walls, 50)),
            "p95_ms": ms(percentile(walls, 95)),
            "max_ms": ms(max(walls)),
            "send_ms": ms(statistics.fmean(sends)),
            "execute_ms": ms(statistics.fmean(executes)),
            "queries_per_signal": round(counts["queries"] / signals, 2),
            "transactions_per_signal": round(counts["commits"] / signals, 2),
            "write_commits_per_signal": round(counts["write_commits"] / signals, 2),
            "continued": continues,
        }

    def describe(self) -> str:
        from django_weft.models import Workflow

        rows = Workflow.objects.filter(workflow_id=self.workflow_id).order_by("-created_at")
        latest = rows.values("run_id", "status", "error", "wait_reason").first()
        return f"{rows.count()} run(s); the latest: {latest}"

    def check(self) -> int:
        """The chain is parked on its next signal with every signal sent consumed; its open run's journal rows."""
        from django_weft.common.codec import decode
        from django_weft.models import RunStatus, Signal, StepKind, StepStatus, Workflow, WorkflowStep

        open_runs = list(Workflow.objects.open().filter(workflow_id=self.workflow_id))
        if len(open_runs) != 1 or open_runs[0].status != RunStatus.WAITING:
            raise BenchError(f"{self.workflow_id}: expected one run waiting for its next signal, found "
                             f"{[(r.pk, r.status) for r in open_runs]} ({self.describe()})")
        run = open_runs[0]
        unconsumed = Signal.objects.filter(run__workflow_id=self.workflow_id, consumed_at__isnull=True).count()
        journal = WorkflowStep.objects.filter(run=run)
        consumed = decode(run.input)["count"] + journal.filter(kind=StepKind.SIGNAL,
                                                               status=StepStatus.COMPLETED).count()
        if unconsumed or consumed != self.consumed:
            raise BenchError(f"{self.workflow_id}: {self.consumed} signal(s) sent, the chain counts {consumed} "
                             f"consumed and {unconsumed} still buffered")
        return journal.count()

    def finish(self) -> dict[str, Any]:
        """Stop the loop and check the whole chain."""
        from django_weft.models import RunStatus, Signal, StepKind, StepStatus, Workflow, WorkflowStep
        from django_weft.services import client

        client.signal(self.workflow_id, TICK, STOP)
        self.outcomes.update(self.drain_finishing())
        try:
            result = self.handle.result(timeout=5)
        except Exception as exc:  # the chain ended otherwise than completed
            raise BenchError(f"{self.workflow_id}: the chain's result: {type(exc).__name__}: {exc}") from None
        if result != self.consumed:
            raise BenchError(f"{self.workflow_id}: the chain's result is {result!r}, not the {self.consumed} "
                             "signal(s) sent")
        statuses = Counter(Workflow.objects.filter(workflow_id=self.workflow_id).values_list("status", flat=True))
        continued = self.consumed // self.every if self.every else 0
        if statuses != Counter({RunStatus.COMPLETED: 1, **({RunStatus.CONTINUED: continued} if continued else {})}):
            raise BenchError(f"{self.workflow_id}: the chain's runs are {dict(statuses)}, expected {continued} "
                             "continued and one completed")
        per_run = Counter(WorkflowStep.objects.filter(run__workflow_id=self.workflow_id, kind=StepKind.SIGNAL,
                                                      status=StepStatus.COMPLETED).values_list("run__status",
                                                                                              flat=True))
        # Every continued run consumed `every` signals; the completed one the rest and the stop.
        expected = Counter({RunStatus.COMPLETED: self.consumed - continued * self.every + 1,
                            **({RunStatus.CONTINUED: continued * self.every} if continued else {})})
        if per_run != expected:
            raise BenchError(f"{self.workflow_id}: signals consumed per run status {dict(per_run)}, expected "
                             f"{dict(expected)}")
        signals = Signal.objects.filter(run__workflow_id=self.workflow_id)
        if signals.count() != self.consumed + 1 or signals.filter(consumed_at__isnull=True).exists():
            raise BenchError(f"{self.workflow_id}: {signals.count()} signal row(s), "
                             f"{signals.filter(consumed_at__isnull=True).count()} unconsumed; expected "
                             f"{self.consumed + 1}, all consumed")
        return {"workflow_id": self.workflow_id, "signals": self.consumed, "runs": sum(statuses.values())}

    def drain_finishing(self) -> Counter:
        from django_weft.services.maintenance import MaintenanceReport, default_owner, execute_runnable

        report = MaintenanceReport()
        execute_runnable(None, report, default_owner())
        if report.outcomes.get("completed") != 1:
            raise BenchError(f"{self.workflow_id}: the stop signal's execution ended {dict(report.outcomes)}")
        return report.outcomes


def _measure(loop: _Loop, milestones: list[int], window: int, batch: int, using: str,
             progress: Callable[[str], None], *, compare_unkept: bool = False) -> list[dict[str, Any]]:
    rows = []
    for milestone in milestones:
        signals = milestone - loop.consumed
        began = time.perf_counter()
        loop.fast_forward(signals, batch)
        fast = time.perf_counter() - began
        journal = loop.check()
        progress(f"{loop.form}: {milestone} signal(s) consumed (fast-forward of {signals} in {fast:.1f}s, "
                 f"journal {journal} row(s)); measuring {window} signal(s) one at a time")
        row = {"signals": milestone, "journal_rows": journal, **loop.window(window, using),
               "fast_forward_signals": signals, "fast_forward_seconds": round(fast, 3), "loadavg": load_average()}
        loop.check()
        if compare_unkept:
            # The same window again with the code not kept where it parked (each wake replays the journal its
            # executor kept), then with nothing kept (each also reads the journal from the database).
            with override_settings(WEFT_STICKY_ROWS=0):
                replayed = loop.window(window, using)
            loop.check()
            with override_settings(WEFT_STICKY_ROWS=0, WEFT_EXECUTOR_CACHE_ROWS=0):
                unkept = loop.window(window, using)
            loop.check()
            row["replayed_ms_per_signal"], row["replayed_p50_ms"] = replayed["ms_per_signal"], replayed["p50_ms"]
            row["unkept_ms_per_signal"], row["unkept_p50_ms"] = unkept["ms_per_signal"], unkept["p50_ms"]
        rows.append(row)
        progress(f"{loop.form}: {row['ms_per_signal']:.2f} ms/signal at {milestone}")
    return rows


def _growth(rows: list[dict[str, Any]]) -> float | None:
    if len(rows) < 2 or not rows[0]["ms_per_signal"]:
        return None
    return round(rows[-1]["ms_per_signal"] / rows[0]["ms_per_signal"], 2)


def run_continue_bench(*, milestones: list[int], plain_milestones: list[int], window: int = DEFAULT_WINDOW,
                       every: int = DEFAULT_EVERY, keep: bool = False, unkept: bool = False, probe_seconds: float = 2.0,
                       progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the benchmark and return its figures. Raises :class:`BenchError` if an execution ends otherwise
    than parked or continued, or the chain loses, repeats or keeps a signal."""
    from django_weft.models import Workflow

    using = router.db_for_write(Workflow)
    if connections[using].in_atomic_block:
        raise BenchError("called inside a transaction: nothing would commit, so nothing would be measured as "
                         "it runs in production")
    limit = int(weft_settings.MAX_HISTORY)
    if every + 1 > limit:
        raise BenchError(f"--continue-every {every}: a run would reach WEFT_MAX_HISTORY ({limit}) first")
    if plain_milestones and plain_milestones[-1] + (3 if unkept else 1) * window + 1 > limit:
        raise BenchError(f"--plain-milestones {plain_milestones[-1]} + --window {window}: the run that never "
                         f"continues as new would reach WEFT_MAX_HISTORY ({limit}) and time out")
    open_before = Workflow.objects.open().count()
    if open_before:
        progress(f"note: {open_before} open run(s) already in the database; the bench executes any that are "
                 "runnable too")
    load_before = load_average()
    raw_rate, probe_commits = measure_commit_rate(probe_seconds, using)
    progress(f"raw commit rate {raw_rate:.0f}/s")
    since = clock.now()
    began = time.perf_counter()
    loops: list[_Loop] = []
    try:
        continuing = _Loop("continuing", every)
        loops.append(continuing)
        continuing.start()
        rows = _measure(continuing, milestones, window, max(every, MIN_BATCH), using, progress)
        chains = [continuing.finish()]
        plain_rows: list[dict[str, Any]] = []
        if plain_milestones:
            plain = _Loop("plain", 0)
            loops.append(plain)
            plain.start()
            plain_rows = _measure(plain, plain_milestones, window, PLAIN_BATCH, using, progress, compare_unkept=unkept)
            chains.append(plain.finish())
    finally:
        if not keep:
            progress("deleting the bench's runs")
            ids = list(Workflow.objects.filter(workflow_id__in=[loop.workflow_id for loop in loops])
                       .values_list("pk", flat=True))
            delete_bench_runs(ids, CONTINUE_WORKFLOW, since)
    return {
        "mode": "continue_as_new",
        "vendor": connections[using].vendor,
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg": load_average(),
        "debug": bool(settings.DEBUG),
        "raw_commits_per_second": round(raw_rate, 1),
        "probe_commits": probe_commits,
        "window": window,
        "continue_every": every,
        "unkept": unkept,
        "max_history": limit,
        "continuing": rows,
        "plain": plain_rows,
        "continuing_growth": _growth(rows),
        "plain_growth": _growth(plain_rows),
        "chains": chains,
        "runs": sum(chain["runs"] for chain in chains),
        "signals": sum(chain["signals"] + 1 for chain in chains),
        "total_seconds": round(time.perf_counter() - began, 1),
    }


def format_table(figures: dict[str, Any]) -> list[str]:
    """The figures as the lines the command prints (before the JSON line)."""
    f = figures
    head = (f"{'signals':>9} {'journal':>8} {'ms/signal':>10} {'p50 ms':>8} {'p95 ms':>8} {'send ms':>8} "
            f"{'exec ms':>8} {'queries':>8} {'txns':>6} {'writes':>7} {'continued':>10}")

    def lines_of(rows: list[dict[str, Any]]) -> list[str]:
        return [f"{r['signals']:>9,} {r['journal_rows']:>8} {r['ms_per_signal']:>10.3f} {r['p50_ms']:>8.3f} "
                f"{r['p95_ms']:>8.3f} {r['send_ms']:>8.3f} {r['execute_ms']:>8.3f} {r['queries_per_signal']:>8.2f} "
                f"{r['transactions_per_signal']:>6.2f} {r['write_commits_per_signal']:>7.2f} {r['continued']:>10}"
                for r in rows]

    lines = [
        f"weft_bench --continue-as-new: {f['vendor']}, {f['cpus']} cpu(s), load {f['loadavg_before']} at the start, "
        f"{f['loadavg']} at the end; raw commits {f['raw_commits_per_second']:,.0f}/s; a run looping on "
        f"ctx.wait_for_signal({TICK!r}); at each milestone (signals consumed) {f['window']} signals are sent one "
        "at a time, each followed by execute_runnable() until the run parks again",
        "ms/signal: mean wall time of weft.signal() + the executions (send ms + exec ms); per signal: queries, "
        "transactions committed (txns), of which wrote (writes); journal: the open run's rows at the milestone",
        "",
        f"with ctx.continue_as_new() every {f['continue_every']} signals",
        head,
        *lines_of(f["continuing"]),
    ]
    if f["plain"]:
        lines += [
            "",
            f"never continuing as new: capped at {f['plain'][-1]['signals']:,} signals, because its journal grows "
            f"with each (WEFT_MAX_HISTORY={f['max_history']} times the run out) and a wake that replays it costs more "
            "each time; its code stays parked between these wakes"
            + ("; replayed: as many signals more with WEFT_STICKY_ROWS = 0 (each wake replays the journal its "
               "executor kept); unkept: as many again with WEFT_EXECUTOR_CACHE_ROWS = 0 too (each also reads the "
               "journal from the database)" if f["unkept"] else ""),
            head + (f" {'replayed ms/signal':>19} {'replayed p50':>13} {'unkept ms/signal':>17} {'unkept p50':>11}"
                    if f["unkept"] else ""),
            *[line + (f" {r['replayed_ms_per_signal']:>19.3f} {r['replayed_p50_ms']:>13.3f}"
                      f" {r['unkept_ms_per_signal']:>17.3f} {r['unkept_p50_ms']:>11.3f}" if f["unkept"] else "")
              for line, r in zip(lines_of(f["plain"]), f["plain"], strict=True)],
        ]
    growth = [f"with continue_as_new {f['continuing_growth']}x" if f["continuing_growth"] is not None else "",
              f"never continuing {f['plain_growth']}x" if f["plain_growth"] is not None else ""]
    if any(growth):
        lines += ["", "ms/signal at the last milestone / at the first: " + ", ".join(g for g in growth if g)]
    return lines
