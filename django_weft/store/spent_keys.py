"""Idempotency keys outlive their runs: a purge records the keys of the runs it deletes, and a start with one of
them raises IdempotencyKeyPurged instead of starting a second run (which could, say, charge a card twice)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django_weft.exceptions import IdempotencyKeyPurged
from django_weft.models import Workflow
from django_weft.models.audit import SpentIdempotencyKey
from django_weft.models.choices import RunStatus


def retire_keys(runs: Iterable[tuple[Any, str | None, str, str]], now: datetime) -> None:
    """The runs ``(run_id, idempotency_key, workflow_id, status)`` are being deleted (inside the transaction that
    deletes them): their keys are spent as of ``now``.

    Except where the run continued as new and its chain goes on: the key names the chain (a start with it
    returns the chain's run), so it moves to the first later run of the chain that is not being deleted, and is
    spent only when the chain's last run is purged.
    """
    runs = list(runs)
    deleting = {run_id for run_id, *_ in runs}
    spent = []
    for run_id, key, workflow_id, status in runs:
        if key is None:
            continue
        heir = _surviving_successor(run_id, workflow_id, deleting) if status == RunStatus.CONTINUED else None
        if heir is not None:
            Workflow.objects.filter(pk=run_id).update(idempotency_key=None)  # the key is unique: free it first
            # 0 rows: a concurrent purge deleted the heir (after we found it) without seeing the key: spend it.
            if Workflow.objects.filter(pk=heir).update(idempotency_key=key):
                continue
        spent.append(SpentIdempotencyKey(key=key, workflow_id=workflow_id, run_id=run_id, spent_at=now))
    # Spent once is spent: a second record of the same key changes nothing.
    SpentIdempotencyKey.objects.bulk_create(spent, ignore_conflicts=True)


def _surviving_successor(run_id: Any, workflow_id: str, deleting: set) -> Any:
    """The first run after ``run_id`` in its chain (as ``end_of_chain`` follows it) not in ``deleting``."""
    while True:
        run_id = (Workflow.objects.filter(restarted_from_id=run_id, workflow_id=workflow_id)
                  .order_by("created_at").values_list("pk", flat=True).first())
        if run_id is None or run_id not in deleting:
            return run_id


def refuse_if_spent(key: str) -> None:
    """Raise IdempotencyKeyPurged if ``key``'s run was purged. Called once no run holds the key: a purge deletes
    the run and records its key in one commit, so a start that saw the run gone sees the key spent."""
    spent = SpentIdempotencyKey.objects.filter(key=key).first()
    if spent is not None:
        raise IdempotencyKeyPurged(
            f"idempotency key {key!r} started run {spent.run_id} of {spent.workflow_id!r}, which was purged at "
            f"{spent.spent_at.isoformat()}; the key stays spent, so nothing was started: use a new key",
            key=key, workflow_id=spent.workflow_id, run_id=spent.run_id, spent_at=spent.spent_at,
        )
