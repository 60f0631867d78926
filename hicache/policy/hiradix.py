"""HiRadixCache: SGLang 0.5.14's two-tier (device + host) radix cache, decision for decision.

Method names and meanings follow ``python/sglang/srt/mem_cache/hiradix_cache.py`` so that each one
maps to its SGLang counterpart (see ``shared/design/POLICY_CORE.md`` §2 for the behaviour). Two
things differ on purpose:

* Time is a logical clock: every node touch takes the next tick, in SGLang's touch order, so LRU
  order never depends on wall time or on the iteration order of a ``set``.
* ``evict`` / ``evict_host`` keep a lazily invalidated heap across calls instead of heapifying
  every evictable leaf at each call. Keys never change during one eviction, so popping the
  smallest *valid* entry gives exactly the order of SGLang's per-call heap (the argument is in
  :meth:`HiRadixCache.evict`).

One 0.5.14 defect is deliberately not reproduced: a write_back eviction demotes, at its end, only
the written nodes that are still in the tree (see :meth:`HiRadixCache.evict`).

With ``controller.host is None`` the cache is SGLang's plain ``RadixCache`` (no host tier): every
non-chunked insert counts a hit, nothing is written, evicted leaves are deleted.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from hicache.policy.controller import TransferController
from hicache.policy.eviction import KeyFn, get_strategy
from hicache.policy.radix import TreeNode, child_key, key_source, match_len, to_page_key
from hicache.policy.shortcuts import Shortcuts
from hicache.policy.storage import StorageController
from hicache.policy.storage_tier import StorageTier

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")

#: Host hits shorter than this many tokens are recomputed rather than loaded (hard-coded in SGLang).
LOAD_BACK_THRESHOLD = 10


class MatchResult:
    """What ``match_prefix`` returns (SGLang's ``MatchResult``).

    ``device_indices`` is assembled from the matched nodes' page lists on first use, so callers
    that only need lengths or a slice (``device_slice``) do not pay for a full copy.
    """

    __slots__ = (
        "_indices",
        "_segments",
        "best_match_node",
        "device_pages",
        "host_hit_length",
        "last_device_node",
        "last_host_node",
        "page_size",
    )

    def __init__(
        self,
        segments: list[list[int]],
        device_pages: int,
        last_device_node: TreeNode,
        last_host_node: TreeNode,
        host_hit_length: int,
        page_size: int,
    ) -> None:
        self._segments = segments
        self._indices: list[int] | None = None
        self.device_pages = device_pages
        """Number of device-resident matched pages."""
        self.last_device_node = last_device_node
        """Deepest device-resident node on the matched path (root if none)."""
        self.last_host_node = last_host_node
        """Deepest backed-up node on the matched path (root if none)."""
        self.best_match_node = last_host_node
        """Equal to ``last_host_node`` (the node to pass to ``init_load_back``)."""
        self.host_hit_length = host_hit_length
        """Tokens matched on host-only (evicted) nodes below ``last_device_node``."""
        self.page_size = page_size

    @property
    def device_indices(self) -> list[int]:
        """Device page ids of the device-resident matched prefix, in order."""
        if self._indices is None:
            out: list[int] = []
            for seg in self._segments:
                out += seg
            self._indices = out
        return self._indices

    def device_slice(self, start: int, stop: int) -> list[int]:
        """``device_indices[start:stop]`` (in pages) without assembling the whole list."""
        if self._indices is not None:
            return self._indices[start:stop]
        out: list[int] = []
        pos = 0
        for seg in self._segments:
            end = pos + len(seg)
            if end > start and pos < stop:
                out += seg[max(0, start - pos) : stop - pos]
            pos = end
            if pos >= stop:
                break
        return out

    @property
    def device_hit_length(self) -> int:
        return self.device_pages * self.page_size


@dataclass
class CacheStats:
    """Running totals in tokens (reset by ``reset``)."""

    device_evicted_tokens: int = 0
    """Tokens removed from the device by ``evict`` (demoted + deleted)."""
    device_demoted_tokens: int = 0
    """Tokens demoted to host-only (their host copy survives)."""
    device_deleted_tokens: int = 0
    """Tokens deleted from the tree by device eviction (no host copy)."""
    write_back_tokens: int = 0
    """Tokens written by write_back evictions."""
    host_evicted_tokens: int = 0
    loaded_tokens: int = 0
    load_back_failures: int = 0
    """``load_back`` calls that could not get device pages even after evicting."""
    backup_failures: int = 0
    """``write_backup`` calls whose host allocation failed even after ``evict_host``."""
    match_calls: int = 0
    insert_calls: int = 0
    evict_calls: int = 0
    evict_host_calls: int = 0
    load_back_calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _WriteRecord:
    """An in-flight device->host write: the lock holder, its length and the nodes to publish."""

    __slots__ = ("backup_len", "lock_node", "publish_nodes")

    def __init__(self, lock_node: TreeNode, backup_len: int) -> None:
        self.lock_node = lock_node
        self.backup_len = backup_len
        self.publish_nodes = [lock_node]


HeapEntry = tuple[Any, int, TreeNode]


class HiRadixCache(Shortcuts, StorageTier):
    """The policy core. See the module docstring and POLICY_CORE.md §2.

    Keys are token sequences (page-aligned on entry) or :class:`~hicache.policy.radix.PageKey` s.
    Values are device page ids, one per page of the key. Lengths in results are in tokens.
    """

    def __init__(
        self,
        controller: TransferController,
        *,
        write_policy: str = "write_through",
        eviction_policy: str | KeyFn = "lru",
        load_back_threshold: int = LOAD_BACK_THRESHOLD,
        volatile_keys: bool = False,
    ) -> None:
        """``volatile_keys``: the eviction key of a node may change without a touch (e.g. an
        offline oracle keyed on the trace position); the heaps are then rebuilt at every call,
        exactly as SGLang does, instead of being kept across calls."""
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"unknown write policy {write_policy!r}; choose one of {', '.join(WRITE_POLICIES)}"
            )
        self.controller = controller
        self.page_size = controller.page_size
        self.write_policy = write_policy
        self.has_host = controller.host is not None
        self.eviction_policy = eviction_policy if isinstance(eviction_policy, str) else "custom"
        self._key: KeyFn = (
            get_strategy(eviction_policy) if isinstance(eviction_policy, str) else eviction_policy
        )
        self.write_through_threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = load_back_threshold
        # without a host tier the write policy is moot: plain RadixCache (hits always counted,
        # unbacked leaves deleted on eviction)
        self._write_back = write_policy == "write_back" and self.has_host
        self._volatile_keys = volatile_keys
        self._clock = 0
        self._hseq = 0
        self.storage: StorageController | None = None  # the L3 tier (attach_storage)
        self._init_storage_state()
        self._lb_pins: set[TreeNode] | None = None  # chain pinned by a nested load_back evict
        self._init_tree()

    # ------------------------------------------------------------------ state and bookkeeping --
    def _init_tree(self) -> None:
        self._next_node_id = 0
        self.splits = 0  # nodes split so far (a path recorded since is still whole if unchanged)
        self.root = self._new_node(priority=-(2**63))
        self.root.value = []
        self.root.host_value = []
        self.root.lock_ref = 1
        self._evictable_pages = 0
        self._protected_pages = 0
        self.evictable_leaves: set[TreeNode] = set()
        self.evictable_host_leaves: set[TreeNode] = set()
        self.ongoing_write_through: dict[int, _WriteRecord] = {}
        self.ongoing_load_back: dict[int, TreeNode] = {}
        self._heap: list[HeapEntry] = []
        self._host_heap: list[HeapEntry] = []
        self._dirty: set[TreeNode] = set()
        self._host_dirty: set[TreeNode] = set()
        self.stats = CacheStats()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _new_node(self, priority: int = 0) -> TreeNode:
        node = TreeNode(self._next_node_id, self._tick(), priority)
        self._next_node_id += 1
        return node

    def now(self) -> int:
        """The logical clock's current value (the tick of the latest touch)."""
        return self._clock

    def evictable_size(self) -> int:
        """Tokens on device in nodes nobody locks (SGLang ``evictable_size_``)."""
        return self._evictable_pages * self.page_size

    def protected_size(self) -> int:
        """Tokens on device in locked nodes (requests, pending writes, in-flight loads)."""
        return self._protected_pages * self.page_size

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def reset(self) -> None:
        """SGLang ``reset``: new empty tree, queues dropped, host pool cleared.

        Like SGLang, this does not touch the device allocator: the scheduler clears it separately
        when it flushes (see :meth:`flush`).
        """
        self.storage_reset()
        self.controller.reset()
        self._init_tree()

    def flush(self) -> None:
        """``/flush_cache`` on an idle engine: :meth:`reset` plus clearing the device pool."""
        self.reset()
        self.controller.device.clear()

    # ----------------------------------------------------------------------- leaf bookkeeping --
    def _update_leaf_status(self, n: TreeNode) -> None:
        """n is an evictable device leaf iff resident, unlocked and no child is resident."""
        leaves = self.evictable_leaves
        if n.value is None or n.lock_ref > 0:
            leaves.discard(n)
            return
        for c in n.children.values():
            if c.value is not None:
                leaves.discard(n)
                return
        if n not in leaves:
            leaves.add(n)
            self._dirty.add(n)

    def _update_host_leaf_status(self, n: TreeNode) -> None:
        """n is an evictable host leaf iff evicted, unlocked and no child is backed up."""
        leaves = self.evictable_host_leaves
        if n.value is not None or n.lock_ref > 0:
            leaves.discard(n)
            return
        for c in n.children.values():
            if c.host_value is not None:
                leaves.discard(n)
                return
        if n not in leaves:
            leaves.add(n)
            self._host_dirty.add(n)

    def _touch(self, n: TreeNode) -> None:
        n.last_access_time = self._tick()
        if n in self.evictable_leaves:
            self._dirty.add(n)
        elif n in self.evictable_host_leaves:
            self._host_dirty.add(n)

    # -------------------------------------------------------------------------------- locks --
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Pin ``node`` and its ancestors (not root) on device; returns the evictable delta."""
        root = self.root
        if node.lock_ref > 0:
            # Every ancestor is locked at least as often as node (each lock takes the whole
            # path), so none changes state and none is an evictable leaf: only the counts move.
            while node is not root:
                node.lock_ref += 1
                node = node.parent  # type: ignore[assignment]
            return 0
        delta = 0
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        while node is not root:
            if node.lock_ref == 0:
                n = len(node.key)
                self._evictable_pages -= n
                self._protected_pages += n
                delta -= n
            node.lock_ref += 1
            # _update_leaf_status / _update_host_leaf_status of a locked node: not a member
            leaves.discard(node)
            host_leaves.discard(node)
            parent = node.parent
            assert parent is not None
            node = parent
        return delta * self.page_size

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one ``inc_lock_ref(node)``; returns the evictable delta (>= 0)."""
        root = self.root
        if node.lock_ref > 1:
            # every ancestor stays locked (its count is at least node's), so only counts move
            while node is not root:
                node.lock_ref -= 1
                node = node.parent  # type: ignore[assignment]
            return 0
        delta = 0
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        while node is not root:
            if node.lock_ref == 1:
                n = len(node.key)
                self._evictable_pages += n
                self._protected_pages -= n
                delta += n
            if node.lock_ref <= 0:
                raise AssertionError(f"dec_lock_ref below zero on {node!r}")
            node.lock_ref -= 1
            if node.lock_ref:  # still locked: what the two updates do for a locked node
                leaves.discard(node)
                host_leaves.discard(node)
            else:
                self._update_leaf_status(node)
                self._update_host_leaf_status(node)
            parent = node.parent
            assert parent is not None
            node = parent
        return delta * self.page_size

    # ----------------------------------------------------------------------------- matching --
    def match_prefix(
        self, key: Sequence[Any], extra_key: str | None = None, limit: int | None = None
    ) -> MatchResult:
        """Longest cached prefix of ``key`` (device part, then host-only part).

        ``limit`` (tokens) matches only ``key[:limit]`` without copying it (SGLang's
        ``RadixKey`` limit, used to match ``input_len - 1`` tokens).

        Mutates: touches root and every node walked (including host-only ones) and may split the
        last node on a page boundary — even if the caller then does not admit the request.
        """
        self.stats.match_calls += 1
        pkey = to_page_key(key, self.page_size)
        root = self.root
        if not pkey or (limit is not None and limit < self.page_size):
            return MatchResult([], 0, root, root, 0, self.page_size)
        self._touch(root)
        n = len(pkey) if limit is None else min(len(pkey), limit // self.page_size)
        return self._match_from(root, 0, n, pkey, [], extra_key)

    def _match_from(
        self,
        node: TreeNode,
        off: int,
        n: int,
        pkey: tuple[Any, ...],
        segments: list[list[int]],
        extra_key: str | None = None,
    ) -> MatchResult:
        """The walk of :meth:`match_prefix` over ``pkey[:n]`` from ``node``, whose path holds
        ``pkey[:off]`` on device (already walked and touched; ``segments`` its page lists)."""
        dev_pages = off
        src = key_source(pkey)
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        while off < n:
            first = pkey[off]
            child = node.children.get(first if extra_key is None else (extra_key, first))
            if child is None:
                break
            # self._touch(child), inlined
            self._clock += 1
            child.last_access_time = self._clock
            if child in leaves:
                self._dirty.add(child)
            elif child in host_leaves:
                self._host_dirty.add(child)
            ck = child.key
            memo = child._kmemo
            if memo is not None and memo[1] is src and memo[2] == off and memo[0] is ck:
                # ck was cut from this very key at this offset: equal without comparing
                p = len(ck) if off + len(ck) <= n else n - off
            else:
                p = match_len(ck, pkey, off, n)
                if p == len(ck) and src is not None and off + p <= len(src):
                    child._kmemo = (ck, src, off)  # just compared equal: remember it
            if p < len(ck):
                upper = self._split_node(child, p)
                if upper.value is not None:
                    segments.append(upper.value)
                    dev_pages += p
                node = upper
                break
            if child.value is not None:
                segments.append(child.value)
                dev_pages += p
            node = child
            off += p
        last = node
        host_pages = 0
        while last.value is None:
            assert last.host_value is not None, "evicted node without a host copy"
            host_pages += len(last.host_value)
            parent = last.parent
            assert parent is not None
            last = parent
        last_host = node
        while last_host.host_value is None:
            parent = last_host.parent
            assert parent is not None
            last_host = parent
        return MatchResult(
            segments, dev_pages, last, last_host, host_pages * self.page_size, self.page_size
        )

    def _split_node(self, child: TreeNode, split: int) -> TreeNode:
        """Split ``child`` after ``split`` pages; the new upper node is returned."""
        self.splits += 1
        new = self._new_node(child.priority)
        new.extra_key = child.extra_key
        key = child.key
        new.key = key[:split]
        child.key = key[split:]
        memo = child._kmemo
        if memo is not None and memo[0] is key:
            new._kmemo = (new.key, memo[1], memo[2])
            child._kmemo = (child.key, memo[1], memo[2] + split)
        else:
            child._kmemo = None
        new.children = {child_key(child.key, 0, child.extra_key): child}
        parent = child.parent
        assert parent is not None
        new.parent = parent
        new.lock_ref = child.lock_ref
        new.hit_count = child.hit_count
        hv = child.hash_value
        if hv is not None:
            new.hash_value = hv[:split]
            child.hash_value = hv[split:]
        if child.value is not None:
            new.value = child.value[:split]
            child.value = child.value[split:]
        if child.host_value is not None:
            new.host_value = child.host_value[:split]
            child.host_value = child.host_value[split:]
            pending = child.write_through_pending_id
            if pending is not None:
                # both halves are published when the write's ack is processed; the lock holder
                # stays the lower part, whose path walk also releases the upper one
                self.ongoing_write_through[pending].publish_nodes.append(new)
                new.write_through_pending_id = pending
        child.parent = new
        parent.children[child_key(new.key, 0, new.extra_key)] = new
        return new

    # ---------------------------------------------------------------------------- insertion --
    def insert(
        self,
        key: Sequence[Any],
        value: Sequence[int],
        *,
        chunked: bool = False,
        priority: int = 0,
        extra_key: str | None = None,
    ) -> int:
        """Insert ``key`` with the caller's device pages ``value`` (one page id per key page;
        only the first ``len(key)`` pages are read, so a longer list need not be sliced first).

        Returns ``prefix_len``: the tokens of the leading part that was already on device (the
        caller frees its own duplicate pages there). Host-only nodes on the path adopt the caller's
        pages (they keep their old host copy, count no hit, get no prefix credit); device nodes on
        the path count a hit (which may trigger a write-through backup); the remainder becomes a
        new leaf.
        """
        self.stats.insert_calls += 1
        pkey = to_page_key(key, self.page_size)
        if not pkey:
            return 0
        n = len(pkey)
        if len(value) < n:
            raise ValueError(f"insert: {len(value)} pages given for a key of {n} pages")
        return self._insert_from(self.root, 0, pkey, value, chunked, priority, extra_key)

    def _insert_from(
        self,
        node: TreeNode,
        off: int,
        pkey: tuple[Any, ...],
        value: Sequence[int],
        chunked: bool,
        priority: int,
        extra_key: str | None,
    ) -> int:
        """The walk of :meth:`insert` from ``node``, whose path holds ``pkey[:off]`` on device
        (already walked: those ``off`` pages count as prefix)."""
        n = len(pkey)
        total = off
        src = key_source(pkey)
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        while off < n:
            first = pkey[off]
            child = node.children.get(first if extra_key is None else (extra_key, first))
            if child is None:
                break
            node = child
            # self._touch(node), inlined
            self._clock += 1
            node.last_access_time = self._clock
            if node in leaves:
                self._dirty.add(node)
            elif node in host_leaves:
                self._host_dirty.add(node)
            if priority > node.priority:
                node.priority = priority
            ck = node.key
            memo = node._kmemo
            if (
                memo is not None
                and memo[1] is src
                and memo[2] == off
                and memo[0] is ck
                and off + len(ck) <= n  # a PrefixKey's source is longer than the key
            ):
                p = len(ck)  # cut from this very key at this offset (see match_prefix)
            else:
                p = match_len(ck, pkey, off)
                if p == len(ck) and src is not None and off + p <= len(src):
                    node._kmemo = (ck, src, off)  # just compared equal: remember it
            if p < len(ck):
                node = self._split_node(node, p)
                if priority > node.priority:
                    node.priority = priority
            if node.value is None:
                pages = value[off : off + p]
                self._adopt(node, pages if type(pages) is list else list(pages))
            else:
                self._inc_hit_count(node, chunked)
                total += p
            off += p
        if off < n:
            leaf = self._new_node(priority)
            leaf.extra_key = extra_key
            leaf.key = pkey[off:]
            if src is not None and n <= len(src):
                leaf._kmemo = (leaf.key, src, off)
            pages = value[off:n]  # a list slice is already a fresh list: copy only once
            leaf.value = pages if type(pages) is list else list(pages)
            leaf.parent = node
            node.children[child_key(pkey, off, extra_key)] = leaf
            self._evictable_pages += n - off
            # _update_leaf_status(node): it now has a resident child, so it is no leaf
            leaves.discard(node)
            # _update_leaf_status(leaf): resident, unlocked and childless, so a new leaf
            leaves.add(leaf)
            self._dirty.add(leaf)
            if not self._write_back:
                self._inc_hit_count(leaf, chunked)
        return total * self.page_size

    def _adopt(self, node: TreeNode, pages: list[int]) -> None:
        """Re-attach a host-only node to the device with the inserting caller's pages."""
        node.value = pages
        self._evictable_pages += len(pages)
        self._update_leaf_status(node)
        self._update_host_leaf_status(node)
        parent = node.parent
        assert parent is not None
        self._update_leaf_status(parent)

    def _inc_hit_count(self, node: TreeNode, chunked: bool) -> None:
        if self._write_back or chunked:
            return
        node.hit_count += 1
        if node in self.evictable_leaves:
            self._dirty.add(node)
        if (
            self.has_host
            and node.host_value is None
            and node.hit_count >= self.write_through_threshold
        ):
            self.write_backup(node)

    # ------------------------------------------------------------------------------ backups --
    def write_backup(self, node: TreeNode, write_back: bool = False) -> int:
        """Start a device->host copy of ``node``; returns the tokens written (0 if none).

        Write-through modes write a node only under a backed-up parent (or root) and pin it (with
        its ancestors) until the ack is processed. On a full host pool, ``evict_host`` is asked for
        the node's *full* length and the write retried once.
        """
        parent = node.parent
        assert parent is not None and node.value is not None
        if not write_back and parent is not self.root and parent.host_value is None:
            return 0
        ctrl = self.controller
        host = ctrl.write(node.value, node.id)
        if host is None:
            self.evict_host(len(node.value) * self.page_size)
            host = ctrl.write(node.value, node.id)
            if host is None:
                self.stats.backup_failures += 1
                return 0
        node.host_value = host
        node.write_through_pending_id = node.id
        self.ongoing_write_through[node.id] = _WriteRecord(node, len(node.key))
        if not write_back:
            self.inc_lock_ref(node)
        return len(host) * self.page_size

    def writing_check(self, write_back: bool = False) -> None:
        """Process write acks: completed ones at the FIFO front, or (write_back) all, blocking."""
        if write_back:
            for ack_id in self.controller.wait_writes():
                self._finish_write_through_ack(ack_id, release_lock=False)
            assert not self.ongoing_write_through, "writes left pending after a blocking wait"
            return
        for ack_id in self.controller.pop_completed_writes():
            self._finish_write_through_ack(ack_id, release_lock=True)

    def _finish_write_through_ack(self, ack_id: int, release_lock: bool) -> None:
        rec = self.ongoing_write_through.pop(ack_id)
        for n in rec.publish_nodes:
            n.write_through_pending_id = None
        if self.storage is not None:  # L3 backup of the written segment, before the unlock
            self.write_backup_storage(rec.lock_node, rec.backup_len)
        if release_lock:
            self.dec_lock_ref(rec.lock_node)

    def loading_check(self) -> None:
        """Process load acks at the FIFO front: release the locks ``load_back`` took."""
        for node_ids in self.controller.pop_completed_loads():
            for node_id in node_ids:
                self.dec_lock_ref(self.ongoing_load_back.pop(node_id))

    def check_hicache_events(self) -> None:
        """What the scheduler calls at the start of each prefill-scheduling attempt."""
        self.writing_check()
        self.loading_check()
        if self.storage is not None:
            self.drain_storage_control_queues()

    # ----------------------------------------------------------------------------- eviction --
    def _flush_dirty(self, dirty: set[TreeNode], members: set[TreeNode], host: bool) -> None:
        """Give every member whose key changed (or who has no live entry) a fresh heap entry."""
        keyfn = self._key
        heap = self._host_heap if host else self._heap
        if self._volatile_keys:
            dirty.clear()
            self._rebuild_heap(members, host)
            return
        for n in dirty:
            if n not in members:
                continue
            k = keyfn(n)
            if host:
                if n._hhseq < 0 or n._hhkey != k:
                    self._hseq += 1
                    n._hhkey, n._hhseq = k, self._hseq
                    heapq.heappush(heap, (k, self._hseq, n))
            elif n._hseq < 0 or n._hkey != k:
                self._hseq += 1
                n._hkey, n._hseq = k, self._hseq
                heapq.heappush(heap, (k, self._hseq, n))
        dirty.clear()
        # stale entries accumulate between calls; rebuild when they dominate
        if self._volatile_keys or len(heap) > 4 * len(members) + 256:
            self._rebuild_heap(members, host)

    def _rebuild_heap(self, members: set[TreeNode], host: bool) -> None:
        keyfn = self._key
        old = self._host_heap if host else self._heap
        for _, _, n in old:
            if host:
                n._hhseq = -1
            else:
                n._hseq = -1
        new: list[HeapEntry] = []
        for n in members:
            self._hseq += 1
            k = keyfn(n)
            if host:
                n._hhkey, n._hhseq = k, self._hseq
            else:
                n._hkey, n._hseq = k, self._hseq
            new.append((k, self._hseq, n))
        heapq.heapify(new)
        if host:
            self._host_heap = new
        else:
            self._heap = new

    def _push(self, n: TreeNode, host: bool) -> None:
        self._hseq += 1
        k = self._key(n)
        if host:
            n._hhkey, n._hhseq = k, self._hseq
            heapq.heappush(self._host_heap, (k, self._hseq, n))
        else:
            n._hkey, n._hseq = k, self._hseq
            heapq.heappush(self._heap, (k, self._hseq, n))

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device tokens if possible; returns the tokens evicted.

        SGLang heapifies a snapshot of the evictable leaves at each call, then pops: locked nodes
        are skipped; a node without a host copy is written back (write_back) or deleted (write
        -through modes); a backed-up one is demoted to host-only. After each victim, its parent
        joins the heap once all its children are evicted (or being written back). Whole nodes go,
        so this overshoots. Under write_back the call then waits for its writes and demotes them.

        Here the heap persists across calls. An entry is live iff its seq is the node's latest
        and, for entries older than this call, the node is still an evictable leaf (the snapshot);
        keys cannot change during a call (no touches happen inside it), so the live entries pop in
        exactly the order of SGLang's heap.
        """
        if num_tokens <= 0:
            return 0
        self.stats.evict_calls += 1
        leaves = self.evictable_leaves
        self._flush_dirty(self._dirty, leaves, host=False)
        start = self._hseq
        heap = self._heap
        ps = self.page_size
        write_back = self._write_back
        num_evicted = 0
        wb_nodes: list[TreeNode] = []
        wb_set: set[TreeNode] = set()
        requeue: list[TreeNode] = []
        while num_evicted < num_tokens and heap:
            _, seq, x = heapq.heappop(heap)
            if seq != x._hseq:
                continue
            x._hseq = -1
            if seq <= start and x not in leaves:
                continue
            if x.lock_ref > 0:
                continue
            if x.host_value is None:
                if write_back:
                    written = self.write_backup(x, write_back=True)
                    num_evicted += written
                    if written > 0:
                        wb_nodes.append(x)
                        wb_set.add(x)
                    else:
                        requeue.append(x)  # stays on device; a candidate again next call
                else:
                    num_evicted += self._evict_regular(x)
            else:
                num_evicted += self._evict_backuped(x)
            parent = x.parent
            assert parent is not None
            for c in parent.children.values():
                if c.value is not None and c not in wb_set:
                    break
            else:
                self._push(parent, host=False)
        self._dirty.update(requeue)
        if write_back:
            self.writing_check(write_back=True)
            self.stats.write_back_tokens += sum(len(n.key) for n in wb_nodes) * ps
            for n in wb_nodes:
                # SGLang 0.5.14 demotes every written node here, even one that an evict_host
                # (from a later failed write in this call) already deleted from the tree, which
                # frees its device pages twice. Only nodes still in the tree are demoted here.
                if n.value is not None and self._in_tree(n):
                    self._evict_backuped(n)
        return num_evicted

    def _in_tree(self, n: TreeNode) -> bool:
        parent = n.parent
        return parent is not None and parent.children.get(child_key(n.key, 0, n.extra_key)) is n

    def _evict_backuped(self, x: TreeNode) -> int:
        """Demote a backed-up device node to host-only; returns the tokens freed on device."""
        value = x.value
        assert value is not None
        self.controller.free_device(value)
        n = len(value)
        self._evictable_pages -= n
        x.value = None
        self.evictable_leaves.discard(x)  # _update_leaf_status(x) of an evicted node
        self._update_host_leaf_status(x)
        parent = x.parent
        assert parent is not None
        self._update_leaf_status(parent)
        tokens = n * self.page_size
        self.stats.device_evicted_tokens += tokens
        self.stats.device_demoted_tokens += tokens
        return tokens

    def _evict_regular(self, x: TreeNode) -> int:
        """Delete a device leaf that has no host copy (its KV is lost at both tiers)."""
        assert not x.children, "evicting a non-backed-up node that still has children"
        value = x.value
        assert value is not None
        self.controller.free_device(value)
        n = len(value)
        self._delete_leaf(x)
        tokens = n * self.page_size
        self.stats.device_evicted_tokens += tokens
        self.stats.device_deleted_tokens += tokens
        return tokens

    def _delete_leaf(self, x: TreeNode) -> None:
        parent = x.parent
        assert parent is not None
        removed = parent.children.pop(child_key(x.key, 0, x.extra_key))
        assert removed is x
        self._evictable_pages -= len(x.key)
        self.evictable_leaves.discard(x)
        self._update_leaf_status(parent)

    def evict_host(self, num_tokens: int) -> int:
        """Drop host copies of host-only leaves until ``num_tokens`` are freed (or none is left).

        Device-resident nodes keep their host copies; host-protected nodes are skipped; a deleted
        node's parent joins the heap once it is host-only and childless. Returns the tokens freed
        (SGLang returns nothing; the figure is for reporting).
        """
        if num_tokens <= 0:
            return 0
        self.stats.evict_host_calls += 1
        members = self.evictable_host_leaves
        self._flush_dirty(self._host_dirty, members, host=True)
        start = self._hseq
        heap = self._host_heap
        root = self.root
        evicted = 0
        requeue: list[TreeNode] = []
        while evicted < num_tokens and heap:
            _, seq, x = heapq.heappop(heap)
            if seq != x._hhseq:
                continue
            x._hhseq = -1
            if seq <= start and x not in members:
                continue
            if x is root:
                break
            if x.value is not None:
                continue
            if x.host_ref_counter > 0:
                if self._lb_pins is not None and x in self._lb_pins:
                    self._lb_pins = None  # SGLang would delete it (counted once per load_back)
                    self.defects["L2LB"] += 1
                requeue.append(x)
                continue
            host_value = x.host_value
            assert host_value is not None
            self.controller.free_host(host_value)
            evicted += len(host_value) * self.page_size
            parent = x.parent
            assert parent is not None
            removed = parent.children.pop(child_key(x.key, 0, x.extra_key))
            assert removed is x
            members.discard(x)
            self._update_host_leaf_status(parent)
            if not parent.children and parent.value is None:
                self._push(parent, host=True)
        self._host_dirty.update(requeue)
        self.stats.host_evicted_tokens += evicted
        return evicted

    # --------------------------------------------------------------------------- load back --
    def load_back(self, node: TreeNode, mem_quota: int | None = None) -> list[int] | None:
        """Reserve device pages for the evicted chain ending at ``node`` and queue its copy.

        All or nothing: the whole chain from the first device-resident ancestor down. Chains
        under ``load_back_threshold`` tokens are not loaded. On a full device pool, ``evict`` is
        asked for the chain's full length and the load retried once. On success every chain
        node is device-resident at once (data not yet moved) and the path stays locked until
        ``loading_check`` sees the ack. Returns the new device pages, or None.
        """
        self.stats.load_back_calls += 1
        last_hit = node
        chain: list[TreeNode] = []
        while node.value is None:
            assert node.host_value is not None, "evicted node without a host copy"
            chain.append(node)
            parent = node.parent
            assert parent is not None
            node = parent
        chain.reverse()
        ancestor = node
        delta = self.inc_lock_ref(ancestor)
        host_pages: list[int] = []
        for n in chain:
            assert n.host_value is not None
            host_pages += n.host_value
        tokens = len(host_pages) * self.page_size
        if tokens < self.load_back_threshold or (
            mem_quota is not None and tokens > mem_quota + delta
        ):
            self.dec_lock_ref(ancestor)
            return None
        ctrl = self.controller
        device = ctrl.load(host_pages, last_hit.id)
        if device is None:
            # SGLang 0.5.14 locks only the device ancestor here, so under write_back the nested
            # eviction (failed write_backup -> evict_host) can delete the very host-only nodes
            # being loaded; the load then fills a detached node and device pages end up owned
            # twice. Pinning the chain's host copies for the nested call prevents exactly that.
            for n in chain:
                n.protect_host()
            self._lb_pins = set(chain)
            self.evict(tokens)
            self._lb_pins = None
            for n in chain:
                n.release_host()
            device = ctrl.load(host_pages, last_hit.id)
        self.dec_lock_ref(ancestor)
        if device is None:
            self.stats.load_back_failures += 1
            return None
        self.ongoing_load_back[last_hit.id] = last_hit
        off = 0
        for n in chain:
            assert n.host_value is not None
            k = len(n.host_value)
            n.value = device[off : off + k]
            off += k
        self._evictable_pages += len(device)
        self.inc_lock_ref(last_hit)
        self.stats.loaded_tokens += tokens
        return device

    def init_load_back(
        self, last_node: TreeNode, host_hit_length: int, mem_quota: int | None = None
    ) -> tuple[list[int], TreeNode]:
        """Load the host hit ending at ``last_node`` (the match's best_match_node) if possible.

        Returns (new device pages, node to use as the request's last_node). On failure (or a hit
        under the threshold) the pages are empty and the node is the deepest device-resident
        ancestor; those tokens are then recomputed.
        """
        del host_hit_length  # SGLang passes it but 0.5.14's load path does not use it
        if last_node.value is None:
            pages = self.load_back(last_node, mem_quota)
            if pages is not None:
                return pages, last_node
            # a fresh local for the walk: the compiled core keeps the narrowing of
            # ``last_node.value`` to None from the test above (mypyc), so it must not be reused
            node: TreeNode = last_node
            while node.value is None:
                parent = node.parent
                assert parent is not None
                node = parent
            last_node = node
        return [], last_node

    def ready_to_load_host_cache(self) -> int:
        """Launch this batch's queued loads as one layer-wise copy; returns its handle or -1."""
        return self.controller.start_loading()

    # ---------------------------------------------------------------------------- inspection --
    def iter_nodes(self) -> list[TreeNode]:
        """Every node but the root, parents before children (deterministic order)."""
        out: list[TreeNode] = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            if n is not self.root:
                out.append(n)
            stack.extend(reversed(list(n.children.values())))
        return out

    def check_invariants(self, device_pages_outside: Sequence[int] | None = None) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (POLICY_CORE.md §1.5).

        Checks structure (parent/child links, page-aligned non-empty keys, value lengths),
        device-prefix closure, evicted => backed up, host-prefix closure (write-through modes),
        lock monotonicity, size accounting, both leaf sets, pending-write and load records, and
        allocator conservation: every host page is free xor in exactly one node; every device page
        is free xor in exactly one node xor (if given) in ``device_pages_outside`` (pages the
        caller's requests hold outside the tree).
        """
        from hicache.policy.invariants import check_cache_invariants

        check_cache_invariants(self, device_pages_outside)

    # Convenience for callers that hold their own node references.
    def is_in_tree(self, n: TreeNode) -> bool:
        return n is self.root or self._in_tree(n)
