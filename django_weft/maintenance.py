"""One maintenance pass: time out runs past their deadline, apply retention, execute runnable runs.

Timers, delayed starts and expired leases need no pass of their own: each sets the run's
``runnable_at``, so the claim query that feeds executors picks them up.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from . import clock, transitions
from .conf import weft_settings
from .models import AsyncActivity, RunStatus, Signal, Timer, Workflow, WorkflowStep
from .runtime import executor
from .runtime.leases import LeaseKeeper
from .schedules import fire_due_schedules, purge_history

logger = logging.getLogger("django_weft.maintenance")

PAGE_SIZE = 500


@dataclass
class MaintenanceReport:
    """What one pass did, as counts."""

    claimed: int = 0
    started: int = 0  # pending runs that began (including delayed starts)
    woken: int = 0  # waiting runs whose timer was due
    recovered: int = 0  # runs taken over after their executor's lease expired
    outcomes: Counter = field(default_factory=Counter)  # completed / failed / waiting / released / lost ...
    timed_out: int = 0
    schedules_fired: int = 0  # runs started by schedule ticks
    purged: int = 0

    def count_claims(self, claims: list[transitions.Claim]) -> None:
        self.claimed += len(claims)
        for held in claims:
            if held.previous_status == RunStatus.PENDING:
                self.started += 1
            elif held.previous_status == RunStatus.WAITING:
                self.woken += 1
            elif held.previous_owner:
                self.recovered += 1

    def as_dict(self) -> dict[str, int]:
        data = {k: v for k, v in self.__dict__.items() if k != "outcomes"}
        data.update({f"runs_{k}": v for k, v in sorted(self.outcomes.items())})
        return data

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items() if v) or "nothing to do"


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def time_out_expired(now: datetime) -> int:
    """End open runs whose execution deadline passed (running ones lose their executor)."""
    count = 0
    while True:
        ids = list(Workflow.objects.past_deadline(now).order_by("execution_deadline")
                   .values_list("pk", flat=True)[:PAGE_SIZE])
        count += sum(transitions.time_out(run_id, now) for run_id in ids)
        if len(ids) < PAGE_SIZE:
            return count


def delete_finished_runs(run_ids: list) -> list:
    """Delete those of ``run_ids`` that are finished, with their journal, timers, signals and async
    records, in one transaction; returns the ids deleted. Retention and the admin's purge use it."""
    with transaction.atomic():
        ids = list(Workflow.objects.finished().select_for_update().filter(pk__in=run_ids)
                   .values_list("pk", flat=True))
        # Related rows go first in plain DELETEs, so the run delete needs no per-row cascade.
        for related in (WorkflowStep, Timer, Signal, AsyncActivity):
            related.objects.filter(run_id__in=ids).delete()
        Workflow.objects.filter(parent_id__in=ids).update(parent=None)
        Workflow.objects.filter(restarted_from_id__in=ids).update(restarted_from=None)
        Workflow.objects.filter(pk__in=ids).delete()
    return ids


def purge_finished(now: datetime) -> int:
    """Delete finished runs older than WEFT_RETENTION for their status, with their journal and timers."""
    purged = 0
    for status, keep in weft_settings.RETENTION.items():
        if keep is None:
            continue
        cutoff = now - keep
        while True:
            ids = list(Workflow.objects.filter(status=status, finished_at__lt=cutoff)
                       .order_by("finished_at").values_list("pk", flat=True)[:PAGE_SIZE])
            if not ids:
                break
            purged += len(delete_finished_runs(ids))
            if len(ids) < PAGE_SIZE:
                break
    purge_history(now)
    return purged


def execute_runnable(now: datetime | None, report: MaintenanceReport, owner: str) -> None:
    """Claim and drive runnable runs until none is left (as of ``now``, or the live clock)."""
    with LeaseKeeper() as leases:
        while True:
            claims = transitions.claim(owner, now or clock.now(), weft_settings.CLAIM_BATCH_SIZE)
            if not claims:
                return
            report.count_claims(claims)
            leases.hold(claims)
            for held in claims:
                report.outcomes[executor.execute(held)] += 1
                leases.drop(held)


def run_maintenance(now: datetime | None = None) -> MaintenanceReport:
    """One synchronous pass, in the calling thread, of everything the loop does.

    Times out runs past their deadline, fires due schedules, executes every runnable run until it parks
    or finishes (timers, delayed starts and expired leases that are due included), and applies
    retention, all as if the time were ``now`` (default: the real clock).
    """
    report = MaintenanceReport()
    with clock.acting_at(now):
        moment = clock.now()
        report.timed_out = time_out_expired(moment)
        report.schedules_fired = fire_due_schedules(moment)
        execute_runnable(now, report, default_owner())
        report.purged = purge_finished(moment)
    return report
