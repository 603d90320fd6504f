"""Control-flow exceptions of the engine.

They derive from BaseException so that a workflow's ``except Exception:`` cannot swallow them.
"""

from __future__ import annotations

import traceback
from typing import Any


class Suspend(BaseException):
    """The run parked (its state is committed); the executor has nothing more to do with it."""


class StopExecution(BaseException):
    """The executor must stop driving this run: it lost the run, or the worker is shutting down."""

    def __init__(self, *, release: bool) -> None:
        super().__init__()
        # True: the run is still ours and should be handed back; False: it was taken from us.
        self.release = release


MAX_TRACEBACK_CHARS = 8000


def error_dict(exc: BaseException, **extra: Any) -> dict[str, Any]:
    """A JSON-safe description of an exception, stored on steps and runs."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(exc))
    return {
        "type": name,
        "message": str(exc),
        "traceback": text[-MAX_TRACEBACK_CHARS:],
        **extra,
    }
