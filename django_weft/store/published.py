"""Writing what a run publishes (events and streams, design 9.4), inside the commit that journals the call, and
telling waiting readers once it lands (NOTIFY on PostgreSQL; elsewhere they poll)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_weft.models import StreamEntry, WorkflowEvent
from django_weft.store import wakeups


def set_event(run_id: Any, key: str, value: bytes, seq: int, at: datetime) -> None:
    """The key's latest value: the row is replaced, never duplicated (one per run and key)."""
    updated = WorkflowEvent.objects.filter(run_id=run_id, key=key).update(value=value, seq=seq, set_at=at)
    if not updated:
        WorkflowEvent.objects.create(run_id=run_id, key=key, value=value, seq=seq, set_at=at)
    wakeups.published(run_id)


def append_stream(run_id: Any, key: str, value: bytes | None, seq: int, at: datetime, *, closed: bool) -> None:
    StreamEntry.objects.create(run_id=run_id, key=key, value=value, seq=seq, closed=closed, written_at=at)
    wakeups.published(run_id)
