"""Writing the attempts in flight (models.AttemptInFlight): published by the lease keeper for attempts that have
run for a while, withdrawn when they end, purged by maintenance once their step settled or their run closed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q

from django_weft.models import AttemptInFlight, RunStatus, StepStatus, WorkflowStep


@dataclass(frozen=True)
class Published:
    run_id: Any
    seq: int
    attempt: int
    activity: str
    executor: str
    started_at: datetime
    timeout_at: datetime | None


def publish(attempts: Iterable[Published], now: datetime) -> None:
    """One row per step: a later attempt's replaces an earlier one's."""
    for item in attempts:
        fields = dict(attempt=item.attempt, activity=item.activity[:255], executor=item.executor[:255],
                      started_at=item.started_at, timeout_at=item.timeout_at, published_at=now)
        rows = AttemptInFlight.objects.filter(run_id=item.run_id, seq=item.seq, attempt__lte=item.attempt)
        if not rows.update(**fields) and not AttemptInFlight.objects.filter(run_id=item.run_id,
                                                                            seq=item.seq).exists():
            AttemptInFlight.objects.create(run_id=item.run_id, seq=item.seq, **fields)


def withdraw(attempts: Iterable[tuple[Any, int, int]]) -> None:
    """The attempts (run id, seq, attempt) ended: their rows go (not a later attempt's)."""
    for run_id, seq, attempt in attempts:
        AttemptInFlight.objects.filter(run_id=run_id, seq=seq, attempt__lte=attempt).delete()


def purge_settled() -> int:
    """Rows an executor could not withdraw (it died): their run closed, or their step settled since."""
    settled = WorkflowStep.objects.filter(run_id=OuterRef("run_id"), seq=OuterRef("seq"),
                                          status__in=[StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED])
    stale = AttemptInFlight.objects.filter(Q(Exists(settled)) | ~Q(run__status__in=RunStatus.open_values()))
    deleted, _ = stale.delete()
    return deleted
