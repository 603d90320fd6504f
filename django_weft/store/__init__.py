"""The state writer: the one door through which a run's status, lease and fence change.

No module outside this package writes those columns (``tests/test_layout.py`` checks it). Every operation is
a ``select_for_update``-fenced transaction (or one statement that does the same on PostgreSQL):

- ``transitions``: insert a run, claim runnable runs, commit a step, park, finish, continue as new,
  release, cancel, time out; the only place that decides which status may follow which.
- ``claim_statement``, ``signal_statement``: the claim and a signal as one statement on PostgreSQL.
- ``journal``: the journal writes an executor folds into its fenced commits; ``group_commit`` writes the
  commits of several runs in one statement; ``bound_cursor`` prepares the hot statements.
- ``inbox``: signals and updates delivered to a run (numbered in its inbox); ``activity_answers``: outside
  systems' answers to async activity attempts.
- ``repairs`` (suspend, resume, retry), ``terminations`` (terminate), ``forks`` (fork from a step):
  what operators do to one run.
- ``leases``: renewing the leases of held runs; ``wakeups``: telling executors a run became runnable;
  ``lock_retries``: retrying a transition aborted over a lock conflict.
- ``starts``: start options validated into an unsaved run; ``spent_keys``: idempotency keys that outlive
  their runs; ``search_rows``: the indexed rows of search attributes.
- ``admissions``: queues admitting queued runs (a queued run becomes pending there and nowhere else);
  ``activity_slots``: the slots attempts of limited activities wait for.

It imports ``models``, ``common`` and ``observability``; it reaches the layers above only through the hooks
they register (``transitions.on_schedule_run_closed``, ``wakeups.use_celery_tasks``).
"""
