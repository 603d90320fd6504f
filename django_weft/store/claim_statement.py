"""The claim of runnable runs as one statement on PostgreSQL (state writer; :func:`transitions.claim` uses it).

The claim locks up to N runnable runs (``SKIP LOCKED``: concurrent claimers take disjoint pages), moves them
to running under the claimer's lease with their fence bumped, and fires the delayed-start timers of those that
were waiting for one. With the ORM that is BEGIN, SELECT ... FOR UPDATE, UPDATE, UPDATE, COMMIT: five round
trips and two compiled queries, for every batch an executor takes. Here it is one statement, whose implicit
commit makes it as atomic as the transaction was; it returns the claimed rows with what they were before.
Other databases, and a claim inside the caller's transaction, take the ORM's way (:func:`claim_with_the_orm`).
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from django.db import connections, router, transaction
from django.db.models import F
from django.db.models.functions import Coalesce

from django_weft.models import RunStatus, Timer, TimerPurpose, Workflow


@cache
def _sql(one_run: bool, of_queues: bool = False) -> str:
    runs, timers = Workflow._meta.db_table, Timer._meta.db_table
    only = ' AND "run_id" = %s' if one_run else ""
    if of_queues:
        only += ' AND "queue" = ANY(%s)'
    return f'''
        WITH picked AS (
            SELECT "run_id", "status", "lease_owner", "started_at", "runnable_at", "created_at" FROM "{runs}"
            WHERE "runnable_at" IS NOT NULL AND "runnable_at" <= %s{only}
            ORDER BY "runnable_at" LIMIT %s FOR UPDATE SKIP LOCKED
        ), fired AS (
            UPDATE "{timers}" AS t SET "fired_at" = %s FROM picked AS p
            WHERE t."run_id" = p."run_id" AND p."status" = %s AND p."runnable_at" > p."created_at"
              AND t."purpose" = %s AND t."fired_at" IS NULL
        ), claimed AS (
            UPDATE "{runs}" AS w SET "status" = %s, "fence" = w."fence" + 1, "lease_owner" = %s,
                "runnable_at" = %s, "wait_reason" = '', "started_at" = COALESCE(w."started_at", %s),
                "updated_at" = %s
            FROM picked AS p WHERE w."run_id" = p."run_id" RETURNING w.*
        )
        SELECT claimed.*, p."status" AS "weft_previous_status", p."lease_owner" AS "weft_previous_owner",
               p."started_at" IS NULL AS "weft_fresh"
        FROM claimed JOIN picked AS p ON p."run_id" = claimed."run_id" ORDER BY p."runnable_at"
    '''


# A claimed run as it is now, with its status and lease owner before the claim, and whether it never started.
Claimed = tuple[Workflow, str, str, bool]


def claim_in_one_statement(owner: str, now: datetime, limit: int, run_id: Any,
                           lease_expiry: datetime, queues: list[str] | None = None) -> list[Claimed] | None:
    """The claimed runs; None where this does not apply (another database, or inside a transaction, which the
    ORM's claim joins)."""
    alias = router.db_for_write(Workflow)
    connection = connections[alias]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return None
    params: list[Any] = [now, *([run_id] if run_id is not None else []), *([queues] if queues is not None else []),
                         limit, now, RunStatus.PENDING,
                         TimerPurpose.DELAYED_START, RunStatus.RUNNING, owner, lease_expiry, now, now]
    # Each row comes with 3 more columns.
    rows: Any = Workflow.objects.using(alias).raw(_sql(run_id is not None, queues is not None), params)
    return [(row, row.weft_previous_status, row.weft_previous_owner, row.weft_fresh) for row in rows]


def claim_with_the_orm(owner: str, now: datetime, limit: int, run_id: Any, lease: datetime,
                       queues: list[str] | None = None) -> list[Claimed]:
    """The claim in a transaction (other databases, or inside the caller's transaction), returning what
    :func:`claim_in_one_statement` does."""
    with transaction.atomic():
        runnable = Workflow.objects.runnable(now)
        if run_id is not None:
            runnable = runnable.filter(pk=run_id)
        if queues is not None:
            runnable = runnable.filter(queue__in=queues)
        # SKIP LOCKED: concurrent claimers take disjoint pages instead of queueing on the same rows.
        rows = list(runnable.order_by("runnable_at").select_for_update(skip_locked=True)[:limit])
        if not rows:
            return []
        Workflow.objects.filter(pk__in=[r.pk for r in rows]).update(
            status=RunStatus.RUNNING,
            fence=F("fence") + 1,
            lease_owner=owner,
            runnable_at=lease,
            wait_reason="",
            started_at=Coalesce("started_at", now),
            updated_at=now,
        )
        delayed = [r.pk for r in rows if r.status == RunStatus.PENDING and r.runnable_at > r.created_at]
        if delayed:
            Timer.objects.filter(run_id__in=delayed, purpose="delayed_start", fired_at__isnull=True).update(
                fired_at=now
            )
    claimed = []
    for row in rows:
        claimed.append((row, row.status, row.lease_owner, row.started_at is None))
        row.fence += 1
        row.status = RunStatus.RUNNING
        row.lease_owner = owner
        row.started_at = row.started_at or now
        row.runnable_at = lease
        row.wait_reason = ""
        row.updated_at = now
    return claimed
