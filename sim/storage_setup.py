"""How a timed run builds its L3 tier: one store (content, page keys, link) shared by every
instance or one per instance, and per instance a storage controller on its host pool, attached
to its cache, driven by a :class:`~sim.storage.SimStorage`.

Sizes: a store page holds every TP rank's shard (the store's capacity is in whole-model KV);
each rank moves its own shard, so a call's link bytes are the per-rank page bytes times the
ranks that move it (all of them for reads; rank 0 only for writes of rank-replicated MLA KV).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import simpy

from hicache.policy import HiRadixCache, PageAllocator
from hicache.policy.storage import PageHasher, PageStore, StorageController
from hicache.storage_backends import StorageBackendSpec
from sim.storage import SimStorage, StorageCallRow, StorageLink

if TYPE_CHECKING:
    from hicache.config import SimConfig

#: CPU time SGLang spends hashing a request's page keys on its prefetch thread, per token
#: (STORAGE_TIER.md §5.1, timed on a copy of its hash function on the 2-core build machine):
#: about 0.3 us at page 64 and 2 us at page 1 (pages below 64 tokens take the page-1 figure).
HASH_S_PER_TOKEN_LARGE_PAGE = 0.3e-6
HASH_S_PER_TOKEN_SMALL_PAGE = 2.0e-6


@dataclass
class StorageSetup:
    """The L3 pieces of one run (see the module docstring)."""

    spec: StorageBackendSpec
    prefetch_policy: str
    prefetch_threshold: int
    timeout_base: float
    timeout_per_ki_token: float
    timeout_max: float
    capacity_pages: int | None
    eviction_ratio: float
    shared: bool
    page_size: int
    page_bytes_per_rank: int
    ranks: int
    write_ranks: int
    instances: int = 1
    store_gbps: float = 0.0
    rows: list[StorageCallRow] = field(default_factory=list)
    _stores: dict[int, tuple[PageStore, PageHasher, StorageLink]] = field(default_factory=dict)

    sglang_version: str = "0.5.14"
    host_memory_mode: str = "cache"
    """``cache.host_memory_mode``: ``buffer_only`` attaches 0.5.23's buffer-mode tier
    (:mod:`hicache.policy.v0523.buffer_l3`)."""

    @classmethod
    def from_config(cls, cfg: SimConfig, page_bytes_per_rank: int) -> StorageSetup | None:
        """None when ``cfg`` has no L3 tier (``storage.backend = "none"``)."""
        from hicache.storage_backends import backend_for

        spec = backend_for(cfg.storage)
        if spec is None:
            return None
        st, model, ps = cfg.storage, cfg.model.spec, cfg.cache.page_size
        tp = cfg.model.tp
        page_bytes_all = page_bytes_per_rank * (1 if model.mla else tp)
        capacity = int(st.capacity_gb * 1e9 // page_bytes_all) if st.capacity_gb > 0 else None
        shared = spec.shared if st.shared == "auto" else st.shared == "yes"
        version = cfg.sglang.version
        base, per_ki, cap = st.timeouts(version)
        return cls(
            spec=spec,
            prefetch_policy=st.prefetch_policy,
            prefetch_threshold=st.prefetch_threshold,
            timeout_base=base,
            timeout_per_ki_token=per_ki,
            timeout_max=cap if cap is not None else float("inf"),
            capacity_pages=max(1, capacity) if capacity is not None else None,
            eviction_ratio=st.eviction_ratio,
            shared=shared,
            page_size=ps,
            page_bytes_per_rank=page_bytes_per_rank,
            ranks=tp,
            write_ranks=1 if model.mla else tp,
            instances=cfg.cluster.instances,
            store_gbps=st.store_gbps,
            sglang_version=version,
            host_memory_mode=cfg.cache.host_memory_mode,
        )

    @property
    def hash_s_per_page(self) -> float:
        ps = self.page_size
        per_token = HASH_S_PER_TOKEN_LARGE_PAGE if ps >= 64 else HASH_S_PER_TOKEN_SMALL_PAGE
        return per_token * ps

    def _store(self, env: simpy.Environment, index: int) -> tuple[PageStore, PageHasher, Any]:
        key = 0 if self.shared else index
        got = self._stores.get(key)
        if got is None:
            # a shared store: each instance's calls move at most one client's bandwidth, all of
            # them together at most storage.store_gbps (0: instances x that, the store scaling
            # with its clients' NICs), counted in units of the read bandwidth
            aggregate = 1.0
            if self.shared:
                aggregate = float(self.instances)
                if self.store_gbps > 0:
                    aggregate = max(1.0, self.store_gbps / self.spec.read_gbps)
            got = (
                PageStore(self.capacity_pages, self.eviction_ratio),
                PageHasher(),
                StorageLink(env, self.spec, aggregate=aggregate),
            )
            self._stores[key] = got
        return got

    def store_for(
        self, env: simpy.Environment, index: int
    ) -> tuple[PageStore, PageHasher, StorageLink]:
        """Instance ``index``'s store, page hasher and link to it (the one store of a shared
        backend), made at the first call."""
        return self._store(env, index)

    def attach(
        self,
        env: simpy.Environment,
        index: int,
        cache: Any,
        host: PageAllocator | None,
        device_tokens: int,
    ) -> SimStorage:
        """Give instance ``index``'s cache its L3 tier (the controller and tree side of the
        cache's SGLang version); returns the driver of its stages."""
        if host is None:
            raise ValueError("an L3 storage tier needs the host tier (cache.enable_host)")
        store, hasher, link = self._store(env, index)
        ctrl: StorageController
        if isinstance(cache, HiRadixCache):
            ctrl = StorageController(
                host, store, device_tokens=device_tokens, threshold=self.prefetch_threshold,
                hasher=hasher,
            )  # fmt: skip
            cache.attach_storage(
                ctrl,
                prefetch_policy=self.prefetch_policy,
                prefetch_threshold=self.prefetch_threshold,
                timeout_base=self.timeout_base,
                timeout_per_ki_token=self.timeout_per_ki_token,
                timeout_max=self.timeout_max,
            )
        else:
            from hicache.policy.v0523.l3 import StorageAttachment
            from hicache.policy.v0523.l3_controller import StorageController0523

            ctrl = StorageController0523(
                host, store, threshold=self.prefetch_threshold, hasher=hasher
            )
            kwargs: dict[str, Any] = {
                "prefetch_policy": self.prefetch_policy,
                "prefetch_threshold": self.prefetch_threshold,
                "timeout_base": self.timeout_base,
                "timeout_per_ki_token": self.timeout_per_ki_token,
            }
            if self.host_memory_mode == "buffer_only":
                from hicache.policy.v0523.buffer_l3 import BufferStorageAttachment

                cache.set_host_memory_buffer_only()
                # max_context_len 0: request lengths come from the trace, the anchor-pin cap
                # is then half the device pool (pipeline.py:302-309; an estimate)
                cache.storage = BufferStorageAttachment(
                    cache, ctrl, device_tokens=device_tokens, **kwargs
                )
            else:
                cache.storage = StorageAttachment(cache, ctrl, **kwargs)
        return SimStorage(
            env, ctrl, self.spec, link, self.page_bytes_per_rank, self.ranks,
            write_ranks=self.write_ranks, hash_s_per_page=self.hash_s_per_page, instance=index,
            rows=self.rows,
        )  # fmt: skip

    def stores(self) -> list[tuple[PageStore, PageHasher, StorageLink]]:
        return list(self._stores.values())


def storage_summary(engine: Any, frames: dict[str, Any]) -> dict[str, Any]:
    """What the L3 tier adds to ``summary.json``: ``sglang_defects`` (always: how often this
    run would have met each SGLang 0.5.14 defect the simulator avoids; see
    ``hicache.policy.storage_tier.DEFECTS``) and, with an L3 tier, a ``storage`` block."""
    from hicache.policy.storage_tier import DEFECTS
    from hicache.policy.v0523.l3 import DEFECTS_0523

    counts: dict[str, int] = {}
    tokens: dict[str, int] = {}
    for inst in engine.instances:
        for code, n in inst.cache.defects.items():
            counts[code] = counts.get(code, 0) + n
        for code, n in inst.cache.defect_tokens.items():
            tokens[code] = tokens.get(code, 0) + n
    v0514 = all(isinstance(inst.cache, HiRadixCache) for inst in engine.instances)
    what = DEFECTS if v0514 else DEFECTS_0523
    if engine.storage is not None:
        codes = list(what)
    elif v0514:
        codes = ["L2LB"]
    else:  # SGLang 0.5.23: none of them is open on the L1/L2 path (SGLANG_0523.md §3)
        codes = []
    out: dict[str, Any] = {
        "sglang_defects": {
            c: {"count": counts.get(c, 0), "tokens": tokens.get(c, 0), "what": what[c]}
            for c in codes
        }
    }
    setup: StorageSetup | None = engine.storage
    if setup is None:
        return out
    if not v0514:
        return out | _storage_summary_0523(engine, frames, setup)
    done = measured_finished(frames["requests"])
    waits = done.loc[done["prefetch_wait_s"] > 0, "prefetch_wait_s"]
    tier: dict[str, int] = {}
    for inst in engine.instances:
        for k, v in inst.cache.storage_stats.as_dict().items():
            tier[k] = tier.get(k, 0) + v
    sims = [inst.storage for inst in engine.instances if inst.storage is not None]
    revoked = sum(inst.cache.storage.stats.revoked for inst in engine.instances)
    stores = setup.stores()
    page_tokens = setup.page_size
    out["prefetch_wait_mean_s"] = float(waits.mean()) if len(waits) else 0.0
    out["storage"] = {
        "backend": setup.spec.name,
        "shared": setup.shared,
        "prefetch_policy": setup.prefetch_policy,
        "storage_hit_tokens": int(done["storage_hit_tokens"].sum()),
        "requests_with_l3_hit": int((done["storage_hit_tokens"] > 0).sum()),
        "prefetches_issued": tier["prefetch_issued"],
        "prefetches_terminated": tier["prefetch_terminated"],
        "prefetches_revoked": revoked,
        "prefetches_aborted": tier["prefetch_aborted"],
        "prefetch_below_threshold": tier["prefetch_below_threshold"],
        "prefetch_rate_limited": tier["prefetch_rate_limited"],
        "prefetch_no_host_space": tier["prefetch_no_host_space"],
        "prefetch_truncated": tier["prefetch_truncated"],
        "prefetched_tokens": tier["prefetched_tokens_total"],
        "prefetch_duplicate_tokens": tier["prefetch_duplicate_tokens"],
        "prefetch_wait_mean_s": out["prefetch_wait_mean_s"],
        "prefetch_wait_p90_s": float(waits.quantile(0.9)) if len(waits) else 0.0,
        "requests_prefetch_waited": len(waits),
        "prefetch_tp_votes": tier["prefetch_tp_votes"],
        "backup_ops": tier["backup_ops"],
        "backed_up_tokens": tier["backuped_tokens_total"],
        **_io_totals(sims, stores, page_tokens),
    }
    return out


def measured_finished(req: Any) -> Any:
    """The finished requests of a run's request table that count in its figures: those that
    arrived after the warm-up window (``workload.warmup_s``; the ``warmup`` column marks the
    others). The per-request L3 figures (prefetch waits, L3 hit tokens) come from these, as
    every summary figure does; the tier's own counters (prefetches, bytes) stay the run's."""
    done = req[req["finish_s"] >= 0]
    if "warmup" in done.columns:
        done = done[~done["warmup"].astype(bool)]
    return done


def _io_totals(sims: list[Any], stores: list[Any], page_tokens: int) -> dict[str, Any]:
    """The stages' and stores' totals, the same under every release."""
    return {
        "bytes_read": sum(s.stats.bytes_read for s in sims),
        "bytes_written": sum(s.stats.bytes_written for s in sims),
        "pages_discarded": sum(s.stats.pages_discarded for s in sims),
        "store_tokens": sum(len(st) for st, _, _ in stores) * page_tokens,
        "store_written_tokens": sum(st.pages_written for st, _, _ in stores) * page_tokens,
        "store_skipped_tokens": sum(st.pages_skipped for st, _, _ in stores) * page_tokens,
        "store_evicted_tokens": sum(st.pages_evicted for st, _, _ in stores) * page_tokens,
        "read_busy_s": sum(s.stats.busy_s["read"] for s in sims),
        "write_busy_s": sum(s.stats.busy_s["write"] for s in sims),
        "query_busy_s": sum(s.stats.busy_s["query"] for s in sims),
    }


def _storage_summary_0523(
    engine: Any, frames: dict[str, Any], setup: StorageSetup
) -> dict[str, Any]:
    """The ``storage`` block of a 0.5.23 run: the same keys where 0.5.23 has the step, and its
    own (retries, deadlines, early insertion) beside them."""
    done = measured_finished(frames["requests"])
    waits = done.loc[done["prefetch_wait_s"] > 0, "prefetch_wait_s"]
    tier: dict[str, int] = {}
    for inst in engine.instances:
        for k, v in inst.cache.storage.stats.as_dict().items():
            tier[k] = tier.get(k, 0) + v
    sims = [inst.storage for inst in engine.instances if inst.storage is not None]
    stores = setup.stores()
    pt = setup.page_size
    mean = float(waits.mean()) if len(waits) else 0.0
    return {
        "prefetch_wait_mean_s": mean,
        "storage": {
            "backend": setup.spec.name,
            "shared": setup.shared,
            "prefetch_policy": setup.prefetch_policy,
            "sglang_version": setup.sglang_version,
            "storage_hit_tokens": int(done["storage_hit_tokens"].sum()),
            "requests_with_l3_hit": int((done["storage_hit_tokens"] > 0).sum()),
            "prefetches_issued": tier["prefetch_issued"],
            "prefetches_terminated": tier["terminated"],
            "prefetches_revoked": tier["revoked"],
            "prefetches_aborted": tier["aborted"],
            "prefetch_below_threshold": tier["prefetch_below_threshold"],
            "prefetch_rate_limited": tier["prefetch_rate_limited"],
            "prefetch_no_host_space": tier["revoked_no_host_space"],
            "prefetch_truncated": tier["hit_truncated"],
            "prefetch_revoked_below_threshold": tier["revoked_below_threshold"],
            "prefetch_deadline_expired": tier["deadline_expired"],
            "prefetch_inserted_early": tier["inserted_early"],
            "prefetch_retries_armed": tier["retries_armed"],
            "prefetch_assumed_stored": tier["prefetch_assumed_stored"],
            "prefetched_tokens": tier["loaded_from_storage"],
            "prefetch_duplicate_tokens": tier["duplicate_tokens_freed"],
            "prefetch_insert_dropped_tokens": tier["insert_dropped"],
            "prefetch_wait_mean_s": mean,
            "prefetch_wait_p90_s": float(waits.quantile(0.9)) if len(waits) else 0.0,
            "requests_prefetch_waited": len(waits),
            "prefetch_tp_votes": tier["prefetch_tp_votes"],
            "backup_ops": tier["backup_ops"],
            "backed_up_tokens": tier["backup_tokens"],
            **_io_totals(sims, stores, pt),
        },
    }
