"""What the bench checks before it creates anything, and how an interrupt still lets it clean up (importing
this registers no workflow)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django_weft.common import clock
from django_weft.services.liveness import live_executors

# Live executors named in the refusal, at most.
MAX_NAMED = 10


def live_executor_refusal() -> str:
    """Why the bench must not run here now, or ``""``: the processes executing runs on this database (their
    heartbeat rows, :func:`django_weft.services.liveness.live_executors`, maintenance-only ones included). They would
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


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn the first SIGTERM into a KeyboardInterrupt, as Ctrl-C is, so ``finally`` blocks delete what the
    bench created; a second SIGTERM or SIGINT, during that cleanup, ends the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def on_signal(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stderr.write("weft_bench: interrupted; deleting what it created (signal again to exit at once)\n")
        sys.stderr.flush()
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, on_signal), signal.signal(signal.SIGINT, on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
