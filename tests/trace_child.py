"""Run in a subprocess by tests/test_tracing.py: executes what is runnable with ``weft_maintenance --once``
under an in-memory exporter of its own and prints the run execution spans, their links and their children
as one JSON line."""

from __future__ import annotations

import json

import django

from tests import tracing_setup  # before Django starts: the provider is in place for django_weft's tracer

tracing_setup.PROCESSOR.recording = True
django.setup()

from django.core.management import call_command  # noqa: E402

call_command("weft_maintenance", "--once")
executions = tracing_setup.spans("weft.run ")
print(json.dumps([{
    "name": span.name,
    "span": list(tracing_setup.ids(span)),
    "links": sorted(list(pair) for pair in tracing_setup.linked(span)),
    "children": sorted(child.name for child in tracing_setup.spans()
                       if child.parent is not None and child.parent.span_id == tracing_setup.ids(span)[1]),
} for span in executions]))
