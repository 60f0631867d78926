"""The cache of either SGLang version the timed scheduler drives (``sglang.version``), its
request lifecycle and a request's KV. Steps that differ per version narrow them
(:class:`sim.scheduler.Scheduler` is 0.5.14's; :mod:`sim.scheduler_v0523` overrides its
version-specific steps)."""

from __future__ import annotations

from hicache.lifecycle import KVLifecycle, ReqKV
from hicache.lifecycle_v0523 import KVLifecycle0523, ReqKV23
from hicache.policy import HiRadixCache
from hicache.policy.v0523 import UnifiedRadixCache

AnyCache = HiRadixCache | UnifiedRadixCache
AnyLife = KVLifecycle | KVLifecycle0523
AnyKV = ReqKV | ReqKV23

__all__ = ["AnyCache", "AnyKV", "AnyLife"]
