"""Services: the operations people call, each one or more transactions through the state writer.

The client (start, find, signal, cancel, wait), start-with, updates and queries, visibility (finding runs
by filters, and filters given as text), bulk operations, schedules and their tick, one maintenance pass,
liveness of executors, the replay check, and API keys. They import the layers below (``runtime``,
``store``, ``models``, ``common``), never the loops and faces above them.
"""
