"""SGLang 0.5.23's cache (``UnifiedRadixCache``), dense path: a controller
(:mod:`~hicache.policy.v0523.cache`) over a tree core (:mod:`~hicache.policy.v0523.tree`).

``shared/design/SGLANG_0523.md`` lists every behaviour that differs from 0.5.14
(:mod:`hicache.policy.hiradix`). Standard library only, like the rest of the policy core.
"""

from hicache.policy._loader import activate as _activate

NATIVE = _activate(__path__, __name__)

# isort: split
from hicache.policy.v0523.cache import LOAD_BACK_THRESHOLD, WRITE_POLICIES, UnifiedRadixCache
from hicache.policy.v0523.node import STRATEGIES, UNode
from hicache.policy.v0523.tree import Match, TreeCore

__all__ = [
    "LOAD_BACK_THRESHOLD",
    "STRATEGIES",
    "WRITE_POLICIES",
    "Match",
    "TreeCore",
    "UNode",
    "UnifiedRadixCache",
]
