"""What a driver that serves requests through the lifecycle reports (:class:`CacheCounters`).

Apart from :mod:`hicache.lifecycle` because the drivers' result types subclass it, which a
class of a compiled module does not allow (``hicache.policy.native`` compiles the lifecycle);
``hicache.lifecycle`` re-exports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hicache.policy import BaseController, HiRadixCache


@dataclass
class CacheCounters:
    """What a driver that serves requests through the lifecycle reports: requests, prompt
    tokens and their hits (SGLang's ``cache_hit_rate`` = hit tokens / prompt tokens), and the
    copy and eviction totals of the controller and the cache (:meth:`collect`)."""

    requests: int = 0
    prompt_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    storage_hit_tokens: int = 0  # loaded from host after an L3 prefetch brought them there
    tokens_written: int = 0
    tokens_loaded: int = 0
    device_evicted_tokens: int = 0
    host_evicted_tokens: int = 0
    host_alloc_failures: int = 0
    load_back_failures: int = 0
    oom_requests: int = 0
    prefetches_issued: int = 0  # L3 prefetches (0 without a storage tier)
    storage_read_tokens: int = 0  # tokens read from L3 (discarded reads included)
    storage_written_tokens: int = 0  # tokens newly stored in L3 (existing pages skipped)

    @property
    def hit_rate(self) -> float:
        hits = self.device_hit_tokens + self.host_hit_tokens + self.storage_hit_tokens
        return hits / max(1, self.prompt_tokens)

    @property
    def device_hit_rate(self) -> float:
        return self.device_hit_tokens / max(1, self.prompt_tokens)

    @property
    def host_hit_rate(self) -> float:
        return self.host_hit_tokens / max(1, self.prompt_tokens)

    @property
    def storage_hit_rate(self) -> float:
        return self.storage_hit_tokens / max(1, self.prompt_tokens)

    def collect(self, cache: HiRadixCache, ctrl: BaseController) -> None:
        """Copy the controller's and the cache's running totals in."""
        st = cache.stats
        self.tokens_written = ctrl.tokens_written
        self.tokens_loaded = ctrl.tokens_loaded
        self.device_evicted_tokens = st.device_evicted_tokens
        self.host_evicted_tokens = st.host_evicted_tokens
        self.host_alloc_failures = ctrl.host_alloc_failures
        self.load_back_failures = st.load_back_failures
        storage = cache.storage
        if storage is not None:
            ps = cache.page_size
            self.prefetches_issued = cache.storage_stats.prefetch_issued
            self.storage_read_tokens = storage.stats.pages_read * ps
            self.storage_written_tokens = storage.store.pages_written * ps

    def as_dict(self) -> dict[str, Any]:
        """Every counter, then the three rates."""
        return {
            **asdict(self),
            "hit_rate": self.hit_rate,
            "device_hit_rate": self.device_hit_rate,
            "host_hit_rate": self.host_hit_rate,
            "storage_hit_rate": self.storage_hit_rate,
        }
