"""The test seam of waiting for a run: how ``handle.result()``, an update's reply and start-with wait when
:class:`django_weft.testing.WeftTestEnv` is active in the calling thread (it moves the runs itself instead of
waiting for an executor). Nothing here imports the testing helpers; they install themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_weft.services.client import WorkflowHandle

# Called by WorkflowHandle.result() without a timeout, before it starts waiting, when set: instead of
# waiting for an executor, the waiter moves the run itself and raises if it still cannot finish.
# django_weft.testing.WeftTestEnv sets it while it is active (for the thread that entered it), so a test
# never hangs on a run that waits for a signal or a timer; nothing else should. Set with
# set_result_waiter(); this module never imports the testing helpers.
ResultWaiter = Callable[["WorkflowHandle"], None]
# Beside it, the environment's driver: moves every run on as far as it can without time passing (what
# waiting for an update's reply does inside the environment).
_result_waiter: tuple[ResultWaiter, int, Callable[[], Any] | None] | None = None


def set_result_waiter(waiter: ResultWaiter | None, driver: Callable[[], Any] | None = None) -> Any:
    """Install ``waiter`` (and ``driver``) for calls of ``result()`` made in the calling thread (None: remove
    them); returns what was installed before, to restore."""
    global _result_waiter
    previous = _result_waiter
    _result_waiter = None if waiter is None else (waiter, threading.get_ident(), driver)
    return previous


def restore_result_waiter(previous: Any) -> None:
    global _result_waiter
    _result_waiter = previous


def waiter_here() -> ResultWaiter | None:
    installed = _result_waiter
    if installed is None or installed[1] != threading.get_ident():
        return None
    return installed[0]


def driver_here() -> Callable[[], Any] | None:
    """The test environment's driver, when one is active in this thread (see django_weft.testing)."""
    installed = _result_waiter
    if installed is None or installed[1] != threading.get_ident():
        return None
    return installed[2]
