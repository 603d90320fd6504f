"""Journals of runs this process parked, kept so that the run's next wake here reads no journal rows.

A run's journal is written only by the executor holding it, under its fence, and every claim moves the fence
by one (store.claim_statement); repairs, suspensions and closes move it too. So when this process parks a run
at fence F, the journal it holds in memory (every row it loaded or committed) is the run's whole journal for
as long as the fence stays F; the next claim has F + 1 exactly when no other executor, in this process or
another, held the run in between. Only that claim takes the journal (the entry is removed as it is taken:
one owner at a time); any other finds none, or one of another fence, which it drops, and loads the journal
from the database as always. Its own commits are fenced as always, so even a journal kept wrongly could not
commit over another executor's: the fence is the guarantee, this only spares the read.

Up to ``WEFT_EXECUTOR_CACHE_ROWS`` journal rows in all are kept, the least recently parked run dropped first;
0 keeps none. Runs with branches of workflow code (their rows live in blocks of their own) are not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.core.signals import setting_changed

from django_weft.conf import weft_settings
from django_weft.models import WorkflowStep

_kept: OrderedDict[Any, tuple[int, dict[int, WorkflowStep]]] = OrderedDict()
_rows = 0
_guard = threading.Lock()


def take(run_id: Any, fence: int) -> dict[int, WorkflowStep] | None:
    """The journal this process parked run ``run_id`` with, if the claim at ``fence`` is the very next one;
    None otherwise (and nothing is kept for the run any more)."""
    global _rows
    with _guard:
        entry = _kept.pop(run_id, None)
        if entry is None:
            return None
        _rows -= len(entry[1])
    parked_at, journal = entry
    return journal if fence == parked_at + 1 else None


def keep(run_id: Any, fence: int, journal: dict[int, WorkflowStep]) -> None:
    """Keep ``journal``, the whole journal of run ``run_id`` as this process parked it at ``fence``."""
    global _rows
    limit = int(weft_settings.EXECUTOR_CACHE_ROWS or 0)
    if not 0 < len(journal) <= limit:
        forget(run_id)
        return
    with _guard:
        old = _kept.pop(run_id, None)
        if old is not None:
            _rows -= len(old[1])
        _kept[run_id] = (fence, journal)
        _rows += len(journal)
        while _rows > limit:
            _, (_, dropped) = _kept.popitem(last=False)
            _rows -= len(dropped)


def forget(run_id: Any) -> None:
    global _rows
    with _guard:
        entry = _kept.pop(run_id, None)
        if entry is not None:
            _rows -= len(entry[1])


def clear() -> None:
    global _rows
    with _guard:
        _kept.clear()
        _rows = 0


def _codec_changed(*, setting: str, **kwargs: Any) -> None:
    # Rows kept sealed with a key the new ring may not hold (in production a ring changes with a restart).
    if setting == "WEFT_PAYLOAD_CODEC":
        clear()


setting_changed.connect(_codec_changed, dispatch_uid="django_weft.kept_journals")
