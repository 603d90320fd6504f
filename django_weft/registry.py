"""Registration of workflows and activities by stable name.

Runs store the workflow's name, so a name must keep meaning the same function across deploys.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from .exceptions import ConfigurationError, WorkflowAlreadyRegistered, WorkflowNotRegistered
from .storable import unstorable_reason

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_workflows: dict[str, WorkflowDefinition] = {}


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    fn: Callable[..., Any]
    takes_input: bool

    @property
    def qualified_name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


def _positional_params(fn: Callable[..., Any]) -> int:
    params = inspect.signature(fn).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds)


@overload
def workflow(fn: F, /) -> F: ...
@overload
def workflow(*, name: str | None = None) -> Callable[[F], F]: ...


def workflow(fn: Any = None, /, *, name: str | None = None) -> Any:
    """Register a workflow: ``@weft.workflow`` or ``@weft.workflow(name="checkout")``.

    The function is called as ``fn(ctx)`` or ``fn(ctx, input)``; the default name is the function's
    ``module.qualname``. Give an explicit name if the code may move.
    """

    def register(func: F) -> F:
        count = _positional_params(func)
        if count not in (1, 2):
            raise ConfigurationError(
                f"workflow {func.__qualname__} must take (ctx) or (ctx, input), not {count} positional "
                "parameters; pass several values as one dict or tuple"
            )
        wf_name = name or f"{func.__module__}.{func.__qualname__}"
        if not isinstance(wf_name, str) or len(wf_name) > 200 or unstorable_reason(wf_name):
            raise ConfigurationError(f"workflow name {wf_name!r} must be a string of at most 200 characters "
                                     "without NUL or lone surrogates")
        definition = WorkflowDefinition(name=wf_name, fn=func, takes_input=count == 2)
        with _lock:
            existing = _workflows.get(wf_name)
            if existing is not None and existing.qualified_name != definition.qualified_name:
                raise WorkflowAlreadyRegistered(
                    f"workflow name {wf_name!r} is already registered by {existing.qualified_name}; "
                    f"{definition.qualified_name} needs another name"
                )
            _workflows[wf_name] = definition
        func.__weft_workflow__ = definition  # type: ignore[attr-defined]
        return func

    if fn is not None:
        return register(fn)
    return register


def get_workflow(name_or_fn: str | Callable[..., Any]) -> WorkflowDefinition:
    if callable(name_or_fn):
        definition = getattr(name_or_fn, "__weft_workflow__", None)
        if definition is None:
            raise WorkflowNotRegistered(
                f"{getattr(name_or_fn, '__qualname__', name_or_fn)!r} is not a workflow; decorate it with "
                "@weft.workflow"
            )
        return definition
    if not isinstance(name_or_fn, str):
        raise WorkflowNotRegistered(f"a workflow is named by its registered name or its function, got {name_or_fn!r}")
    try:
        return _workflows[name_or_fn]
    except KeyError:
        raise WorkflowNotRegistered(
            f"no workflow is registered as {name_or_fn!r}; is it decorated with @weft.workflow in an "
            f"installed app's workflows.py? Registered: {', '.join(sorted(_workflows)) or 'none'}"
        ) from None


def registered_workflow_names() -> set[str]:
    return set(_workflows)
