"""Renewing the leases of held runs (state writer; the lease keeper and activity heartbeats call it).

A lease is a held run's ``runnable_at``: while it lies ahead no other executor claims the run. Renewing it is
a compare-and-set on the run's fence, status and owner, like every executor write, so a run taken over,
ended or handed back meanwhile is marked lost instead of leased again.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, router, transaction

from django_weft.conf import weft_settings
from django_weft.models import RunStatus, Workflow

if TYPE_CHECKING:
    from django_weft.store.transitions import Claim

S = RunStatus


def lease_expiry(now: datetime) -> datetime:
    """When a lease taken or renewed at ``now`` runs out."""
    return now + timedelta(seconds=weft_settings.LEASE_SECONDS)


def renew(claims: Iterable[Claim], now: datetime) -> None:
    """Extend the leases of runs held by a live executor; mark the ones it lost.

    Where rows lock, one transaction for all: the held rows are read with SKIP LOCKED, so a row another
    transaction holds (a signal sent inside a caller's long transaction) holds up no other run's renewal, and
    those still held by their claim (fence, running, owner: a release() racing the renewal is not undone) get
    the new lease in one UPDATE. A skipped row waits for the next beat, unless its lease would run out before
    it: that one is renewed as before, waiting for the lock.
    """
    live = [held for held in claims if not held.lost]
    if not live:
        return
    expiry = lease_expiry(now)
    alias = router.db_for_write(Workflow)
    runs = Workflow.objects.using(alias)
    features = connections[alias].features
    if not features.has_select_for_update:  # SQLite: no row locks to skip
        _renew_each(runs, live, expiry)
        return
    rows = runs.filter(pk__in=[held.run.pk for held in live])
    with transaction.atomic(using=alias):
        locked = rows.select_for_update(skip_locked=True, no_key=features.has_select_for_no_key_update)
        seen, cancelled = {}, set()
        for pk, fence, status, owner, cancel_at in locked.values_list("pk", "fence", "status", "lease_owner",
                                                                      "cancel_requested_at"):
            seen[pk] = (fence, status, owner)
            if cancel_at is not None:
                cancelled.add(pk)
        missing = [held.run.pk for held in live if held.run.pk not in seen]
        # Held by another transaction now (often the executor's own step commit): read without the lock, so a
        # cancel request reaches a run that commits back to back.
        busy = dict(rows.filter(pk__in=missing).values_list("pk", "cancel_requested_at")) if missing else {}
        kept, waiting = [], []
        for held in live:
            if held.run.pk in busy:
                waiting.append(held)
                held.cancel_requested = held.cancel_requested or busy[held.run.pk] is not None
            elif seen.get(held.run.pk) == (held.fence, S.RUNNING, held.owner):
                kept.append(held)
                held.cancel_requested = held.cancel_requested or held.run.pk in cancelled
            else:
                held.lost = True  # taken over, ended, handed back, or gone
        if kept:
            runs.filter(pk__in=[held.run.pk for held in kept]).update(runnable_at=expiry)
    for held in kept:
        held.lease_until = expiry
    beat = timedelta(seconds=weft_settings.HEARTBEAT_SECONDS)
    _renew_each(runs, [held for held in waiting if held.lease_until is None or held.lease_until - now <= 2 * beat],
                expiry)


def _renew_each(runs: Any, claims: list[Claim], expiry: datetime) -> None:
    if claims:  # tell each held run whose cancel was requested since its claim
        cancelled = set(runs.filter(pk__in=[held.run.pk for held in claims], cancel_requested_at__isnull=False)
                        .values_list("pk", flat=True))
        for held in claims:
            held.cancel_requested = held.cancel_requested or held.run.pk in cancelled
    for held in claims:
        # The owner check keeps a renewal racing a release() from re-leasing a run just handed back.
        if runs.filter(pk=held.run.pk, fence=held.fence, status=S.RUNNING, lease_owner=held.owner).update(
                runnable_at=expiry):
            held.lease_until = expiry
        else:
            held.lost = True
