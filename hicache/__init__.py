"""hicache: the model of SGLang HiCache (HiRadixCache v0.5.14) that every driver shares.

``hicache.policy`` is the policy core (standard library only); next to it are the one request
KV lifecycle, the configuration, hardware presets, the latency model and its profiles. Nothing
here imports SimPy or torch, and pandas only inside functions.
"""

__version__ = "0.1.0"

# the lifecycle's compiled build, if this process uses one (hicache.policy.native)
from hicache.policy._loader import activate as _activate

_activate(__path__, __name__)
