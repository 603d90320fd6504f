"""Engine internals: the replay context, the executor of one claimed run, and the worker loop."""
