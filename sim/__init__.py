"""sim: time, with SimPy. The timed engine (scheduler, PCIe link, SimController, recorder) and
the cache-only replay, both driving the shared model in :mod:`hicache`."""
