"""The loops that execute runs: the ``weft_maintenance`` loop, the Celery drive task's body and beat entry,
execution in the calling thread (``weft.run()``), and the PostgreSQL listener that wakes idle loops.

Each one claims runs and hands them to :mod:`django_weft.runtime.executor`; nothing below imports them.
"""
