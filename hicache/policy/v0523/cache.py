"""SGLang 0.5.23's ``UnifiedRadixCache`` controller, dense path, L1/L2
(``mem_cache/unified_radix_cache.py``): *when* to evict, back up and load back, and the acks.

The tree (:class:`~hicache.policy.v0523.tree.TreeCore`) decides *what*. The copies go through a
:class:`~hicache.policy.controller.BaseController` in ``merge_writes`` mode: a backup reserves
host pages at once and is submitted with every other queued backup by :meth:`flush_pending_backups`
(SGLang's ``write(flush=False)`` and ``start_writing``).

Method names are SGLang's. Lengths are in tokens; keys are paged tuples; values are page ids.
Differences from 0.5.14 (``hicache.policy.hiradix``) are listed in ``shared/design/SGLANG_0523.md``;
the ones that live here: eviction to an availability target, per-victim write_back with the
subtree drop, backups of unbacked ancestors, host eviction of the shortfall only, load_back that
locks the whole chain and evicts before loading.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from hicache.policy.controller import BaseController
from hicache.policy.hiradix import CacheStats
from hicache.policy.radix import to_page_key
from hicache.policy.v0523.node import UNode
from hicache.policy.v0523.tree import Match, TreeCore

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
#: ``--hicache-host-memory-mode`` (0.5.19+; arg_groups/hicache_hook.py:247-252).
HOST_MEMORY_MODES = ("cache", "buffer_only")

#: Host hits shorter than this are recomputed (``load_back_threshold``, unchanged since 0.5.14).
LOAD_BACK_THRESHOLD = 10


class _WriteThrough:
    """``_OngoingWriteThrough``: the node acked, whether it holds a device lock, and the nodes
    to publish (the node and, after splits, its fragments)."""

    __slots__ = ("locked", "node", "publish")

    def __init__(self, node: UNode, locked: bool) -> None:
        self.node = node
        self.locked = locked
        self.publish = [node]


class _LoadBack:
    __slots__ = ("anchor", "host_uuid")

    def __init__(self, anchor: UNode, host_uuid: int | None) -> None:
        self.anchor = anchor
        self.host_uuid = host_uuid


class UnifiedRadixCache:
    """The 0.5.23 cache (see the module docstring). ``controller.host is None``: no HiCache."""

    sglang_version = "0.5.23"

    def __init__(
        self,
        controller: BaseController,
        *,
        write_policy: str = "write_through",
        eviction_policy: str = "lru",
        eviction_policy_config: dict[str, Any] | None = None,
        load_back_threshold: int = LOAD_BACK_THRESHOLD,
        fast_victims: bool = True,
        host_memory_mode: str = "cache",
    ) -> None:
        """``fast_victims`` False: SGLang's per-call eviction heap instead of the proven-equal
        persistent one (:mod:`~hicache.policy.v0523.victims`). ``host_memory_mode``
        ``buffer_only``: host RAM only stages L3 copies (attach a
        :class:`~hicache.policy.v0523.buffer_l3.BufferStorageAttachment` as ``storage``);
        write_back resolves to write_through (hicache_hook.py:278-288)."""
        if host_memory_mode not in HOST_MEMORY_MODES:
            raise ValueError(
                f"unknown host memory mode {host_memory_mode!r}; choose one of "
                f"{', '.join(HOST_MEMORY_MODES)}"
            )
        self.host_memory_mode = host_memory_mode
        if host_memory_mode == "buffer_only" and write_policy == "write_back":
            write_policy = "write_through"
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"unknown write policy {write_policy!r}; choose one of {', '.join(WRITE_POLICIES)}"
            )
        self.controller = controller
        controller.merge_writes = True
        self.page_size = controller.page_size
        self.write_policy = write_policy
        self.eviction_policy = eviction_policy.lower()
        self.has_host = controller.host is not None
        self.load_back_threshold = load_back_threshold
        self.tree = TreeCore(
            self, self.page_size, eviction_policy, eviction_policy_config, fast_victims
        )
        if self.has_host:
            self.tree.enable_hicache = True
            self.tree.is_write_back = write_policy == "write_back"
            self.tree.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.ongoing_write_through: dict[int, _WriteThrough] = {}
        self.ongoing_load_back: dict[int, _LoadBack] = {}
        self.stats = CacheStats()
        """Running totals (tokens), the same fields as 0.5.14's."""
        self.storage: Any = None
        """The L3 tier (:class:`~hicache.policy.v0523.l3.StorageAttachment`), None without one."""
        self.defects: dict[str, int] = {}
        """0.5.14's defects this run met: none is open on 0.5.23's L1/L2 path
        (SGLANG_0523.md §3), so nothing is counted."""
        self.defect_tokens: dict[str, int] = {}

    @property
    def root(self) -> UNode:
        return self.tree.root

    def reset(self) -> None:
        self.tree.reset()
        self.ongoing_write_through.clear()
        self.ongoing_load_back.clear()
        if self.storage is not None:
            self.storage.reset()
        self.controller.reset()

    # -- the tree's sink -------------------------------------------------------------------
    def free_device(self, pages: list[int]) -> None:
        if pages:
            self.controller.free_device(pages)

    def free_host(self, pages: list[int]) -> None:
        if pages:
            self.controller.free_host(pages)

    def set_host_memory_buffer_only(self) -> None:
        """``--hicache-host-memory-mode buffer_only`` on a cache built in cache mode (SGLang's
        ``init_hicache`` sets it on the tree core, unified_radix_cache.py:524-525); write_back
        resolves to write_through."""
        self.host_memory_mode = "buffer_only"
        if self.write_policy == "write_back":
            self.write_policy = "write_through"
            self.tree.is_write_back = False
            self.tree.write_through_threshold = 1

    @property
    def buffer(self) -> Any:
        """The buffer-only storage attachment, None in cache mode."""
        storage = self.storage
        return storage if storage is not None and storage.buffer_only else None

    def backup(self, chain: list[UNode]) -> None:
        buffer = self.buffer
        if buffer is not None:
            buffer.pipeline.backup_chain(chain)  # nothing is host-backed (U:1681-1692)
            return
        self.execute_backup(chain)

    def pending_split(self, ack_id: int, old: UNode, new: UNode) -> None:
        """``_replace_pending_write_through_node``: ``old`` becomes ``[new, old]``."""
        pending = self.ongoing_write_through.get(ack_id)
        if pending is None or old not in pending.publish:
            return
        out: list[UNode] = []
        for n in pending.publish:
            out += [new, old] if n is old else [n]
        pending.publish = out

    # -- match / insert / locks ------------------------------------------------------------
    def match_prefix(self, key: tuple[Hashable, ...], limit: int | None = None) -> Match:
        """``match_prefix`` on the first ``limit`` pages of ``key`` (all when None)."""
        self.stats.match_calls += 1
        return self.tree.match_prefix(key, limit)

    def insert(
        self,
        key: tuple[Hashable, ...],
        value: list[int],
        *,
        prev_prefix_len: int = 0,
        inserted_len: int = 0,
        priority: int = 0,
        hint: UNode | None = None,
        key_end: int = -1,
    ) -> tuple[int, UNode]:
        """``insert(InsertParams)``: returns ``(prefix_len, last_device_node)``. ``hint``: a node
        on ``key``'s path that the walk may follow without comparing keys (``TreeCore.insert``);
        ``key_end`` >= 0: the key is ``key[:key_end]``."""
        self.stats.insert_calls += 1
        tree = self.tree
        buffer = self.buffer
        if buffer is None:
            return tree.insert(key, value, prev_prefix_len, inserted_len, priority, hint, key_end)
        buffer.pipeline.begin_insert_walk()  # a node is admitted once per walk
        try:
            return tree.insert(key, value, prev_prefix_len, inserted_len, priority, hint, key_end)
        finally:
            buffer.pipeline.end_insert_walk()

    def touch_prefix(self, key: tuple[Hashable, ...]) -> None:
        """``touch_prefix`` (the waiting-queue refresh): the match walk of the whole key --
        splits and recency stamps -- with nothing returned, locked or counted."""
        self.tree.match_prefix(key, None)

    def inc_lock_ref(self, node: UNode) -> int:
        return self.tree.inc_lock_ref(node)

    def dec_lock_ref(self, node: UNode) -> None:
        self.tree.dec_lock_ref(node)

    def evictable_size(self) -> int:
        """Tokens on device in unlocked nodes (``evictable_size()``)."""
        return self.tree.evictable_size

    def protected_size(self) -> int:
        """Tokens on device in locked nodes (``protected_size()``)."""
        return self.tree.protected_size

    def total_size(self) -> int:
        return self.tree.evictable_size + self.tree.protected_size

    # -- what the timed scheduler reads (the same names as HiRadixCache's) -----------------
    def now(self) -> float:
        """The tree's logical clock (``get_and_increase_time_counter``'s next value)."""
        return self.tree._time

    def peek_prefix(self, key: Sequence[Hashable], limit: int | None = None) -> tuple[int, int]:
        """``(device tokens, host-only tokens)`` of ``key``'s cached prefix (``limit`` tokens at
        most), read-only: not in SGLang; what the tier-aware router asks. Walks as
        :meth:`match_prefix` (stopping at a dead node) but touches, splits and counts nothing."""
        pkey = to_page_key(key, self.page_size)
        n = len(pkey) if limit is None else min(len(pkey), limit // self.page_size)
        return self.tree.peek(pkey, n)

    # -- eviction --------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """``evict(EvictParams(num_tokens))``: evict until ``num_tokens`` are freed."""
        return self._evict(num_tokens, None)

    def evict_for_alloc(self, num_tokens: int) -> int:
        """``evict_for_alloc``: ``num_tokens`` is the allocator's shortfall; the walk runs until
        the allocator has that much more available than now."""
        if num_tokens <= 0:
            return self._evict(num_tokens, None)
        return self._evict(num_tokens, self.controller.device.available_size() + num_tokens)

    def _evict(self, request: int, target: int | None) -> int:
        self.stats.evict_calls += 1
        freed = self._evict_walk(request, target)
        if self.tree.is_write_back:
            self.writing_check(write_back=True)
        self.stats.device_evicted_tokens += freed
        return freed

    def _evict_walk(self, request: int, target: int | None) -> int:
        """``_evict_components`` for FULL: one heap over the device leaves, a parent pushed
        when the last victim made it a leaf, victims until ``request`` tokens are freed or,
        with a ``target``, until the pool has ``target`` available; returns the tokens freed."""
        tree = self.tree
        device = self.controller.device
        to_target = request > 0 and target is not None
        if (target is not None and device.available_size() >= target) or (
            not to_target and request <= 0
        ):
            return 0
        quota = max(request, tree.evictable_size) if to_target else request
        victims = tree.victims
        victims.begin()
        freed = 0
        last: UNode | None = None
        try:
            while freed < quota:
                if last is not None and last.parent in tree.device_leaves:
                    victims.push_parent(last.parent)
                last = victims.pop()
                if last is None:
                    break
                freed += self._evict_leaf(last)
                if target is not None and device.available_size() >= target:
                    break
        finally:
            victims.end()
        return freed

    def _evict_leaf(self, x: UNode) -> int:
        """``evict_device_leaf`` and, under write_back, the deferred demote or the drop;
        returns the device tokens freed."""
        tree = self.tree
        assert tree.is_device_leaf(x)
        st = self.stats
        if x.host_value is not None:
            n = tree.demote(x)
            st.device_demoted_tokens += n
            return n
        if not tree.is_write_back:
            n = tree.delete_unbacked_leaf(x)
            st.device_deleted_tokens += n
            return n
        written = self.execute_backup([x], write_back=True)
        if written > 0:
            st.write_back_tokens += written
            self.writing_check(write_back=True)
            n = tree.demote(x)
            st.device_demoted_tokens += n
            return n
        st.backup_failures += 1
        dropped = tree.drop_subtree_no_host(x)
        if dropped is None:
            return 0
        st.device_deleted_tokens += dropped
        return dropped

    def evict_host(self, num_tokens: int) -> int:
        """``evict_host``: free host pages (duplicates first under write_back)."""
        self.stats.evict_host_calls += 1
        if self.host_memory_mode == "buffer_only":
            return 0  # staging is operation-owned: nothing to evict (U:1433-1441)
        freed = self.tree.drive_host_eviction(num_tokens)
        self.stats.host_evicted_tokens += freed
        return freed

    # -- backups ---------------------------------------------------------------------------
    def execute_backup(self, chain: list[UNode], write_back: bool = False) -> int:
        """``_execute_and_commit_kv_backup``: back up the chain parent first, stopping at the
        first failure (0); returns the tokens of the last backup."""
        written = 0
        ctrl = self.controller
        host = ctrl.host
        assert host is not None
        for node in chain:
            assert node.value is not None
            if node.host_value is not None:
                continue
            need = len(node.value) * self.page_size
            avail = host.available_size()
            if avail < need and self.evict_host(need - avail) < need - avail:
                return 0
            host_pages = ctrl.write(node.value, node.id)
            if host_pages is None:
                return 0
            node.host_value = host_pages
            locked = False
            if not write_back:
                self.tree.inc_lock_ref(node)
                locked = True
            assert node.write_through_pending_id in (None, node.id)
            node.write_through_pending_id = node.id
            self.ongoing_write_through[node.id] = _WriteThrough(node, locked)
            written = len(host_pages) * self.page_size
        return written

    def _finish_write_through_ack(self, ack_id: int) -> None:
        pending = self.ongoing_write_through.pop(ack_id)
        for n in pending.publish:
            if n.write_through_pending_id == ack_id:
                n.write_through_pending_id = None
                self.tree.update_duplicate(n)
        if pending.locked:
            self.tree.dec_lock_ref(pending.node)
        storage = self.storage
        if storage is not None:
            # each fragment: after a split the acked node holds only the suffix
            for n in pending.publish:
                storage.write_backup_storage(n)

    def flush_pending_backups(self) -> None:
        """Submit the queued backups as one merged op (once per batch result)."""
        self.controller.start_writing()

    def writing_check(self, write_back: bool = False) -> None:
        """Process finished write acks; ``write_back``: submit what is queued and wait for all."""
        if write_back:
            self.controller.start_writing()
            for ack_id in self.controller.wait_writes():
                if ack_id in self.ongoing_write_through:
                    self._finish_write_through_ack(ack_id)
            assert not self.ongoing_write_through
            return
        buffer = self.buffer
        for ack_id in self.controller.pop_completed_writes():
            if buffer is not None and buffer.pipeline.owns_write_ack(ack_id):
                buffer.pipeline.finish_backup_ack(ack_id)
                continue
            self._finish_write_through_ack(ack_id)

    # -- load back -------------------------------------------------------------------------
    def load_back(self, anchor: UNode) -> bool:
        """``load_back`` (no memory quota: the scheduler passes none)."""
        tree = self.tree
        self.stats.load_back_calls += 1
        uuid = tree.inc_host_lock_ref(anchor)
        tree.inc_lock_ref(anchor)
        nodes = tree.load_back_chain(anchor)
        host_pages: list[int] = []
        for n in nodes or ():
            host_pages += n.host_value  # type: ignore[arg-type]
        kv_tokens = len(host_pages) * self.page_size
        if kv_tokens < max(1, self.load_back_threshold):
            tree.dec_lock_ref(anchor)
            tree.dec_host_lock_ref(anchor, uuid)
            return False
        device = self.controller.device
        if device.available_size() < kv_tokens:
            self.evict_for_alloc(kv_tokens - device.available_size())
            if device.available_size() < kv_tokens:
                self.stats.load_back_failures += 1
                tree.dec_lock_ref(anchor)
                tree.dec_host_lock_ref(anchor, uuid)
                return False
        pages = self.controller.load(host_pages, anchor.id)
        tree.dec_lock_ref(anchor)
        if pages is None:
            self.stats.load_back_failures += 1
            tree.dec_host_lock_ref(anchor, uuid)
            return False
        self.stats.loaded_tokens += kv_tokens
        tree.commit_load_back(anchor, nodes or [], pages)
        tree.inc_lock_ref(anchor)
        self.ongoing_load_back[anchor.id] = _LoadBack(anchor, uuid)
        return True

    def init_load_back(
        self, best: UNode, host_hit_length: int, last_device: UNode
    ) -> tuple[int, UNode]:
        """``init_load_back``: load if the best match is evicted or has a host hit; returns
        ``(loaded tokens, node to lock)``."""
        if (best.evicted or host_hit_length > 0) and self.load_back(best):
            loaded = self.tree.path_device_pages(best, last_device)
            if not loaded:
                return 0, last_device
            return len(loaded) * self.page_size, best
        return 0, last_device

    def ready_to_load_host_cache(self) -> int:
        return self.controller.start_loading()

    def loading_check(self) -> None:
        buffer = self.buffer
        for ids in self.controller.pop_completed_loads():
            for ack_id in ids:
                if buffer is not None and buffer.finish_load_back(ack_id):
                    continue
                lb = self.ongoing_load_back.pop(ack_id)
                self.tree.dec_lock_ref(lb.anchor)
                self.tree.dec_host_lock_ref(lb.anchor, lb.host_uuid)
                self.tree.finish_load_back(lb.anchor)

    def check_hicache_events(self) -> None:
        """Per scheduler step: submit queued backups, then process finished acks, then (L3)
        the storage queues, as long as each was when the step began."""
        self.flush_pending_backups()
        storage = self.storage
        sizes = storage.queue_sizes() if storage is not None else None
        self.writing_check()
        self.loading_check()
        if storage is not None:
            storage.drain(sizes)
            if storage.buffer_only:
                storage.pipeline.flush_pending_writes()  # U:3699-3700
