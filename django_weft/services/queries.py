"""Queries: ``handle.query(name, *args)`` answered from a run's journal, executing and writing nothing.

The run's code is replayed dry (django_weft.services.replay_check) up to where the run is now, which rebuilds its
state and registers its query handlers (``ctx.set_query_handler``); then the handler is called. Works the
same for waiting, running and finished runs. A long journal's replay is kept while the run does not move
(django_weft.services.replay_cache).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django_weft.common.codec import MAX_DEPTH, decode, encode, nests_deeper_than
from django_weft.exceptions import PayloadError, PayloadTooDeep, QueryFailed, QueryNotFound
from django_weft.models import Timer, Workflow, WorkflowStep
from django_weft.models.instances import loaded
from django_weft.runtime.context import Context
from django_weft.services import replay_cache
from django_weft.services.replay_check import replay_dry


def query(run: Workflow, name: str, args: tuple) -> Any:
    """The answer of ``run``'s query handler ``name`` to ``args``."""
    state = replay_cache.replayed(run, lambda: replay(run))  # a run that failed still answers with the state it had
    with state.lock:
        return answer(run, state.ctx, name, args)


def replay(run: Workflow, steps: Iterable[WorkflowStep] | None = None,
           timers: Iterable[Timer] | None = None) -> tuple[Context, BaseException | None]:
    """``run``'s state rebuilt from its journal (a dry replay) and what stopped the replay early, if anything.
    ``steps`` and ``timers``: all the run's steps and timers, where the caller loaded them already."""
    if steps is None:
        steps = loaded(WorkflowStep.objects.filter(run=run))
    if timers is None:
        timers = Timer.objects.filter(run=run, fired_at__isnull=True, seq__isnull=False)
    else:
        timers = [timer for timer in timers if timer.fired_at is None and timer.seq is not None]
    return replay_dry(run, steps, timers)


def answer(run: Workflow, ctx: Context, name: str, args: tuple) -> Any:
    """The answer of query handler ``name`` to ``args``, from ``ctx``, the context a dry replay of ``run`` built."""
    if nests_deeper_than(args, MAX_DEPTH + 1):  # the tuple of arguments is a level
        raise PayloadTooDeep(f"the arguments of query {name!r} nest more than {MAX_DEPTH} levels deep, the limit of "
                             "every payload")
    handlers = ctx._query_handlers
    handler = handlers.get(name)
    if handler is None:
        known = ", ".join(repr(n) for n in sorted(handlers)) or "none"
        raise QueryNotFound(f"run {run.run_id} of {run.workflow_id!r} has no query handler {name!r}; its code "
                            f"registers: {known}", name=name, registered=sorted(handlers))
    try:
        answer = handler(*args)
    except Exception as exc:
        raise QueryFailed(f"query {name!r} of run {run.run_id} raised {type(exc).__name__}: {exc}") from exc
    try:
        # What the caller gets is a copy, as from any other run (and never a live object of the replay).
        return decode(encode(answer, what=f"the answer to query {name!r}"))
    except PayloadError as exc:
        raise QueryFailed(str(exc)) from exc
