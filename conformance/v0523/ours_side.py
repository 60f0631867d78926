"""Our side of the 0.5.23 check: :class:`hicache.policy.v0523.UnifiedRadixCache` behind the
adapter API that ``sglang_side.RealUnifiedCache`` offers for the real class.

Node handles are token paths from the root (a tuple of ints; the root is ``()``), so results
compare across implementations. Pools: a FIFO free list of page ids on both tiers (the rule of
``conformance/v0523/pools.py``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from hicache.policy import ManualController, PageAllocator
from hicache.policy.radix import to_page_key
from hicache.policy.storage import PageHasher, PageStore
from hicache.policy.v0523 import UnifiedRadixCache, UNode
from hicache.policy.v0523.buffer_l3 import BufferStorageAttachment
from hicache.policy.v0523.l3 import StorageAttachment, prefetch_kvcache
from hicache.policy.v0523.l3_controller import StorageController0523

Path = tuple[int, ...]


class RecordingHasher(PageHasher):
    """Our page keys, remembering each key's token prefix (so stored pages compare across
    implementations as prefixes)."""

    def __init__(self, page_size: int) -> None:
        super().__init__()
        self.page_size = page_size
        self.prefix: dict[int, tuple[int, ...]] = {0: ()}

    def chain(self, last: int, symbols: Any) -> list[int]:
        out = super().chain(last, symbols)
        before = self.prefix[last]
        for k, sym in zip(out, symbols, strict=True):
            before = before + tuple(_flat((sym,), self.page_size))
            self.prefix.setdefault(k, before)
        return out


def _flat(key: tuple[Hashable, ...], page_size: int) -> list[int]:
    if page_size == 1:
        return [int(t) for t in key]  # type: ignore[call-overload]
    out: list[int] = []
    for page in key:
        out += list(page)  # type: ignore[call-overload]
    return out


class OursUnifiedCache:
    """The adapter (see the module docstring)."""

    name = "ours"

    def __init__(
        self,
        *,
        page_size: int,
        device_pages: int,
        host_pages: int,
        write_policy: str,
        eviction_policy: str,
        core: str = "ours",
        eviction_policy_config: dict[str, Any] | None = None,
        fast_victims: bool = True,
        l3: dict[str, Any] | None = None,
        host_memory_mode: str = "cache",
    ) -> None:
        """``l3``: attach the storage tier (keys ``prefetch_policy``, ``threshold``,
        ``batch_pages``, ``timeout_base``, ``timeout_per_ki_token``); ``host_memory_mode``
        ``buffer_only``: the buffer-mode attachment (``buffer_l3.BufferStorageAttachment``)."""
        self.page_size = page_size
        self.device = PageAllocator(device_pages, page_size, name="device")
        self.host = PageAllocator(host_pages, page_size, name="host") if host_pages else None
        self.ctrl = ManualController(self.device, self.host)
        self.cache = UnifiedRadixCache(
            self.ctrl,
            write_policy=write_policy,
            eviction_policy=eviction_policy,
            eviction_policy_config=eviction_policy_config,
            fast_victims=fast_victims,
            host_memory_mode=host_memory_mode,
        )
        self._locks: dict[int, UNode] = {}
        self._next_lock = 0
        self.l3: StorageAttachment | None = None
        if l3 is not None:
            assert self.host is not None
            self.hasher = RecordingHasher(page_size)
            sc = StorageController0523(
                self.host,
                PageStore(),
                threshold=l3["threshold"],
                hasher=self.hasher,
                batch_pages=l3["batch_pages"],
            )
            kw: dict[str, Any] = dict(
                prefetch_policy=l3["prefetch_policy"],
                prefetch_threshold=l3["threshold"],
                timeout_base=l3["timeout_base"],
                timeout_per_ki_token=l3["timeout_per_ki_token"],
            )
            if host_memory_mode == "buffer_only":
                self.l3 = BufferStorageAttachment(
                    self.cache, sc, device_tokens=device_pages * page_size, **kw
                )
            else:
                self.l3 = StorageAttachment(self.cache, sc, **kw)
            self.cache.storage = self.l3
        self._plans: dict[str, Any] = {}

    # -- helpers ---------------------------------------------------------------------------
    def path(self, node: UNode) -> Path:
        parts: list[list[int]] = []
        cur: UNode | None = node
        while cur is not None and cur.parent is not None:
            parts.append(_flat(cur.key, self.page_size))
            cur = cur.parent
        out: list[int] = []
        for p in reversed(parts):
            out += p
        return tuple(out)

    def node_at(self, path: Path) -> UNode:
        key = to_page_key(list(path), self.page_size)
        node = self.cache.root
        off = 0
        while off < len(key):
            ck = key[off]
            node = node.children[ck]
            off += len(node.key)
        if off != len(key):
            raise KeyError(f"no node ends at {path}")
        return node

    def _key(self, tokens: list[int], limit: int | None) -> tuple[Hashable, ...]:
        if limit is not None:
            tokens = tokens[:limit]
        return to_page_key(tokens, self.page_size)

    # -- pools -----------------------------------------------------------------------------
    def alloc_device(self, num_pages: int) -> list[int] | None:
        return self.device.alloc_pages(num_pages)

    def free_device(self, pages: list[int]) -> None:
        self.device.free_distinct(list(pages))

    # -- cache calls -----------------------------------------------------------------------
    def match(self, tokens: list[int], limit: int | None = None) -> dict[str, Any]:
        m = self.cache.match_prefix(self._key(tokens, limit))
        return {
            "device_pages": list(m.device_pages),
            "host_hit": m.host_hit_length,
            "last_device": self.path(m.last_device),
            "best": self.path(m.best),
        }

    def touch(self, tokens: list[int]) -> None:
        self.cache.touch_prefix(self._key(tokens, None))

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        *,
        prev_prefix_len: int,
        inserted_len: int,
        priority: int,
    ) -> dict[str, Any]:
        key = to_page_key(tokens, self.page_size)
        plen, last = self.cache.insert(
            key,
            list(pages[: len(key)]),
            prev_prefix_len=prev_prefix_len,
            inserted_len=inserted_len,
            priority=priority,
        )
        return {"prefix_len": plen, "last_device": self.path(last)}

    def lock(self, path: Path) -> int:
        node = self.node_at(path)
        self.cache.inc_lock_ref(node)
        self._next_lock += 1
        self._locks[self._next_lock] = node
        return self._next_lock

    def unlock(self, handle: int) -> None:
        self.cache.dec_lock_ref(self._locks.pop(handle))

    def evict_for_alloc(self, num_tokens: int) -> int:
        return self.cache.evict_for_alloc(num_tokens)

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(num_tokens)

    def evict_host(self, num_tokens: int) -> int:
        return self.cache.evict_host(num_tokens)

    def init_load_back(self, tokens: list[int], limit: int | None = None) -> tuple[list[int], Path]:
        m = self.cache.match_prefix(self._key(tokens, limit))
        loaded, node = self.cache.init_load_back(m.best, m.host_hit_length, m.last_device)
        pages = self.cache.tree.path_device_pages(node, m.last_device) if loaded else []
        return pages, self.path(node)

    def flush_pending_backups(self) -> None:
        self.cache.flush_pending_backups()

    def writing_check(self, write_back: bool = False) -> None:
        self.cache.writing_check(write_back=write_back)

    def loading_check(self) -> None:
        self.cache.loading_check()

    def check_hicache_events(self) -> None:
        self.cache.check_hicache_events()

    def ready_to_load(self) -> int:
        return self.cache.ready_to_load_host_cache()

    def finish_writes(self, count: int | None) -> int:
        return self.ctrl.complete_writes(count)

    def finish_loads(self, count: int | None) -> int:
        return self.ctrl.complete_loads(count)

    # -- L3 --------------------------------------------------------------------------------
    def prefetch(
        self, rid: str, tokens: list[int], limit: int, now: float, storage_hit_end: int | None
    ) -> dict[str, Any]:
        """The scheduler's ``_prefetch_kvcache``: its match, then the prefetch; returns the
        match and the matched length."""
        assert self.l3 is not None
        key = self._key(tokens, limit)
        m = self.cache.match_prefix(key)
        matched = prefetch_kvcache(self.l3, rid, key, m, limit, now, storage_hit_end)
        return {"best": self.path(m.best), "matched": matched}

    def check_prefetch(self, rid: str, now: float) -> bool:
        assert self.l3 is not None
        return self.l3.check_prefetch_progress(rid, now)

    def pop_span(self, rid: str) -> tuple[int, int | None]:
        assert self.l3 is not None
        return self.l3.pop_prefetch_loaded_span(rid)

    def finish_admission(self, rid: str) -> None:
        assert self.l3 is not None
        self.l3.finish_admission(rid)

    def abort(self, rid: str) -> None:
        assert self.l3 is not None
        self.l3.release_aborted_request(rid)

    def retry_pass(self, waiting: list[Any], interval: int, max_attempts: int) -> list[Any]:
        assert self.l3 is not None
        return [
            (r.rid, end) for r, end in self.l3.retries.pop_ready(waiting, interval, max_attempts)
        ]

    def cancel_retry(self, rid: str) -> None:
        assert self.l3 is not None
        self.l3.retries.cancel(rid)

    def query_step(self) -> bool:
        """One query call, and the ops before it that need none; True if any op moved."""
        assert self.l3 is not None
        c = self.l3.ctrl
        before = len(c.prefetch_hit_queue)
        c.run_query()
        return len(c.prefetch_hit_queue) != before

    def read_step(self) -> bool:
        """One read call, and the ops before it that need none; True if anything moved."""
        assert self.l3 is not None
        c = self.l3.ctrl
        before = len(c.ack_prefetch_queue)
        c.run_read()
        return len(c.ack_prefetch_queue) != before

    def backup_step(self) -> bool:
        assert self.l3 is not None
        return self.l3.ctrl.run_write()

    def l3_put(self, tokens: list[int]) -> None:
        assert self.l3 is not None
        key = to_page_key(tokens[: len(tokens) - len(tokens) % self.page_size], self.page_size)
        self.l3.ctrl.store.set(self.hasher.chain(0, key))

    # -- buffer_only admission -----------------------------------------------------------
    def prepare_staged(self, rid: str, m: dict[str, Any]) -> dict[str, Any]:
        """``BufferModePipeline.prepare_staged_prefetch`` on the request's match ``m``: whether
        it may go on (``ready``), its device prefix after it (pages, node) and its host hit
        (the staged tokens past that prefix; 0 = nothing to load)."""
        a = self.l3
        assert isinstance(a, BufferStorageAttachment)
        ps = self.page_size
        plan = a.prepare_staged(rid, len(m["device_pages"]) * ps)
        self._plans.pop(rid, None)
        if plan is False:
            return {"ready": False}
        if plan is None:
            return {"ready": True, "device_pages": list(m["device_pages"]),
                    "last_device": m["last_device"], "host_hit": 0}  # fmt: skip
        assert not isinstance(plan, bool)
        self._plans[rid] = (plan, m["best"])
        pages = self.cache.tree.path_device_pages(plan.node, self.cache.root)
        return {
            "ready": True,
            "device_pages": pages[: plan.device_prefix_len // ps],
            "last_device": self.path(plan.node),
            "host_hit": plan.full_tokens,
        }

    def defer_staged(self, rid: str) -> None:
        """``defer_staged_admission`` (an idle admission budget refused the request)."""
        a = self.l3
        assert isinstance(a, BufferStorageAttachment)
        if self._plans.pop(rid, None) is not None:
            a.defer_staged(rid)

    def staged_load_back(self, rid: str) -> tuple[list[int], Path] | None:
        """``add_one_req``'s load-back of a planned request: under the admission's locks
        (``_lock_node(req.last_node)`` around ``_lock_node(best_match_node, lock_host=True)``),
        ``init_load_back``; None: deferred (``AddReqResult.OTHER``)."""
        a = self.l3
        assert isinstance(a, BufferStorageAttachment)
        plan, best_path = self._plans.pop(rid)
        tree = self.cache.tree
        outer = plan.node
        best = self.node_at(best_path)
        tree.inc_lock_ref(outer)
        uuid = tree.inc_host_lock_ref(best)
        tree.inc_lock_ref(best)
        try:
            got = a.init_load_back_staged(rid, plan)
        finally:
            tree.dec_lock_ref(best)
            tree.dec_host_lock_ref(best, uuid)
            tree.dec_lock_ref(outer)
        if got is None:
            return None
        n, node = got
        pages = tree.path_device_pages(node, self.cache.root)
        return pages[len(pages) - n // self.page_size :], self.path(node)

    def _key_prefix(self, k: Any) -> Any:
        return self.hasher.prefix.get(k, "?")

    def buffer_state(self) -> dict[str, Any]:
        a = self.l3
        assert isinstance(a, BufferStorageAttachment)
        pl, kp = a.pipeline, self._key_prefix
        live = self.cache.tree.nodes

        def p(node: UNode) -> Path | None:
            return self.path(node) if live.get(node.id) is node else None

        def launched(e: Any) -> tuple[Any, ...]:
            return (p(e.intent.node), e.host_pages, e.units, [kp(k) for k in e.intent.keys])

        return {
            "pending_writes": [
                (p(s.node), s.key_len * self.page_size, len(s.keys), p(s.parent))
                for s in pl.pending
            ],
            "inflight_nodes": sorted(self.path(live[i]) for i in pl.inflight if i in live),
            "inflight_gone": sum(1 for i in pl.inflight if i not in live),
            "backlog_tokens": pl.write_backlog_tokens,
            "staged_write_tokens": pl.write_staged_tokens,
            "d2h": sorted((ack, *launched(e)) for ack, e in pl.ongoing_write_through.items()),
            "storage_writes": sorted((launched(e) for e in pl.ongoing_backup.values()), key=repr),
            "believed": [kp(k) for k in pl.beliefs.entries],
            "believed_inflight": sorted((kp(k), n) for k, n in pl.beliefs.inflight.items()),
            "parked": [op.rid for op in a.pending_hit_allocs],
            "prefix_ctx": sorted((r, len(k) * self.page_size) for r, k in a.prefix_ctx.items()),
            "staged": sorted(
                (
                    r,
                    f.matched_len,
                    f.num_tokens,
                    f.occupied,
                    f.host_pages,
                    [kp(k) for k in f.hash_values],
                )
                for r, f in a.staged.items()
            ),
            "defers": sorted(a.staged_defers.items()),
            "load_backs": sorted(
                (lb.rid, lb.num_tokens, lb.occupied, lb.host_pages, lb.device_pages)
                for lb in a.ongoing_load_back.values()
            ),
            "anchor_locks": sorted((r, self.path(n), t) for r, (n, t) in a.anchor_locks.items()),
            "anchor_locked_tokens": a.anchor_locked_tokens,
        }

    def _live_path(self, node: UNode) -> Path | None:
        """The node's path, None once it left the tree (as a stale node id reads on the
        SGLang side: a buffer-mode anchor holds no lock and may be evicted)."""
        return self.path(node) if self.cache.tree.nodes.get(node.id) is node else None

    def l3_state(self) -> dict[str, Any]:
        a = self.l3
        assert a is not None
        c, ps = a.ctrl, self.page_size
        release: list[int] = []
        for x in c.host_mem_release_queue:
            release += x
        return {
            "ongoing_prefetch": sorted(
                (
                    rid,
                    self._live_path(i.anchor),
                    i.tokens,
                    i.host_pages,
                    i.op.completed_tokens,
                    i.op.terminated,
                    i.op.storage_hit_count,
                )
                for rid, i in a.ongoing_prefetch.items()
            ),
            "occupied": c.prefetch_tokens_occupied,
            "query_queue": [(op.rid, len(op.symbols) * ps) for op in c.prefetch_queue],
            "hit_queue": [(op.rid, op.storage_hit_count) for op in c.prefetch_hit_queue],
            "read_queue": [
                (op.rid, op.read_pages, c.read_progress(op)) for op in c.prefetch_buffer
            ],
            "ack_queue": [
                (k.op.rid, k.completed_tokens, k.completed_req) for k in c.ack_prefetch_queue
            ],
            "backup_queue": [(len(op.hash_value), op.done_pages) for op in c.backup_queue],
            "ack_backup": len(c.ack_backup_queue),
            "ongoing_backup": sorted(self.path(n) for n, _ in a.ongoing_backup.values()),
            "release_queue": release,
            "waits": sorted(
                (rid, w.started_at, w.timeout_s, w.expired) for rid, w in a.waits.items()
            ),
            "retries": sorted(
                (rid, r.immediate, r.storage_hit_end, r.due_step)
                for rid, r in a.retries.pending.items()
            ),
            "retry_step": a.retries.step,
            "loaded": sorted(a.loaded_tokens.items()),
            "loaded_start": sorted(a.loaded_start.items()),
            "store_pages": len(c.store),
        }

    def coverage(self) -> dict[str, int]:
        """What this sequence exercised (counts, for the run's report)."""
        st = self.cache.stats
        extra: dict[str, int] = {}
        if self.l3 is not None:
            extra = {f"l3_{k}": v for k, v in self.l3.stats.as_dict().items()}
            extra.update({f"l3_{k}": v for k, v in vars(self.l3.ctrl.counts).items()})
        return extra | {
            "load_backs": st.load_back_calls,
            "tokens_loaded": st.loaded_tokens,
            "load_back_failures": st.load_back_failures,
            "demoted_tokens": st.device_demoted_tokens,
            "deleted_tokens": st.device_deleted_tokens,
            "write_back_tokens": st.write_back_tokens,
            "write_back_drops": st.backup_failures,
            "host_evicted_tokens": st.host_evicted_tokens,
            "write_ops": self.ctrl.write_ops,
        }

    # -- state -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        nodes: list[dict[str, Any]] = []

        def walk(node: UNode) -> None:
            kids = sorted(node.children.values(), key=lambda c: _flat(c.key, self.page_size))
            for c in kids:
                nodes.append(
                    {
                        "path": self.path(c),
                        "tokens": _flat(c.key, self.page_size),
                        "device": None if c.value is None else list(c.value),
                        "host": None if c.host_value is None else list(c.host_value),
                        "lock_ref": c.lock_ref,
                        "host_lock_ref": c.host_lock_ref,
                        "hit_count": c.hit_count,
                        "priority": c.priority,
                        "last_access": c.last_access_time,
                        "creation": c.creation_time,
                    }
                )
                walk(c)

        walk(self.cache.root)
        live = self.cache.tree.nodes

        def p(node_id: int) -> Path | None:
            node = live.get(node_id)
            return None if node is None else self.path(node)

        def ids(op: Any) -> list[int]:
            return [op.node_id] if op.node_ids is None else list(op.node_ids)

        ctrl = self.ctrl
        out: dict[str, Any] = {} if self.l3 is None else {"l3": self.l3_state()}
        if isinstance(self.l3, BufferStorageAttachment):
            out["buffer"] = self.buffer_state()
        return out | {
            "nodes": nodes,
            "root_lock_ref": self.cache.root.lock_ref,
            "evictable_size": self.cache.evictable_size(),
            "protected_size": self.cache.protected_size(),
            "device_free": self.device.free_pages_snapshot(),
            "host_free": [] if self.host is None else self.host.free_pages_snapshot(),
            "write_queue": [[p(op.node_id)] for op in ctrl.pending_writes],
            "writes_in_flight": [[p(i) for i in ids(op)] for op in ctrl.write_queue],
            "writes_done": [op.done for op in ctrl.write_queue],
            "load_queue": [[p(op.node_id)] for op in ctrl.pending_loads],
            "loads_in_flight": [[p(i) for i in b.node_ids] for b in ctrl.load_queue],
            "loads_done": [b.done for b in ctrl.load_queue],
            "ongoing_write_through": [
                (p(ack_id), sorted(self.path(n) for n in wt.publish))
                for ack_id, wt in self.cache.ongoing_write_through.items()
            ],
            "ongoing_load_back": [p(i) for i in self.cache.ongoing_load_back],
        }
