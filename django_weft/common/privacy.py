"""Payload privacy (design 9.5): who may see what runs carry (inputs, results, signal and update payloads, query
answers, events and streams, heartbeat details). The faces (the admin, the HTTP API, ``weft_runs``) set, per request
or command, whether the caller holds ``django_weft.view_payloads``; what they show then reads :func:`shown`. Python
callers of the engine are not affected: they hold the database anyway."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

PERMISSION = "view_payloads"
HIDDEN = "hidden"

_visible: contextvars.ContextVar[bool] = contextvars.ContextVar("weft_payloads_visible", default=True)


def visible() -> bool:
    return _visible.get()


@contextlib.contextmanager
def payloads(visible: bool) -> Iterator[None]:
    """Within the block, payloads are shown (``visible``) or replaced by HIDDEN."""
    token = _visible.set(visible)
    try:
        yield
    finally:
        _visible.reset(token)


def set_for_this_request(visible: bool) -> None:
    """Until :func:`restore` (the API sets it once it knows the caller, and restores it when its view returns)."""
    _visible.set(visible)


def remember() -> contextvars.Token[bool]:
    return _visible.set(_visible.get())


def restore(token: contextvars.Token[bool]) -> None:
    _visible.reset(token)


def shown(value: Callable[[], T]) -> T | str:
    """``value()``, or HIDDEN without computing it when payloads are hidden."""
    return value() if _visible.get() else HIDDEN


def shown_value(value: Any) -> Any:
    return value if _visible.get() else HIDDEN
