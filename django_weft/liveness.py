"""Is anything executing? Executors' heartbeat rows, and the hint a newcomer needs when nothing is.

(Stub: filled in by the executor-heartbeat work of issue 11.)
"""

from __future__ import annotations

from datetime import datetime


def stalled_hint(now: datetime | None = None) -> str:
    """A one-line hint when runs have been pending for a while and no executor is alive, else ``""``.

    For example: "12 runs pending for over 5 minutes and no live executor; is weft_maintenance running?"
    """
    return ""
