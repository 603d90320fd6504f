"""What a workflow's code registers for the outside to call, and its logger: ``ctx.set_query_handler`` (answered
by a dry replay, see django_weft.queries) and ``ctx.logger``, which is silent while the code replays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from functools import cached_property
from typing import Any

from ...exceptions import InvalidArgument
from ...storable import check_text
from .core import ReplayCore


class WorkflowLogger(logging.LoggerAdapter):
    """A workflow's logger: records carry ``workflow_id``, ``run_id`` and ``seq``; nothing is logged while
    the code re-walks operations already in the journal (each line is logged once per run, not per wake)."""

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
        if not isinstance(name, str) or not name or len(name) > 255:
            raise InvalidArgument(f"a query name must be a non-empty string of at most 255 characters, got {name!r}")
        check_text(name, "a query name")
        if not callable(handler):
            raise InvalidArgument(f"the handler of query {name!r} must be callable, got {handler!r}")
        self._query_handlers[name] = handler

    @property
    def _silent(self) -> bool:
        return self._dry or self.is_replaying

    @cached_property
    def logger(self) -> logging.LoggerAdapter:
        """A ``logging`` logger for workflow code (``django_weft.workflows.<workflow type>``): silent while
        replaying, with ``workflow_id``, ``run_id`` and ``seq`` on every record."""
        return WorkflowLogger(logging.getLogger(f"django_weft.workflows.{self._claim.run.workflow_type}"), self)
