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

from dataclasses import dataclass
from typing import Any

from django_weft.common.row_bounded_cache import RowBoundedCache
from django_weft.conf import weft_settings
from django_weft.models import WorkflowStep


@dataclass(frozen=True)
class Kept:
    """A parked run's whole journal by position, the fence it was parked at, and whether closing the run has more
    to do than close it (store.transitions.Claim.has_dependents: children, slots, updates), as its execution left
    that: the next one need not look through every row for children."""

    fence: int
    journal: dict[int, WorkflowStep]
    has_dependents: bool


# run id -> what it was parked with
_kept: RowBoundedCache[Any, Kept] = RowBoundedCache()


def take(run_id: Any, fence: int) -> Kept | None:
    """What this process parked run ``run_id`` with, if the claim at ``fence`` is the very next one; None
    otherwise (and nothing is kept for the run any more)."""
    entry = _kept.pop(run_id)
    return entry if entry is not None and fence == entry.fence + 1 else None


def keep(run_id: Any, fence: int, journal: dict[int, WorkflowStep], has_dependents: bool) -> None:
    """Keep ``journal``, the whole journal of run ``run_id`` as this process parked it at ``fence``."""
    limit = int(weft_settings.EXECUTOR_CACHE_ROWS or 0)
    if not 0 < len(journal) <= limit:
        forget(run_id)
        return
    _kept.put(run_id, Kept(fence, journal, has_dependents), rows=len(journal), limit=limit)


def forget(run_id: Any) -> None:
    _kept.pop(run_id)


def clear() -> None:
    _kept.clear()
