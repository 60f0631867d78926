"""The HiCache policy core: a faithful model of SGLang 0.5.14 ``HiRadixCache`` in plain Python.

Standard library only (no SimPy, torch, numpy or pandas), synchronous, and driven by a logical
clock. Copies go through a :class:`TransferController`; tests use :class:`ManualController`.

The tree modules can also be compiled, with the lifecycle and the scheduler's
(:mod:`hicache.policy.native`); whether this process uses that build is decided when this
package is first imported (``NATIVE`` says which and why).
"""

from hicache.policy._loader import activate as _activate

NATIVE = _activate(__path__, __name__)

# isort: split
from hicache.policy.allocator import PageAllocator, host_pool_tokens
from hicache.policy.controller import (
    BaseController,
    ImmediateController,
    ManualController,
    TransferController,
)
from hicache.policy.eviction import STRATEGIES, get_strategy
from hicache.policy.hiradix import (
    LOAD_BACK_THRESHOLD,
    WRITE_POLICIES,
    CacheStats,
    HiRadixCache,
    MatchResult,
)
from hicache.policy.radix import PageKey, TreeNode, to_page_key

__all__ = [
    "LOAD_BACK_THRESHOLD",
    "NATIVE",
    "STRATEGIES",
    "WRITE_POLICIES",
    "BaseController",
    "CacheStats",
    "HiRadixCache",
    "ImmediateController",
    "ManualController",
    "MatchResult",
    "PageAllocator",
    "PageKey",
    "TransferController",
    "TreeNode",
    "get_strategy",
    "host_pool_tokens",
    "to_page_key",
]
