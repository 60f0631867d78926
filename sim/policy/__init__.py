"""The HiCache policy core: a faithful, pure-Python model of SGLang 0.5.14 ``HiRadixCache``.

Standard library only (no SimPy, torch, numpy or pandas), synchronous, and driven by a logical
clock. Copies go through a :class:`TransferController`; tests use :class:`ManualController`.
"""

from sim.policy.allocator import PageAllocator, host_pool_tokens
from sim.policy.controller import (
    BaseController,
    ImmediateController,
    ManualController,
    TransferController,
)
from sim.policy.eviction import STRATEGIES, get_strategy
from sim.policy.hiradix import (
    LOAD_BACK_THRESHOLD,
    WRITE_POLICIES,
    CacheStats,
    HiRadixCache,
    MatchResult,
)
from sim.policy.radix import PageKey, TreeNode, to_page_key

__all__ = [
    "LOAD_BACK_THRESHOLD",
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
