"""OpenTelemetry spans (the "tracing" extra): imported by :func:`.events.configure` only when opentelemetry-api
is installed and WEFT_TRACING is not False. The application brings the SDK and its exporter; without them
the API's spans are no-ops.

A run remembers the trace of the code that started it (``Workflow.trace_context``, a W3C carrier) and a
signal the trace of its sender (``Signal.trace_context``). An execution may happen in another process, a
day later, after many others: so it is a span of its own trace, linked (not parented) to those contexts.
Activity attempts are its children; the runs a schedule tick starts remember the tick's span.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from django_weft.models import Workflow

_tracer = trace.get_tracer("django_weft")
_NO_SDK = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def recording() -> bool:
    """Whether the application installed a tracer provider (an SDK). Without one every span is a no-op that
    still costs about 20 us to open and close, twice per step, so the engine opens none. Asked at each use:
    an application may install its provider after Django started."""
    return not isinstance(trace.get_tracer_provider(), _NO_SDK)


def carrier() -> dict | None:
    """The current span's context as a W3C carrier (``traceparent``, ``tracestate``), or None."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    data: dict[str, str] = {}
    propagate.inject(data)
    return data or None


def _link(data: Any) -> trace.Link | None:
    if not isinstance(data, dict):
        return None
    context = trace.get_current_span(propagate.extract(data)).get_span_context()
    return trace.Link(context) if context.is_valid else None


@contextmanager
def _span(name: str, **options: Any) -> Iterator[trace.Span]:
    # The API's own exception recording calls str(exc): an exception whose __str__ raises would replace the
    # error the engine records. Recorded here instead, and never at the cost of the original exception.
    with _tracer.start_as_current_span(name, record_exception=False, set_status_on_exception=False,
                                       **options) as span:
        try:
            yield span
        except Exception as exc:  # not BaseException: weft.complete_async() and suspensions are no failures
            try:
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
                span.record_exception(exc)
            except Exception:
                pass
            raise


@contextmanager
def execution_span(run: Workflow) -> Iterator[trace.Span]:
    links = [link for link in (_link(run.trace_context),) if link is not None]
    attributes = {"weft.workflow_type": run.workflow_type, "weft.workflow_id": run.workflow_id,
                  "weft.run_id": str(run.pk)}
    # A root, whatever is current (a Celery task's span, a test's, a request executing inline): its own trace.
    with _span(f"weft.run {run.workflow_type}", kind=trace.SpanKind.CONSUMER, links=links,
               attributes=attributes, context=otel_context.Context()) as span:
        yield span


@contextmanager
def attempt_span(run: Workflow, info: Any) -> Iterator[trace.Span]:
    attributes = {"weft.activity": info.activity, "weft.seq": info.seq, "weft.attempt": info.attempt,
                  "weft.run_id": str(run.pk)}
    with _span(f"weft.activity {info.activity}", attributes=attributes) as span:
        yield span


def link_current(data: Any) -> None:
    """Link the current span (the execution consuming a signal) to the signal sender's context."""
    link = _link(data)
    if link is not None:
        trace.get_current_span().add_link(link.context)


@contextmanager
def tick_span() -> Iterator[trace.Span]:
    with _span("weft.schedule_tick", kind=trace.SpanKind.INTERNAL) as span:
        yield span
