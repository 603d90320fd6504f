"""One maintenance pass: time out runs past their deadline, apply retention, execute runnable runs.

Timers, delayed starts and expired leases need no pass of their own: each sets the run's
``runnable_at``, so the claim query that feeds executors picks them up.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F

from django_weft.common import clock
from django_weft.common.queues import celery_routes
from django_weft.conf import weft_settings
from django_weft.models import AsyncActivity, RunStatus, Signal, StepAttempt, Timer, Workflow, WorkflowStep
from django_weft.runtime import executor
from django_weft.runtime.lease_keeper import LeaseKeeper
from django_weft.services import liveness
from django_weft.services.schedule_tick import due_schedules, fire_due_schedules, next_due_at, purge_history
from django_weft.store import activity_slots, admissions, in_flight, inbox, spent_keys, transitions, wakeups

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
    admitted: int = 0  # queued runs their queues admitted
    purged: int = 0
    dispatched: int = 0  # django_weft.drive tasks sent (WEFT_EXECUTOR = "celery")

    def add(self, other: MaintenanceReport) -> None:
        """Add ``other``'s counts to this report's."""
        for name, value in other.__dict__.items():
            if name == "outcomes":
                self.outcomes.update(value)
            else:
                setattr(self, name, getattr(self, name) + value)

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
    return f"{_hostname()}:{os.getpid()}:{threading.get_ident()}"


@functools.cache
def _hostname() -> str:
    return socket.gethostname()  # a system call, and weft.run() asks for every run


def time_out_expired(now: datetime) -> int:
    """End open runs whose execution deadline passed (running ones lose their executor)."""
    count = 0
    while True:
        ids = list(Workflow.objects.past_deadline(now).order_by("execution_deadline")
                   .values_list("pk", flat=True)[:PAGE_SIZE])
        count += sum(transitions.time_out(run_id, now) for run_id in ids)
        if len(ids) < PAGE_SIZE:
            return count


def delete_finished_runs(run_ids: list, now: datetime | None = None) -> list:
    """Delete those of ``run_ids`` that are finished, with their journal, timers, signals and async
    records, in one transaction; returns the ids deleted. Their idempotency keys stay spent (as of ``now``,
    default the clock's; see spent_keys.retire_keys). Retention and the admin's purge use it."""
    with transaction.atomic():
        rows = list(Workflow.objects.finished().select_for_update().filter(pk__in=run_ids)
                    .values_list("pk", "idempotency_key", "workflow_id", "status"))
        ids = [pk for pk, *_ in rows]
        spent_keys.retire_keys(rows, now or clock.now())
        # Related rows go first in plain DELETEs, so the run delete needs no per-row cascade.
        for related in (WorkflowStep, StepAttempt, Timer, Signal, AsyncActivity):
            related.objects.filter(run_id__in=ids).delete()
        Workflow.objects.filter(parent_id__in=ids).update(parent=None)
        Workflow.objects.filter(restarted_from_id__in=ids).update(restarted_from=None)
        Workflow.objects.filter(pk__in=ids).delete()
    return ids


def purge_finished(now: datetime) -> int:
    """Delete finished runs older than WEFT_RETENTION for their status, with their journal and timers;
    also old schedule decisions (WEFT_SCHEDULE_HISTORY) and the rows of long-dead executors."""
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
            purged += len(delete_finished_runs(ids, now))
            if len(ids) < PAGE_SIZE:
                break
    purge_history(now)
    activity_slots.purge_grants(now)
    in_flight.purge_settled()  # rows of attempts whose executor died before it could withdraw them
    liveness.dead_executors(now).delete()
    # Updates a run did not apply before it ended on a path that does not look at them (the executor's fast
    # completion of a run whose last execution registered no update handler): their callers are told.
    inbox.fail_updates_of_closed_runs(now)
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

    Times out runs past their deadline, fires due schedules, admits queued runs as their queues allow (runs
    admitted while it executes, as slots free, are executed too), executes every runnable run until it parks
    or finishes (timers, delayed starts and expired leases that are due included), and applies
    retention, all as if the time were ``now`` (default: the real clock).
    """
    report = MaintenanceReport()
    with clock.acting_at(now):
        moment = clock.now()
        report.timed_out = time_out_expired(moment)
        report.schedules_fired = fire_due_schedules(moment)
        report.admitted = admissions.admit_all(moment)
        activity_slots.grant_all(moment)
        execute_runnable(None if now is None else moment, report, default_owner())  # moment: now in UTC
        report.purged = purge_finished(moment)
    return report


# Runs that became runnable this recently probably have their own drive task in flight.
DISPATCH_GRACE = timedelta(seconds=2)
# Distinct schedule instants in the coming window that get a tick task of their own, per pass, and how
# many due schedules are looked at for them.
MAX_TICKS_AHEAD = 20
MAX_SCHEDULES_AHEAD = 200
# The coming window reaches this many passes ahead, so a pass that runs late leaves no gap between its
# window and the previous one (what two windows both cover is sent twice: harmless).
WINDOW_OVERLAP = 2


def dispatch_to_celery(now: datetime, window: float) -> int:
    """Send ``django_weft.drive`` tasks for what no after-commit task covers; returns how many were sent.

    * Runs that are due but unclaimed (a lost or failed send, a worker killed mid-run whose lease has
      expired, a timer too far ahead for an ETA when it was set): batch tasks, one per
      WEFT_CLAIM_BATCH_SIZE runs, at most WEFT_CELERY_DISPATCH_LIMIT.
    * Waiting or delayed runs due within the coming window (``window`` seconds until the next pass, twice
      over) that were set too far ahead for an ETA then: one task each, with their ETA, so long timers fire
      on time too.
    """
    batch = weft_settings.CLAIM_BATCH_SIZE
    limit = weft_settings.CELERY_DISPATCH_LIMIT
    due_ids = list(Workflow.objects.runnable(now - DISPATCH_GRACE).values_list("pk", flat=True)[: limit * batch])
    if celery_routes():
        # Queues routed to Celery queues of their own: a batch task would claim any run, so one task per run,
        # each sent where its queue goes.
        sent = sum(wakeups.send_drive(run_id) for run_id in due_ids)
    else:
        sent = sum(wakeups.send_drive(None) for _ in range(math.ceil(len(due_ids) / batch)))
    horizon = timedelta(seconds=weft_settings.CELERY_ETA_HORIZON)
    upcoming = (
        Workflow.objects.filter(status__in=[RunStatus.WAITING, RunStatus.PENDING], runnable_at__gt=now,
                                runnable_at__lte=now + timedelta(seconds=window * WINDOW_OVERLAP))
        .filter(runnable_at__gt=F("updated_at") + horizon)
        .order_by("runnable_at").values_list("pk", "runnable_at")[: limit * batch]
    )
    sent += sum(wakeups.send_drive(run_id, eta) for run_id, eta in upcoming)
    return sent


def tick_ahead(now: datetime, window: float) -> int:
    """Send ``django_weft.tick`` tasks with ETAs for the schedule instants of the coming window: a
    beat-driven pass every few seconds alone would start their runs late (and late counts as missed).

    The instants are each due schedule's next occurrence and the ones after it inside the window (for
    schedules more frequent than the passes), at most MAX_TICKS_AHEAD distinct ones, soonest first.
    """
    from django_weft.services.schedule_tick import cadence_of

    end = now + timedelta(seconds=window * WINDOW_OVERLAP)
    due_soon = due_schedules().filter(due_at__gt=now, due_at__lte=end)[:MAX_SCHEDULES_AHEAD]
    instants: set[datetime] = set()
    for schedule in due_soon:
        cadence = cadence_of(schedule)
        moment: datetime | None = schedule.due_at
        while moment is not None and moment <= end and len(instants) < MAX_TICKS_AHEAD * 4:
            instants.add(moment)
            moment = cadence.next_after(moment)
    return sum(wakeups.send_tick(instant) for instant in sorted(instants)[:MAX_TICKS_AHEAD])


# A tick task that arrives this close before the schedule instant it was sent for waits for it.
TICK_EARLY_WAIT = timedelta(seconds=1)


def tick_when_due() -> int:
    """The ``django_weft.tick`` task: fire due schedules. Delivered a moment early (clocks of hosts differ
    a little), it waits for the soonest instant first: a tick after it would be late, and late by more
    than a second counts the occurrence as missed."""
    clock.sleep_until(next_due_at(), within=TICK_EARLY_WAIT)
    return fire_due_schedules(clock.now())


def maintenance_pass(now: datetime, *, window: float, purge: bool = True) -> MaintenanceReport:
    """Everything but executing runs: time out runs past their deadline, tick due schedules, admit queued runs
    their queues allow (store/admissions: also after every start and end on a queue; this pass covers rate
    windows that reopen, delayed and debounced starts, resumed types, changed limits, failed passes), apply
    retention (``purge``) and, with WEFT_EXECUTOR = "celery", deliver what no task covers (see
    :func:`dispatch_to_celery`). ``window`` is the time until the next pass, in seconds."""
    report = MaintenanceReport()
    report.timed_out = time_out_expired(now)
    report.schedules_fired = fire_due_schedules(now)
    report.admitted = admissions.admit_all(now)
    activity_slots.grant_all(now)  # rate windows that reopened
    if wakeups.celery_executes():
        report.dispatched = dispatch_to_celery(now, window)
    if purge:
        report.purged = purge_finished(now)
    return report
