"""django_weft's benchmarks, an optional Django app: add ``"django_weft.bench"`` to INSTALLED_APPS (after
``"django_weft"``) to get ``manage.py weft_bench``. Nothing here is imported by the engine.

* :mod:`.core`: the in-process throughput bench and the schedule-tick bench (importing it registers the
  ``weft.bench`` workflow, so only the command imports it);
* :mod:`.processes`: the modes that execute in ``weft_maintenance`` or Celery subprocesses, and latency;
* :mod:`.seed`: a large seeded history and the run admin's timings against it.
"""
