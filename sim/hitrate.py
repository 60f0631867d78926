"""Cache-only replay: the policy core over a trace, one request at a time, no timing model.

What one request does here (SGLang's path for a lone request, no concurrency; each step is a
call of the one lifecycle, :class:`hicache.lifecycle.KVLifecycle`):

1. ``match_prefix`` on the first ``input_length - 1`` prompt tokens, page-aligned (SGLang always
   recomputes at least one token).
2. A host hit is loaded back (``init_load_back``: all or nothing, at least 10 tokens, evicting the
   full length on device once if needed); the loads complete before the request's prefill.
3. The request locks its prefix, allocates pages for the rest of the prompt (evicting the full
   need, plus one page of over-estimate when ``page_size > 1``, if the pool is short) and, after
   prefill, ``cache_unfinished_req`` inserts the page-aligned prompt (write-through backups are
   issued here and complete before the next step).
4. Decode allocates the output tokens' KV (evicting one page at a time at page boundaries, as
   the decode memory check does for a batch of one): prompt + outputs but the last token, whose
   KV is never computed. Output tokens are unique: they take space and never hit.
5. ``cache_finished_req`` inserts prompt + outputs (``outputs="cache"``) or the prompt only
   (``outputs="skip"``; still the request's second insert, so it still counts a hit), frees the
   unaligned tail and releases the lock; its writes complete before the next request.

A request whose KV cannot fit even after evicting everything evictable is counted in
``oom_requests`` and contributes its prompt to the denominator with no hit.

Reported ``hit_rate`` = Σ cached tokens / Σ prompt tokens (SGLang's cache_hit_rate), split into
``device_hit_rate`` (found on device) and ``host_hit_rate`` (loaded back from host).

Under ``write_back`` SGLang never increments hit counts, so the hit-count strategies (``lfu``,
``slru``) evict exactly as ``lru``: identical rows are expected, and
:func:`write_back_ignores_hit_counts` says so for a set of result rows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hicache.lifecycle import (
    OUTPUT_MODES,
    CacheCounters,
    KVLifecycle,
    PagedRequest,
    paged_requests,
)
from hicache.output_keys import OUTPUT_REUSE_MODES, no_output_keys, output_keys_for
from hicache.policy import (
    STRATEGIES,
    WRITE_POLICIES,
    HiRadixCache,
    ImmediateController,
    PageAllocator,
    PageKey,
    TreeNode,
)
from hicache.policy.allocator import device_pool, page_ids
from hicache.policy.storage import PREFETCH_POLICIES, PageStore, StorageController
from hicache.versions import check_version

EVICTIONS = (*STRATEGIES, "tlru", "oracle")
"""``tlru`` exists from SGLang 0.5.21 (0.5.23 here); ``oracle`` is an offline bound (0.5.14)."""


@dataclass(frozen=True)
class HitRateConfig:
    """One cache configuration for the cache-only replay (capacities in tokens)."""

    device_tokens: int
    host_tokens: int = 0
    """Host pool in tokens; 0 = no host tier (plain radix cache)."""
    page_size: int = 64
    eviction: str = "lru"
    write_policy: str = "write_through"
    outputs: str = "cache"
    output_reuse: str = "none"
    """``workload.output_reuse``: ``next_turn`` gives a session turn's output pages its next
    prompt's symbols there (:mod:`hicache.output_keys`; the replay needs the trace for it:
    :func:`replay`'s ``trace``)."""
    storage: bool = False
    """An L3 storage tier behind the host pool (needs ``host_tokens``)."""
    storage_tokens: int = 0
    """L3 capacity in tokens (a page LRU); 0 = unbounded."""
    prefetch_policy: str = "timeout"
    """best_effort: a lone request is checked in the pass it arrives in, before any read, so it
    gets nothing from L3; wait_complete / timeout: storage I/O is taken as instant (no clock
    here; ``hicache-sim run`` times it)."""
    prefetch_threshold: int = 256
    host_memory_mode: str = "cache"
    """``--hicache-host-memory-mode``: ``cache`` (host RAM is the L2 tier) or ``buffer_only``
    (0.5.23 only, with ``storage``: host RAM only stages L3 copies, so every hit is a device or
    an L3 hit)."""
    sglang_version: str = "0.5.14"
    """The SGLang release whose cache decides (:data:`SGLANG_VERSIONS`). The Python classes
    (this one, ``sim.engine.Engine``, ``replay.driver.TraceReplayer``) default to 0.5.14, the
    reference core; the command line and the config default to the newest
    (``hicache.versions.DEFAULT_SGLANG_VERSION``)."""

    def validate(self) -> None:
        p = self.page_size
        check_version(self.sglang_version)
        if self.sglang_version == "0.5.14" and self.eviction == "tlru":
            raise ValueError("eviction=tlru is SGLang's since 0.5.21: use sglang_version 0.5.23")
        if self.sglang_version != "0.5.14" and self.eviction == "oracle":
            raise ValueError(
                "eviction=oracle is available with SGLang 0.5.14 only (add --sglang-version 0.5.14)"
            )
        if p < 1:
            raise ValueError(f"page_size must be >= 1, got {p}")
        if self.device_tokens <= 0 or self.device_tokens % p:
            raise ValueError(
                f"device tokens {self.device_tokens} must be a positive multiple of the page "
                f"size {p}"
            )
        if self.host_tokens < 0 or self.host_tokens % p:
            raise ValueError(
                f"host tokens {self.host_tokens} must be 0 or a positive multiple of the page "
                f"size {p}"
            )
        if 0 < self.host_tokens <= self.device_tokens and self.sglang_version == "0.5.14":
            raise ValueError(
                f"host pool ({self.host_tokens} tokens) must be larger than the device pool "
                f"({self.device_tokens} tokens); SGLang refuses to start otherwise"
            )
        if self.eviction not in EVICTIONS:
            raise ValueError(
                f"unknown eviction policy {self.eviction!r}; choose one of {', '.join(EVICTIONS)}"
            )
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"unknown write policy {self.write_policy!r}; choose one of "
                f"{', '.join(WRITE_POLICIES)}"
            )
        if self.outputs not in OUTPUT_MODES:
            raise ValueError(f"outputs must be one of {', '.join(OUTPUT_MODES)}")
        if self.output_reuse not in OUTPUT_REUSE_MODES:
            raise ValueError(f"output_reuse must be one of {', '.join(OUTPUT_REUSE_MODES)}")
        if self.storage and not self.host_tokens:
            raise ValueError("an L3 storage tier needs a host tier (host tokens > 0)")
        if self.storage_tokens < 0 or self.storage_tokens % p:
            raise ValueError(
                f"storage tokens {self.storage_tokens} must be 0 (unbounded) or a positive "
                f"multiple of the page size {p}"
            )
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"unknown prefetch policy {self.prefetch_policy!r}; choose one of "
                f"{', '.join(PREFETCH_POLICIES)}"
            )
        if self.prefetch_threshold < 1:
            raise ValueError(f"prefetch threshold must be >= 1, got {self.prefetch_threshold}")
        if self.host_memory_mode not in ("cache", "buffer_only"):
            raise ValueError(
                f"unknown host memory mode {self.host_memory_mode!r}; choose cache or buffer_only"
            )
        if self.host_memory_mode == "buffer_only":
            if self.sglang_version == "0.5.14":
                raise ValueError(
                    "host memory mode buffer_only is SGLang's since 0.5.19: use 0.5.23"
                )
            if not self.storage:
                raise ValueError(
                    "host memory mode buffer_only requires an L3 storage tier (SGLang refuses to "
                    "start without --hicache-storage-backend)"
                )


def _pools(cfg: HitRateConfig) -> tuple[PageAllocator, PageAllocator | None, ImmediateController]:
    """The device and host pools of ``cfg`` and an immediate controller over them."""
    p = cfg.page_size
    # one set of page-id objects for both pools (same ids, less memory to touch)
    ids = page_ids(max(cfg.device_tokens, cfg.host_tokens) // p)
    device = device_pool(cfg.device_tokens // p, p, ids)
    host = PageAllocator(cfg.host_tokens // p, p, "host", ids=ids) if cfg.host_tokens else None
    return device, host, ImmediateController(device, host)


class HitRateResult(CacheCounters):
    """The counters of a cache-only replay (:class:`hicache.lifecycle.CacheCounters`)."""


class CacheReplay:
    """Drives one :class:`HiRadixCache` through requests in order (see the module docstring)."""

    def __init__(self, cfg: HitRateConfig, eviction_key: Callable[[TreeNode], Any] | None = None):
        cfg.validate()
        self.cfg = cfg
        self.device, self.host, self.ctrl = _pools(cfg)
        self.cache = HiRadixCache(
            self.ctrl,
            write_policy=cfg.write_policy,
            eviction_policy=eviction_key if eviction_key is not None else cfg.eviction,
            volatile_keys=eviction_key is not None,
        )
        self.life = KVLifecycle(self.cache, cfg.outputs)
        # output page symbols per request (workload.output_reuse; set by replay)
        self.outs: Callable[[int], list[Hashable]] = no_output_keys
        self.result = HitRateResult()
        self.storage: StorageController | None = None
        if cfg.storage:
            assert self.host is not None
            cap = cfg.storage_tokens // cfg.page_size or None
            self.storage = StorageController(
                self.host,
                PageStore(cap),
                device_tokens=cfg.device_tokens,
                threshold=cfg.prefetch_threshold,
                immediate=cfg.prefetch_policy != "best_effort",
            )
            self.cache.attach_storage(
                self.storage,
                prefetch_policy=cfg.prefetch_policy,
                prefetch_threshold=cfg.prefetch_threshold,
            )

    def step(self, r: PagedRequest) -> tuple[int, int]:
        """Serve one request; returns (device-hit tokens, loaded host-hit tokens)."""
        cache, life, p, res = self.cache, self.life, self.cfg.page_size, self.result
        res.requests += 1
        res.prompt_tokens += r.input_length
        key = life.prompt_key(r)
        credit = 0
        storage = self.storage
        if storage is not None:
            # arrival: match and prefetch; then the scheduler's pass: drain, check, pop
            life.prefetch(r.rid, key, r.input_length, float(res.requests))
            cache.check_hicache_events()
            credit = life.prefetch_done(r.rid, float(res.requests))
            assert credit >= 0, "a prefetch outlived its check in the cache-only replay"
        a = life.admit(key, r.input_length)
        if a.loaded_pages:
            cache.ready_to_load_host_cache()
            cache.loading_check()
        if storage is not None and not storage.immediate:
            storage.run_all()  # best_effort: the stages finish after the request has left
        if not life.reserve_prompt(a.kv, r.input_length):
            res.oom_requests += 1
            return 0, 0
        life.after_prefill(a.kv)
        cache.writing_check()
        if life.alloc_outputs(a.kv, r.kv_tokens):
            life.finish(a.kv, key, self.outs(r.rid), r.kv_tokens)
            cache.writing_check()
        else:
            res.oom_requests += 1
        if storage is not None and not storage.immediate:
            storage.run_all()
        dev, loaded = a.device_pages * p, a.loaded_pages * p
        from_l3 = min(loaded, credit)
        res.device_hit_tokens += dev
        res.host_hit_tokens += loaded - from_l3
        res.storage_hit_tokens += from_l3
        return dev, loaded

    def finish(self) -> HitRateResult:
        self.result.collect(self.cache, self.ctrl)
        return self.result


class NextUseOracle:
    """Offline (Belady-style) eviction key: the evictable leaf whose content is next needed
    farthest in the future goes first (never-needed-again first, ties by LRU).

    A node's content is identified by its path from the root; "needed by request i" means the
    path is a prefix of request i's prompt pages. Built in O(total prompt pages) of the trace.
    """

    NEVER = 1 << 62

    def __init__(self, requests: Sequence[PagedRequest]) -> None:
        trie: dict[tuple[int, Hashable], int] = {}
        uses: list[list[int]] = []
        for i, r in enumerate(requests):
            pid = -1
            for sym in r.symbols:
                k = (pid, sym)
                nxt = trie.get(k)
                if nxt is None:
                    nxt = trie[k] = len(uses)
                    uses.append([i])
                else:
                    u = uses[nxt]
                    if u[-1] != i:
                        u.append(i)
                pid = nxt
        self._trie = trie
        self._uses = uses
        self._pid: dict[int, int] = {}
        self.now = 0
        self.cache: HiRadixCache | None = None

    def _node_pid(self, node: TreeNode) -> int:
        pid = self._pid.get(node.id)
        if pid is not None:
            return pid
        parent = node.parent
        if parent is None:  # the root (pushed as a parent; always locked, never evicted)
            return -2
        assert self.cache is not None
        pid = -1 if parent is self.cache.root else self._node_pid(parent)
        trie = self._trie
        for sym in node.key:
            if pid == -2:
                break
            pid = trie.get((pid, sym), -2)
        self._pid[node.id] = pid
        return pid

    def key(self, node: TreeNode) -> tuple[int, int]:
        pid = self._node_pid(node)
        nxt = self.NEVER
        if pid >= 0:
            u = self._uses[pid]
            j = bisect_right(u, self.now)
            if j < len(u):
                nxt = u[j]
        return (-nxt, node.last_access_time)


class CacheReplay0523:
    """:class:`CacheReplay` against SGLang 0.5.23's cache (L1/L2; the same request steps)."""

    def __init__(self, cfg: HitRateConfig) -> None:
        from hicache.lifecycle_v0523 import KVLifecycle0523
        from hicache.policy.v0523 import UnifiedRadixCache

        cfg.validate()
        self.cfg = cfg
        self.device, self.host, self.ctrl = _pools(cfg)
        self.cache = UnifiedRadixCache(
            self.ctrl,
            write_policy=cfg.write_policy,
            eviction_policy=cfg.eviction,
            host_memory_mode=cfg.host_memory_mode,
        )
        self.life = KVLifecycle0523(self.cache, cfg.outputs)
        # output page symbols per request (workload.output_reuse; set by replay)
        self.outs: Callable[[int], list[Hashable]] = no_output_keys
        self.result = HitRateResult()
        self.storage: Any = None
        self.buffer: Any = None
        if cfg.storage:
            from hicache.policy.v0523.l3 import StorageAttachment
            from hicache.policy.v0523.l3_controller import StorageController0523

            assert self.host is not None
            cap = cfg.storage_tokens // cfg.page_size or None
            self.storage = StorageController0523(
                self.host,
                PageStore(cap),
                threshold=cfg.prefetch_threshold,
                immediate=cfg.prefetch_policy != "best_effort",
            )
            kwargs: dict[str, Any] = {
                "prefetch_policy": cfg.prefetch_policy,
                "prefetch_threshold": cfg.prefetch_threshold,
            }
            if cfg.host_memory_mode == "buffer_only":
                from hicache.policy.v0523.buffer_l3 import BufferStorageAttachment

                self.buffer = BufferStorageAttachment(
                    self.cache, self.storage, device_tokens=cfg.device_tokens, **kwargs
                )
                self.cache.storage = self.buffer
            else:
                self.cache.storage = StorageAttachment(self.cache, self.storage, **kwargs)

    def step(self, r: PagedRequest) -> tuple[int, int]:
        """Serve one request; returns (device-hit tokens, loaded host-hit tokens).

        With L3: the arrival's query, then two scheduler passes before admission (the hit is
        allocated and read in the first, the completion ack inserts it in the second: storage
        I/O takes no time here), then the admission check. Under best_effort the check comes
        first and ends the prefetch before its query returns, as for a lone request in SGLang."""
        cache, life, p, res = self.cache, self.life, self.cfg.page_size, self.result
        res.requests += 1
        res.prompt_tokens += r.input_length
        key = life.prompt_key(r)
        credit = 0
        storage = self.storage
        if storage is not None:
            now = float(res.requests)
            life.prefetch(r.rid, key, r.input_length, now)
            cache.check_hicache_events()
            cache.check_hicache_events()
            credit = life.prefetch_done(r.rid, now)
            assert credit >= 0, "a prefetch outlived its check in the cache-only replay"
            life.admitted(r.rid)
        a = life.admit(key, r.input_length) if self.buffer is None else self._admit_staged(r, key)
        if a.loaded_pages:
            # launched before the prefill's allocation; its ack is drained with the step's
            # events after the batch result, as SGLang's loop drains it: the loaded chain stays
            # locked (and under write_back pinned against host-duplicate reclaim) meanwhile
            cache.ready_to_load_host_cache()
        if not life.reserve_prompt(a.kv, r.input_length):
            res.oom_requests += 1
            return 0, 0
        a.kv.key = key
        life.after_prefill(a.kv, len(key))
        cache.check_hicache_events()  # the batch result's flush, then the step's acks
        if life.alloc_outputs(a.kv, r.kv_tokens):
            life.finish(a.kv, key, self.outs(r.rid), r.kv_tokens)
            cache.check_hicache_events()
        else:
            res.oom_requests += 1
        if storage is not None and not storage.immediate:
            storage.run_all()  # best_effort: the stages finish after the request has left
        dev, loaded = a.device_pages * p, a.loaded_pages * p
        from_l3 = min(loaded, credit)
        res.device_hit_tokens += dev
        res.host_hit_tokens += loaded - from_l3
        res.storage_hit_tokens += from_l3
        return dev, loaded

    def _admit_staged(self, r: PagedRequest, key: Any) -> Any:
        """Admission in buffer_only mode: the match, then the staged L3 span (if any) loaded
        onto the device prefix (``prepare_staged_prefetch`` + ``init_load_back``). Alone in the
        replay, a request whose staged span cannot be placed now recomputes it (the hold is
        dropped), where the timed scheduler would retry it up to 32 passes."""
        from hicache.lifecycle_v0523 import Admitted23

        life, buffer, ps = self.life, self.buffer, self.cfg.page_size
        m = life.match(key, r.input_length)
        prefix, last = m.device_pages, m.last_device
        plan = buffer.prepare_staged(r.rid, len(prefix) * ps)
        if plan is False:
            buffer.retries.cancel(r.rid)  # nothing waits in the replay: recompute instead
        elif plan is not None:
            life.hold(m.last_device)  # the admission's _lock_node
            try:
                got = buffer.init_load_back_staged(r.rid, plan)
            finally:
                life.release(m.last_device)
            if got is None:
                buffer.release_staged_hold(r.rid)
            else:
                last = got[1]
                prefix = self.cache.tree.path_device_pages(last, self.cache.root)
        kv = life.lock(key, prefix, last)
        return Admitted23(kv, len(m.device_pages), len(prefix) - len(m.device_pages))

    def finish(self) -> HitRateResult:
        st, ctrl, res = self.cache.stats, self.ctrl, self.result
        res.tokens_written = ctrl.tokens_written
        res.tokens_loaded = ctrl.tokens_loaded
        res.device_evicted_tokens = st.device_evicted_tokens
        res.host_evicted_tokens = st.host_evicted_tokens
        res.host_alloc_failures = ctrl.host_alloc_failures
        res.load_back_failures = st.load_back_failures
        if self.storage is not None:
            ps = self.cfg.page_size
            res.prefetches_issued = self.cache.storage.stats.prefetch_issued
            res.storage_read_tokens = self.storage.stats.pages_read * ps
            res.storage_written_tokens = self.storage.store.pages_written * ps
        return res


def replay(
    requests: Sequence[PagedRequest], cfg: HitRateConfig, trace: Any = None
) -> HitRateResult:
    """Run the cache-only replay of ``requests`` under ``cfg`` (``eviction="oracle"`` allowed).
    ``trace``: the trace ``requests`` came from (``requests_for``), needed for
    ``cfg.output_reuse = "next_turn"``."""
    outs: Callable[[int], list[Hashable]] = no_output_keys
    if cfg.output_reuse != "none":
        if trace is None:
            raise ValueError("output_reuse needs the trace the requests came from")
        outs = output_keys_for(cfg.output_reuse, trace, cfg.page_size, len(requests))
    if cfg.sglang_version != "0.5.14":
        rp23 = CacheReplay0523(cfg)
        rp23.outs = outs
        for r in requests:
            rp23.step(r)
        return rp23.finish()
    if cfg.eviction == "oracle":
        oracle = NextUseOracle(requests)
        rp = CacheReplay(cfg, eviction_key=oracle.key)
        rp.outs = outs
        oracle.cache = rp.cache
        for i, r in enumerate(requests):
            oracle.now = i
            rp.step(r)
        return rp.finish()
    rp = CacheReplay(cfg)
    rp.outs = outs
    for r in requests:
        rp.step(r)
    return rp.finish()


#: Eviction strategies whose key is a node's hit count (``hicache.policy.eviction``).
HIT_COUNT_EVICTIONS = ("lfu", "slru")

#: Why ``lfu``/``slru`` rows equal ``lru`` rows under ``write_back`` (SGLang's behaviour).
WRITE_BACK_NOTE = (
    "under write_back SGLang never counts hits (HiRadixCache._inc_hit_count returns at once), "
    "so lfu and slru, which order nodes by hit count, evict exactly as lru does: identical "
    "rows there are SGLang's behaviour, not a bug"
)


def write_back_ignores_hit_counts(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """:data:`WRITE_BACK_NOTE` when ``rows`` (dicts with ``eviction`` and ``write_policy``, as
    the hit-rate grid and sweep results have) include a hit-count strategy under write_back,
    else None: a caption for tables and figures that would otherwise look like a bug."""
    for r in rows:
        if r.get("write_policy") == "write_back" and r.get("eviction") in HIT_COUNT_EVICTIONS:
            return WRITE_BACK_NOTE
    return None


def requests_for(trace: Any, page_size: int) -> list[PagedRequest]:
    """The requests of a ``traces.schema.Trace`` at ``page_size``."""
    return paged_requests(trace, page_size)


__all__ = [
    "EVICTIONS",
    "HIT_COUNT_EVICTIONS",
    "OUTPUT_MODES",
    "WRITE_BACK_NOTE",
    "CacheReplay",
    "HitRateConfig",
    "HitRateResult",
    "NextUseOracle",
    "PageKey",
    "PagedRequest",
    "replay",
    "requests_for",
    "write_back_ignores_hit_counts",
]
