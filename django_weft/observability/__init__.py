"""Prometheus metrics and OpenTelemetry spans, both optional extras ("metrics", "tracing").

:mod:`.events` holds the hooks the engine calls; :func:`.events.configure` (run by ``WeftConfig.ready``)
imports :mod:`.metrics` and :mod:`.tracing` only when their library is installed and not turned off
(``WEFT_METRICS``, ``WEFT_TRACING``). Importing this package imports neither library.
"""
