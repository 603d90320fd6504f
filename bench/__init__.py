"""django_weft's benchmarks, an optional Django app: add ``"django_weft.bench"`` to INSTALLED_APPS (after
``"django_weft"``) to get ``manage.py weft_bench``. Nothing here is imported by the engine.

* :mod:`.core`: the bench workflow, the commit-rate probe and counters, and the in-process throughput bench
  (importing it registers the ``weft.bench`` workflow, so only the command imports it);
* :mod:`.tick`: the schedule-tick bench (``--schedules``);
* :mod:`.subprocesses`: starting, watching and stopping the bench's subprocesses;
* :mod:`.processes`: the ``weft_maintenance`` subprocess mode and the timed drive it shares with
  :mod:`.celery_worker`, the Celery-worker mode;
* :mod:`.latency`: the signal-to-resume latency of an idle loop;
* :mod:`.parallel`: parallel branches (``ctx.gather``) against the sequential form of the same work (``--parallel``);
* :mod:`.replay_bench`: the replay check over seeded open runs, 1% of them mismatched (``--replay-check``);
* :mod:`.continue_bench`: the cost per signal of a run looping on signals with and without
  ``ctx.continue_as_new`` (``--continue-as-new``);
* :mod:`.query_bench`: ``handle.query()`` against the history length of the run (``--query-latency``);
* :mod:`.seed`: a large seeded history (with search attributes, for :mod:`.find_bench`) and the run admin's
  timings against it;
* :mod:`.find_bench`: ``weft.list_runs`` and ``weft.count_runs`` against it, with each query's plan (``--find``).
"""
