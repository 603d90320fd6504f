"""Compensations: ``ctx.saga()`` keeps a stack of activities that undo what the workflow did, run in reverse order
when it must give up (an error it catches, or its cancel inside ``with ctx.cleanup():``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django_weft.exceptions import InvalidArgument
from django_weft.runtime.activities import definition_of
from django_weft.runtime.replay.branches import Branches


class Saga:
    """A stack of compensations. ``add(activity, *args, **kwargs)`` after each step that needs undoing;
    ``compensate()`` runs them as activities (each with its own retry policy), the last added first."""

    def __init__(self, ctx: Branches) -> None:
        self._ctx = ctx
        self._stack: list[tuple[Callable[..., Any] | str, tuple, dict]] = []

    def __len__(self) -> int:
        return len(self._stack)

    def add(self, activity: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> None:
        """Push a compensation (a registered activity, or its name). Nothing runs until ``compensate()``."""
        definition_of(activity)  # an unknown activity is refused here, not when the run gives up
        self._stack.append((activity, args, kwargs))

    def compensate(self, *, parallel: bool = False) -> list[Any]:
        """Run the compensations, the last added first (``parallel=True``: all at once, as ``ctx.gather``), and
        empty the stack; their results in the order they ran. Every compensation runs even if one fails; then
        the first failure is raised."""
        if not isinstance(parallel, bool):
            raise InvalidArgument(f"compensate's parallel must be True or False, got {parallel!r}")
        pending, self._stack = list(reversed(self._stack)), []
        if parallel:
            branches = [self._ctx.start_activity(fn, *args, **kwargs) for fn, args, kwargs in pending]
            return self._ctx.gather(*branches) if branches else []
        results: list[Any] = []
        failure: Exception | None = None
        for fn, args, kwargs in pending:
            try:
                results.append(self._ctx.run(fn, *args, **kwargs))  # type: ignore[attr-defined]
            except Exception as exc:  # the others still run; the first failure is raised after them
                results.append(exc)
                failure = failure or exc
        if failure is not None:
            raise failure
        return results


class Sagas(Branches):
    """``ctx.saga()`` (mixed into runtime.context.Context)."""

    def saga(self) -> Saga:
        """A new, empty stack of compensations for this run's code (kept in memory: replay rebuilds it)."""
        return Saga(self)
