"""Registration of workflows and activities by stable name.

Runs store the workflow's name and version, so a name must keep meaning the same workflow across deploys;
several versions of one name may be registered at once (each run executes with the version it started on).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, overload

from django_weft.common.durations import to_seconds
from django_weft.common.storable import unstorable_reason
from django_weft.exceptions import (
    ConfigurationError,
    InvalidArgument,
    WorkflowAlreadyRegistered,
    WorkflowNotRegistered,
    WorkflowVersionNotRegistered,
)

F = TypeVar("F", bound=Callable[..., Any])

# What an exception raised by a workflow's own code does to its run.
ON_ERROR_CHOICES = ("fail", "hold")

_lock = threading.Lock()
_workflows: dict[str, dict[int, WorkflowDefinition]] = {}  # name -> version -> definition
# Types registered when first asked for rather than by a decorator (the tasks backend's "task:<path>": one per
# @task function, known once its module imports). Each is called with a name no decorator registered, and gives
# its definition or None.
_resolvers: list[Callable[[str], WorkflowDefinition | None]] = []


@dataclass(frozen=True)
class WorkflowDefinition:
    """A registered workflow type at one version."""

    name: str
    fn: Callable[..., Any]
    takes_input: bool
    version: int = 1
    # Seconds the cleanup of a cancelled run may take (None: WEFT_CLEANUP_TIMEOUT).
    cleanup_timeout: float | None = None
    # What an exception raised by the code itself does: "fail" the run or "hold" it (None: WEFT_WORKFLOW_ERRORS).
    on_error: str | None = None
    # The queue (WEFT_QUEUES) its runs start on when the start names none.
    queue: str | None = None

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
def workflow(*, name: str | None = None, version: int = 1, cleanup_timeout: float | timedelta | None = None,
             on_error: str | None = None, queue: str | None = None) -> Callable[[F], F]: ...


def workflow(fn: Any = None, /, *, name: str | None = None, version: int = 1,
             cleanup_timeout: float | timedelta | None = None, on_error: str | None = None,
             queue: str | None = None) -> Any:
    """Register a workflow: ``@weft.workflow`` or ``@weft.workflow(name="checkout", version=2)``.

    The function is called as ``fn(ctx)`` or ``fn(ctx, input)``; the default name is the function's
    ``module.qualname``. Give an explicit name if the code may move. Several versions of one name may be
    registered at once: new runs take the highest, and every run executes with the version it started on.
    ``cleanup_timeout`` bounds the cleanup of a cancelled run (``with ctx.cleanup():``), counted from the cancel
    request; default WEFT_CLEANUP_TIMEOUT. ``on_error="hold"`` holds a run whose code raises (a bug, not an
    activity's failure, not ``weft.ApplicationError``) instead of failing it, retried with backoff and after each
    deploy; default WEFT_WORKFLOW_ERRORS ("fail"). ``queue`` is the queue of WEFT_QUEUES its runs start on when
    the start names none.
    """
    if on_error not in (None, *ON_ERROR_CHOICES):
        raise ConfigurationError(f"on_error must be one of {', '.join(ON_ERROR_CHOICES)}, got {on_error!r}")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ConfigurationError(f"a workflow's queue must be the name of a queue of WEFT_QUEUES, got {queue!r}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigurationError(f"a workflow's version must be a positive int, got {version!r}")
    try:
        cleanup = None if cleanup_timeout is None else to_seconds(cleanup_timeout, "cleanup_timeout",
                                                                   allow_zero=False)
    except InvalidArgument as exc:
        raise ConfigurationError(str(exc)) from None

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
        definition = WorkflowDefinition(name=wf_name, fn=func, takes_input=count == 2, version=version,
                                        cleanup_timeout=cleanup, on_error=on_error, queue=queue)
        with _lock:
            versions = _workflows.setdefault(wf_name, {})
            existing = versions.get(version)
            if existing is not None and existing.qualified_name != definition.qualified_name:
                raise WorkflowAlreadyRegistered(
                    f"version {version} of workflow {wf_name!r} is already registered by {existing.qualified_name}; "
                    f"{definition.qualified_name} needs another name or version"
                )
            versions[version] = definition
        func.__weft_workflow__ = definition  # type: ignore[attr-defined]
        return func

    if fn is not None:
        return register(fn)
    return register


def get_workflow(name_or_fn: str | Callable[..., Any], version: int | None = None) -> WorkflowDefinition:
    """The registered workflow of that name (its highest version, or ``version``), or the one ``fn`` is."""
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
    versions = _workflows.get(name_or_fn) or _resolved(name_or_fn)
    if not versions:
        raise WorkflowNotRegistered(
            f"no workflow is registered as {name_or_fn!r}; is it decorated with @weft.workflow in an "
            f"installed app's workflows.py? Registered: {', '.join(sorted(_workflows)) or 'none'}"
        )
    if version is None:
        return versions[max(versions)]
    try:
        return versions[version]
    except KeyError:
        raise WorkflowVersionNotRegistered(
            f"version {version} of workflow {name_or_fn!r} is not registered (registered: "
            f"{', '.join(str(v) for v in sorted(versions))}); deploy code that registers it, or its runs wait",
            name=name_or_fn, version=version,
        ) from None


def add_resolver(resolve: Callable[[str], WorkflowDefinition | None]) -> None:
    """Let ``resolve`` register the types of names no decorator registered, when they are first asked for (a lower
    layer reaches the one that defines such types through this hook, without importing it)."""
    with _lock:
        if resolve not in _resolvers:
            _resolvers.append(resolve)


def _resolved(name: str) -> dict[int, WorkflowDefinition] | None:
    for resolve in list(_resolvers):
        definition = resolve(name)
        if definition is not None:
            with _lock:
                return _workflows.setdefault(name, {definition.version: definition})
    return None


def is_registered(name: str) -> bool:
    """A decorator registered ``name``, or a resolver knows it."""
    return name in _workflows or _resolved(name) is not None


def registered_workflow_names() -> set[str]:
    return set(_workflows)


def registered_versions(name: str) -> list[int]:
    return sorted(_workflows.get(name, ()))
