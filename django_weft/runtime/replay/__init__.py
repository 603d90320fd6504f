"""The replay context, by operation family. ``runtime.context.Context`` is assembled from these mixins:

* ``core``: positions in the journal, the non-determinism check, commit / park / defer;
* ``activities``: ``ctx.run``; ``attempts``: retries and giving up; ``async_activities``: task tokens;
* ``timers``: ``ctx.sleep``, ``ctx.sleep_until``;
* ``signals``: ``ctx.wait_for_signal``;
* ``children``: ``ctx.start_child``, ``ctx.wait_child``, ``ctx.run_child``;
* ``values``: ``ctx.now``, ``ctx.uuid4``, ``ctx.random``, ``ctx.side_effect``;
* ``attributes``: ``ctx.set_search_attributes``;
* ``outgoing``: ``ctx.signal_workflow``; ``info``: ``ctx.info``;
* ``saga``: ``ctx.saga()``, compensations run in reverse order; ``core`` also holds cancellation
  (``ctx.cleanup()``, ``ctx.cancel_requested``).
"""
