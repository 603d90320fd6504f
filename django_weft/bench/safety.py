"""What the bench checks before it creates anything (importing this registers no workflow)."""

from __future__ import annotations

from .. import clock
from ..liveness import live_executors

# Live executors named in the refusal, at most.
MAX_NAMED = 10


def live_executor_refusal() -> str:
    """Why the bench must not run here now, or ``""``: the processes executing runs on this database (their
    heartbeat rows, :func:`django_weft.liveness.live_executors`, maintenance-only ones included). They would
    claim the bench's runs, which their code may not even know (``weft.bench`` is registered only by the
    bench), so the figures would be wrong and runs could be held where the bench cannot delete them."""
    now = clock.now()
    live = list(live_executors(now)[: MAX_NAMED + 1])
    if not live:
        return ""
    named = "; ".join(
        f"{row} ({row.threads} executor thread(s), last seen "
        f"{max(0.0, (now - row.last_seen).total_seconds()):.0f}s ago)"
        for row in live[:MAX_NAMED]
    )
    more = "; and more" if len(live) > MAX_NAMED else ""
    return (
        f"refusing to run beside live executors on this database: {named}{more}. Stop them, or point the bench "
        "at a database nothing else uses, and run it again. A process that was killed rather than stopped "
        "counts as live until its heartbeat row expires (3 x WEFT_HEARTBEAT_SECONDS); the admin lists them "
        "under Workflows > Executors."
    )
