"""The latest heartbeat of an activity step (models.ActivityHeartbeat): written by attempts beating in
process (``weft.heartbeat``) and by outside systems beating with an async attempt's task token
(``weft.heartbeat_async``); read by the step's next attempt (its details) and by a parked async attempt's
timeout (its beat time).

One row per step, never locked: an attempt's beat only replaces the row of the same or an earlier attempt,
so a late beat of an attempt that was replaced cannot overwrite the details of the one after it.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import IntegrityError, transaction

from django_weft.models import ActivityHeartbeat


def save(run_id: uuid.UUID, seq: int, attempt: int, now: datetime, details: bytes | None) -> None:
    """Record attempt ``attempt``'s beat at ``now`` with its encoded ``details`` (None: keep the details
    stored, a beat without progress to report)."""
    fields: dict = {"attempt": attempt, "beat_at": now}
    if details is not None:
        fields["details"] = details
    rows = ActivityHeartbeat.objects.filter(run_id=run_id, seq=seq, attempt__lte=attempt)
    if rows.update(**fields):
        return
    if ActivityHeartbeat.objects.filter(run_id=run_id, seq=seq).exists():
        return  # a later attempt's
    try:
        with transaction.atomic():  # a savepoint: a lost insert race must not spoil an outer transaction
            ActivityHeartbeat.objects.create(run_id=run_id, seq=seq, **{"details": None, **fields})
    except IntegrityError:
        rows.update(**fields)  # another beat inserted it first


def last_beat_at(run_id: uuid.UUID, seq: int, attempt: int) -> datetime | None:
    """When attempt ``attempt`` of the step last beat (None: it has not, or a later attempt has since)."""
    return (ActivityHeartbeat.objects.filter(run_id=run_id, seq=seq, attempt=attempt)
            .values_list("beat_at", flat=True).first())
