"""What a workflow's code registers for the outside to call, and its logger: ``ctx.set_query_handler`` (answered
by a dry replay, see django_weft.services.queries), ``ctx.set_update_handler`` and ``ctx.set_signal_handler`` (applied
between operations, see runtime.replay.inbox), and ``ctx.logger``, which is silent while the code replays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from functools import cached_property
from typing import Any

from django_weft.common.storable import check_text
from django_weft.exceptions import InvalidArgument
from django_weft.runtime.replay.core import ReplayCore


class WorkflowLogger(logging.LoggerAdapter):
    """A workflow's logger: records carry ``workflow_id``, ``run_id`` and ``seq``; nothing is logged while
    the code re-walks operations already in the journal (each line is logged once per run, not per wake), nor
    while it unwinds because the run parks or stops."""

    def __init__(self, logger: logging.Logger, ctx: Handlers) -> None:
        super().__init__(logger, {})
        self._ctx = ctx

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        ctx = self._ctx
        kwargs["extra"] = {**kwargs.get("extra", {}), "workflow_id": ctx.workflow_id, "run_id": str(ctx.run_id),
                           "seq": ctx._seq}
        return msg, kwargs

    def isEnabledFor(self, level: int) -> bool:
        return not self._ctx._silent and super().isEnabledFor(level)


class Handlers(ReplayCore):
    """The replay context's handlers and logger (mixed into runtime.context.Context)."""

    def set_query_handler(self, name: str, handler: Callable[..., Any]) -> None:
        """Answer ``handle.query(name, *args)`` with ``handler(*args)``, computed from the state the code
        rebuilds by replaying the journal (nothing is executed or written). Register it before the run's
        first wait; a handler must only read that state."""
        self._query_handlers[_checked(name, handler, "query")] = handler

    def set_update_handler(self, name: str, handler: Callable[..., Any], *,
                           validator: Callable[..., Any] | None = None) -> None:
        """Apply ``handle.update(name, payload)`` with ``handler(payload)`` (``handler()`` without a payload) and
        reply with what it returns; an exception it raises is the caller's UpdateFailed and leaves the run
        alive. Updates are applied in arrival order once the code reaches its next durable call, or at once
        when the run waits; where each ran is journaled, so a replay applies it at the same point.

        ``validator(payload)`` runs in the caller, against the state rebuilt as for a query, before anything
        is written: an exception it raises rejects the update (UpdateRejected). Handlers only change the
        workflow's state: they may not make durable calls (``ctx.run``, ``ctx.sleep``...)."""
        key = _checked(name, handler, "update")
        if validator is not None and not callable(validator):
            raise InvalidArgument(f"the validator of update {name!r} must be callable, got {validator!r}")
        self._update_handlers[key] = handler
        self._claim.has_dependents = True  # closing the run fails the updates it did not apply
        if validator is None:
            self._update_validators.pop(key, None)
        else:
            self._update_validators[key] = validator

    def set_signal_handler(self, name: str, handler: Callable[[Any], Any]) -> None:
        """Consume signals ``name`` with ``handler(payload)`` instead of ``wait_for_signal``: applied like
        updates, in arrival order between operations, and waking the run when it waits (use
        ``ctx.wait_condition`` to wait for the state they change)."""
        self._signal_handlers[_checked(name, handler, "signal")] = handler

    @property
    def _silent(self) -> bool:
        # Also while the code unwinds for a park or a stop: what a finally block logs then is logged when
        # the workflow really ends.
        return self._dry or self.is_replaying or self._exiting is not None

    @cached_property
    def logger(self) -> logging.LoggerAdapter:
        """A ``logging`` logger for workflow code (``django_weft.workflows.<workflow type>``): silent while
        replaying, with ``workflow_id``, ``run_id`` and ``seq`` on every record."""
        return WorkflowLogger(logging.getLogger(f"django_weft.workflows.{self._claim.run.workflow_type}"), self)


def _checked(name: Any, handler: Any, what: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 255:
        raise InvalidArgument(f"a {what} name must be a non-empty string of at most 255 characters, got {name!r}")
    check_text(name, f"a {what} name")
    if not callable(handler):
        raise InvalidArgument(f"the handler of {what} {name!r} must be callable, got {handler!r}")
    return name
