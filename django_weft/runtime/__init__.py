"""One run: the replay context handed to workflow code (``replay/``), the executor of one claimed run, the
pool that executes activity attempts, the lease keeper, activities and their heartbeats.

It writes through :mod:`django_weft.store` only; the loops that claim runs live in :mod:`django_weft.worker`.
"""
