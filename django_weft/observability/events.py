"""The engine's observability hooks: an execution, an activity attempt, the steps a commit recorded, a
delivered signal, a takeover, a schedule tick. Each fans out to Prometheus metrics, OpenTelemetry spans and
the Django signals of :mod:`django_weft.signals`.

:func:`configure` decides once, when Django starts, whether metrics and tracing are on, and imports their
modules only then. Every hook first checks the module globals ``_metrics`` and ``_tracing`` (and, for the
Django signals, whether anyone listens), so with everything off a hook costs a call and a branch.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from django_weft import signals
from django_weft.conf import weft_settings
from django_weft.models import StepKind, StepStatus, Workflow, WorkflowStep

logger = logging.getLogger("django_weft.observability")

_metrics: ModuleType | None = None
_tracing: ModuleType | None = None

# The libraries behind each module: an ImportError naming another module is a bug, not a missing extra.
_LIBRARIES = {"metrics": ("prometheus_client", "metrics"), "tracing": ("opentelemetry", "tracing")}


def configure() -> None:
    """Turn metrics and tracing on or off from WEFT_METRICS / WEFT_TRACING (None: on when installed)."""
    global _metrics, _tracing
    _metrics = _load("METRICS", "metrics")
    _tracing = _load("TRACING", "tracing")


def _load(setting: str, name: str) -> ModuleType | None:
    wanted = getattr(weft_settings, setting)
    if wanted is False:
        return None
    library, extra = _LIBRARIES[name]
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as exc:
        if not (exc.name or "").startswith(library):
            raise
        if wanted:
            raise ImproperlyConfigured(f"WEFT_{setting} = True needs {library}: pip install 'django-weft[{extra}]'"
                                       ) from exc
        return None


def metrics() -> ModuleType | None:
    """The loaded :mod:`.metrics` module, or None when metrics are off or not installed."""
    return _metrics


def tracing() -> ModuleType | None:
    return _tracing


def _spans() -> ModuleType | None:
    """The tracing module when spans are recorded somewhere (tracing on and an SDK installed), else None."""
    return _tracing if _tracing is not None and _tracing.recording() else None


# --- runs -------------------------------------------------------------------------------------------


def trace_context() -> dict | None:
    """The current span's W3C carrier, stored on a run at start() and on a signal at signal(); None
    without tracing or without a current span."""
    return _tracing.carrier() if _tracing is not None else None


class Execution:
    """What one execution of a run reports: ``ended(outcome)`` when the executor knows how it ended."""

    def __init__(self, run: Workflow) -> None:
        self.run = run
        self.outcome = ""

    def ended(self, outcome: str) -> None:
        self.outcome = outcome


@contextmanager
def execution(run: Workflow) -> Iterator[Execution]:
    """Around one execution of ``run``: a span (current while user code runs, linked to the trace that
    started the run), the busy-executor gauge and the execution's duration."""
    report = Execution(run)
    spans = _spans()
    if _metrics is None and spans is None:
        yield report
        return
    began = time.monotonic()
    span = spans.execution_span(run) if spans is not None else nullcontext()
    if _metrics is not None:
        _metrics.execution_began()
    try:
        with span as current:
            yield report
            if current is not None:
                current.set_attribute("weft.outcome", report.outcome)
    finally:
        if _metrics is not None:
            _metrics.execution_ended(run.workflow_type, report.outcome or "error", time.monotonic() - began)


def run_event(signal: Any, run: Workflow) -> None:
    """Inside the transaction that started or ended ``run`` (``signal``: workflow_started or the signal of
    how it ended): once it commits, count it and send ``signal``. Nothing is held for the commit when nothing
    counts or listens."""
    if _metrics is None and not signal.receivers:
        return
    transaction.on_commit(lambda: _run_event_committed(signal, run))


def _run_event_committed(signal: Any, run: Workflow) -> None:
    if _metrics is not None:
        try:  # after the commit: a failing metric must not cost the caller its return, nor receivers the signal
            if signal is signals.workflow_started:
                _metrics.run_started(run.workflow_type)
            else:
                _metrics.run_finished(run.workflow_type, run.status)
        except Exception:
            logger.exception("counting run %s in the metrics failed", run.pk)
    if signal.receivers:
        signal.send_robust(sender=Workflow, run=run)


def takeover(run: Workflow, *, previous_owner: str = "", owner: str = "") -> None:
    """This execution took ``run`` over from an executor whose lease expired (the claim has committed)."""
    if _metrics is not None:
        _metrics.takeover(run.workflow_type)
    if signals.workflow_taken_over.receivers:
        signals.workflow_taken_over.send_robust(sender=Workflow, run=run, previous_owner=previous_owner, owner=owner)


def operator_event(signal: Any, run: Workflow, **details: Any) -> None:
    """Inside the transaction that suspended or resumed ``run``: send ``signal`` once it commits."""
    if signal.receivers:
        transaction.on_commit(lambda: signal.send_robust(sender=Workflow, run=run, **details))


# --- activity attempts -------------------------------------------------------------------------------


class AttemptInfo(Protocol):
    """What an attempt's hooks read of ``django_weft.runtime.activities.ActivityInfo``."""

    activity: str
    seq: int
    attempt: int


def attempt(body: Callable[..., Any], info: AttemptInfo, run: Workflow, *, is_async: bool) -> Callable[..., Any]:
    """``body`` wrapped so each call of it is one attempt: ``activity_started`` (sent as it begins: an
    attempt commits nothing before it runs), a span, and its duration by outcome. ``body`` itself when
    nothing watches."""
    if _metrics is None and _spans() is None and not signals.activity_started.receivers:
        return body
    if is_async:
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with _AttemptScope(info, run):
                return await body(*args, **kwargs)
        return run_async

    def run_sync(*args: Any, **kwargs: Any) -> Any:
        with _AttemptScope(info, run):
            return body(*args, **kwargs)
    return run_sync


class _AttemptScope:
    """Around one attempt: ``activity_started``, its span, and its duration by outcome. A class rather than a
    generator context manager: it is entered once per activity attempt, and a generator costs more."""

    __slots__ = ("began", "info", "run", "span")

    def __init__(self, info: AttemptInfo, run: Workflow) -> None:
        self.info, self.run = info, run

    def __enter__(self) -> None:
        info, run = self.info, self.run
        if signals.activity_started.receivers:
            # On the attempt's own thread no transaction is open, so this sends at once; inside a caller's
            # transaction (run_maintenance in atomic()) it waits for that transaction's commit.
            transaction.on_commit(lambda: signals.activity_started.send_robust(
                sender=Workflow, run=run, activity=info.activity, seq=info.seq, attempt=info.attempt))
        self.began = time.monotonic()
        spans = _spans()
        self.span = spans.attempt_span(run, info) if spans is not None else None
        if self.span is not None:
            self.span.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            outcome = "completed"
        else:  # weft.complete_async() is a BaseException: the attempt parked
            outcome = "async" if exc_type.__name__ == "CompleteAsync" else "failed"
        try:
            if self.span is not None:
                self.span.__exit__(exc_type, exc, tb)
        finally:
            if _metrics is not None:
                _metrics.attempt_ended(self.info.activity, outcome, time.monotonic() - self.began)


# --- what a fenced commit recorded ---------------------------------------------------------------------


def watching_steps() -> bool:
    """Whether :func:`steps_committed` has anything to do (the state writer skips building its arguments)."""
    return _metrics is not None or bool(
        signals.activity_completed.receivers or signals.activity_failed.receivers
        or signals.signal_consumed.receivers)


def steps_committed(run: Workflow, steps: Sequence[WorkflowStep], consumed: Sequence[tuple[int, str, int]], *,
                    committed: bool = False) -> None:
    """Inside the transaction that records ``steps`` and consumes signals (pk, name, seq) for ``run``: once it
    commits, count the steps that finished and send the activity and signal_consumed signals. ``committed``:
    the statement that recorded them committed already (autocommit), so they are reported now."""
    after_commit = _now if committed else transaction.on_commit
    if _metrics is not None:
        timed = [(step.kind, (step.finished_at - step.started_at).total_seconds()) for step in steps
                 if step.finished_at is not None and step.started_at is not None and step.status in _ENDED]
        if timed:  # after the commit: a rolled-back step is recorded (and counted) again by the next execution
            after_commit(lambda: [_metrics.step_ended(kind, seconds) for kind, seconds in timed])
    listened = signals.activity_completed.receivers or signals.activity_failed.receivers
    announced = [step for step in steps if step.kind == StepKind.ACTIVITY and _activity_ended(step)] if listened else []
    if announced:
        after_commit(lambda: _send_activities(run, announced))
    if consumed and signals.signal_consumed.receivers:
        after_commit(lambda: [
            signals.signal_consumed.send_robust(sender=Workflow, run=run, signal_pk=pk, name=name, seq=seq)
            for pk, name, seq in consumed])


def _now(fn: Callable[[], Any]) -> None:
    fn()


_ENDED = (StepStatus.COMPLETED, StepStatus.FAILED)


def _activity_ended(step: WorkflowStep) -> bool:
    # A waiting row with an error is a failed attempt whose retry is scheduled; without one, an async wait.
    return step.status in _ENDED or (step.status == StepStatus.WAITING and step.error is not None)


def _send_activities(run: Workflow, steps: list[WorkflowStep]) -> None:
    for step in steps:
        if step.status == StepStatus.COMPLETED:
            signals.activity_completed.send_robust(sender=Workflow, run=run, activity=step.name, seq=step.seq,
                                                   attempt=step.attempt, step=step)
        else:
            signals.activity_failed.send_robust(sender=Workflow, run=run, activity=step.name, seq=step.seq,
                                                attempt=step.attempt, error=step.error or {},
                                                will_retry=step.status == StepStatus.WAITING, step=step)


# --- signals -------------------------------------------------------------------------------------------


def signal_received(run: Workflow, signal: Any) -> None:
    """Inside the transaction that stored ``signal`` (a models.Signal) for ``run``."""
    if signals.signal_received.receivers:
        transaction.on_commit(lambda: signals.signal_received.send_robust(
            sender=Workflow, run=run, name=signal.name, signal_pk=signal.pk, signal_id=signal.signal_id,
            record=signal))  # not signal=: Django passes the Signal being sent under that name


def signal_consumed(signal: Any) -> None:
    """The executing run consumes ``signal`` (in its thread): its execution span links to the sender's trace."""
    if _tracing is not None and signal.trace_context:
        _tracing.link_current(signal.trace_context)


# --- lock conflicts ------------------------------------------------------------------------------------


def lock_retry(transition: str, reason: str) -> None:
    """The database aborted ``transition`` over locks (a deadlock, a lock wait timeout) and it is run again."""
    if _metrics is not None:
        _metrics.lock_retry(transition, reason)


# --- schedules -----------------------------------------------------------------------------------------


def schedule_tick() -> Any:
    """Around one tick over the due schedules: a span (the runs it starts link to it)."""
    return _tracing.tick_span() if _tracing is not None else nullcontext()
