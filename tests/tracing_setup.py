"""One OpenTelemetry SDK tracer provider with an in-memory exporter for the process (the global provider can
be set once); the tracing tests, and the subprocess of the cross-process test, read spans from it."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _WhileRecording(SimpleSpanProcessor):
    """Keeps spans only while a tracing test runs (``recording``), so the rest of the suite stores none."""

    recording = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.recording:
            super().on_end(span)


EXPORTER = InMemorySpanExporter()
PROCESSOR = _WhileRecording(EXPORTER)
_provider = TracerProvider()
_provider.add_span_processor(PROCESSOR)
trace.set_tracer_provider(_provider)
tracer = trace.get_tracer("tests")


def spans(prefix: str = "") -> list[ReadableSpan]:
    return [span for span in EXPORTER.get_finished_spans() if span.name.startswith(prefix)]


def linked(span: ReadableSpan) -> set[tuple[int, int]]:
    """(trace_id, span_id) of every span ``span`` links to."""
    return {(link.context.trace_id, link.context.span_id) for link in span.links}


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id
