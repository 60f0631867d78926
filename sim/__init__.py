"""sim: time, with SimPy. The timed engine (scheduler, PCIe link, SimController, recorder) and
the cache-only replay, both driving the shared model in :mod:`hicache`."""

# the scheduler's compiled build, if this process uses one (hicache.policy.native)
from hicache.policy._loader import activate as _activate

_activate(__path__, __name__)
