"""The L3 tier's tree side: SGLang 0.5.14 ``HiRadixCache`` storage methods, mixed into our cache.

Method names follow ``hiradix_cache.py`` (``prefetch_from_storage``, ``check_prefetch_progress``,
``can_terminate_prefetch``, ``_insert_helper_host``, ``pop_prefetch_loaded_tokens``,
``release_aborted_request``, ``write_backup_storage``, ``drain_storage_control_queues``); the
behaviour is ``shared/design/STORAGE_TIER.md`` §2-§4. What takes time is the
:class:`~hicache.policy.storage.StorageController`'s (its stages are driven from outside).

SGLang 0.5.14's defects (STORAGE_TIER.md §8) are not reproduced where they would corrupt state
or misreport; each time a run reaches one, :attr:`StorageTier.defects` counts it (see
:data:`DEFECTS` for what we do instead). D7 (anchor misalignment) *is* reproduced: it only loses
hits, SGLang's hit rates depend on it, and §9 asks for it; it is counted with the tokens it
cost.

Page keys are computed lazily per node (``TreeNode.hash_value``): a key is a pure function of the
node's path, so computing it at the first backup or prefetch equals SGLang's computing it at
insert time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from hicache.policy.controller import TransferController
from hicache.policy.radix import TreeNode, child_key, match_len
from hicache.policy.storage import PREFETCH_POLICIES, PrefetchOp, StorageController

if TYPE_CHECKING:
    from hicache.policy.hiradix import MatchResult

#: Defects of SGLang 0.5.14 that a run can reach, what would happen there, and what we do.
DEFECTS: dict[str, str] = {
    "D1": "fetched pages attached under a device-only node (SGLang: AssertionError at the next "
    "eviction of that node); here: those pages are freed, not attached",
    "D2": "page keys ignore the extra key (SGLang: cross-tenant loads); here: namespaces stay "
    "apart; counted when another namespace held the pages",
    "D3": "flush while a prefetch read is in flight (SGLang: its slots are freed twice after "
    "the reset); here: dropped with the reset",
    "D4": "flush while the prefetch IO stage is busy (SGLang: a second IO thread may survive)",
    "D5": "prefetch credit popped in a pass that did not admit the request (SGLang: its L3 "
    "hit is reported as 0 later); here: the credit is kept until admission",
    "D6": "L3/host hit reported for a host hit that was not loaded (SGLang's breakdown uses the "
    "match length); here: only loaded tokens are reported",
    "D7": "prefetch keys chained from a misaligned anchor (reproduced: the prefetch misses); "
    "counted, with the tokens the store held under the right keys",
    "D8": "prefetch passes prefix keys without the anchor's; not counted: it needs "
    "hicache_storage_pass_prefix_keys (off by default) and a custom backend that reads them",
    "D9": "stale revoke of an earlier prefetch under the same request id (SGLang: pops the new "
    "one); here: ignored",
    "D10": "reset leaves in-flight prefetch/backup entries behind; here: cleared",
    "L2LB": "write_back load_back whose nested eviction would delete a node being loaded "
    "(SGLang: device pages owned twice); here: the chain is pinned for that eviction",
}


@dataclass(slots=True)
class _Prefetch:
    """An ``ongoing_prefetch`` entry."""

    anchor: TreeNode
    tokens: int
    host_pages: list[int]
    op: PrefetchOp
    extra_key: str | None


@dataclass
class StorageTierStats:
    """Tree-side L3 totals (tokens unless named otherwise)."""

    prefetch_issued: int = 0
    prefetch_below_threshold: int = 0
    prefetch_rate_limited: int = 0
    prefetch_no_host_space: int = 0
    prefetch_truncated: int = 0
    prefetch_terminated: int = 0
    prefetch_aborted: int = 0
    prefetched_tokens_total: int = 0  # credited at termination (completed - matched)
    prefetch_duplicate_tokens: int = 0  # fetched, but the tree had them at termination
    backup_ops: int = 0
    backuped_tokens_total: int = 0
    backup_skipped_detached: int = 0
    # the scheduler-thread all-reduces over the TP group that the prefetch checks make: the
    # termination vote (not under best_effort: can_terminate_prefetch,
    # hiradix_cache.py:1324-1357) and the MIN of the completed tokens at termination
    # (check_prefetch_progress, 1388-1393); each blocks the scheduler at tp > 1
    prefetch_tp_votes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StorageTier:
    """Mixed into ``HiRadixCache``. Inert until :meth:`attach_storage`."""

    # provided by HiRadixCache
    root: TreeNode
    page_size: int
    storage: StorageController | None
    controller: TransferController

    def _tick(self) -> int:
        raise NotImplementedError

    def _touch(self, n: TreeNode) -> None:
        raise NotImplementedError

    def _new_node(self, priority: int = 0) -> TreeNode:
        raise NotImplementedError

    def _split_node(self, child: TreeNode, split: int) -> TreeNode:
        raise NotImplementedError

    def _update_leaf_status(self, n: TreeNode) -> None:
        raise NotImplementedError

    def _update_host_leaf_status(self, n: TreeNode) -> None:
        raise NotImplementedError

    def _in_tree(self, n: TreeNode) -> bool:
        raise NotImplementedError

    def evict_host(self, num_tokens: int) -> int:
        raise NotImplementedError

    def free_host_pages(self, pages: list[int]) -> None:
        self.controller.free_host(pages)

    # ------------------------------------------------------------------------ configuration --
    def _init_storage_state(self) -> None:
        self.ongoing_prefetch: dict[Hashable, _Prefetch] = {}
        self.ongoing_backup: dict[int, TreeNode] = {}
        self.prefetch_loaded_tokens_by_reqid: dict[Hashable, int] = {}
        if not hasattr(self, "defects"):  # counters survive resets; zero until attach_storage
            self.storage_stats = StorageTierStats()
            self.defects: Counter[str] = Counter()
            self.defect_tokens: Counter[str] = Counter()

    def attach_storage(
        self,
        storage: StorageController,
        *,
        prefetch_policy: str = "timeout",
        prefetch_threshold: int = 256,
        timeout_base: float = 2.0,
        timeout_per_ki_token: float = 0.1,
        timeout_max: float = 30.0,
    ) -> None:
        """Configure L3 once, at start (SGLang's ``--hicache-storage-*`` flags and extra
        config). ``prefetch_threshold`` is the parsed value; the controller keeps its own
        ``max(threshold, page)`` for the revoke test."""
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"unknown prefetch policy {prefetch_policy!r}; choose one of "
                f"{', '.join(PREFETCH_POLICIES)}"
            )
        if storage.page_size != self.page_size:
            raise ValueError("storage controller and cache use different page sizes")
        if min(timeout_base, timeout_per_ki_token, timeout_max) < 0:
            raise ValueError("prefetch timeouts must be >= 0")
        self.storage = storage
        self.prefetch_policy = prefetch_policy
        self.prefetch_threshold = prefetch_threshold
        self.timeout_base = timeout_base
        self.timeout_per_ki_token = timeout_per_ki_token
        self.timeout_max = timeout_max
        self.storage_stats = StorageTierStats()
        self.defects = Counter()
        self.defect_tokens = Counter()
        self._init_storage_state()

    # ---------------------------------------------------------------------------- page keys --
    def node_hash_values(self, node: TreeNode) -> list[int]:
        """``node.hash_value``: its page keys, chained from its parent's last key."""
        hv = node.hash_value
        if hv is not None:
            return hv
        assert self.storage is not None
        hasher = self.storage.hasher
        path: list[TreeNode] = []
        n = node
        while n is not self.root and n.hash_value is None:
            path.append(n)
            parent = n.parent
            assert parent is not None
            n = parent
        last = hasher.seed(path[-1].extra_key) if n is self.root else n.hash_value[-1]  # type: ignore[index]
        for x in reversed(path):
            x.hash_value = hasher.chain(last, x.key)
            last = x.hash_value[-1]
        assert node.hash_value is not None
        return node.hash_value

    def last_hash(self, node: TreeNode, extra_key: str | None = None) -> int:
        """The key a prefetch anchored at ``node`` chains from (the root: the namespace seed)."""
        if node is self.root:
            assert self.storage is not None
            return self.storage.hasher.seed(extra_key)
        return self.node_hash_values(node)[-1]

    # -------------------------------------------------------------------------------- backup --
    def write_backup_storage(self, node: TreeNode, backup_len: int) -> None:
        """Queue the L3 backup of the segment a D->H write covered (``backup_len`` pages,
        ``node`` its lowest part now) and pin ``node``'s host copy until the backup ack."""
        st = self.storage
        assert st is not None
        if not self._in_tree(node):  # see HiRadixCache.evict: a node our fix kept from demotion
            self.storage_stats.backup_skipped_detached += 1
            return
        chain = [node]
        total = len(node.key)
        n = node
        while total < backup_len:  # _concat_split_chain: split between issue and ack
            parent = n.parent
            assert parent is not None and parent is not self.root
            chain.append(parent)
            total += len(parent.key)
            n = parent
        assert total == backup_len, "split chain does not add up to the written length"
        if len(chain) == 1:  # the usual case: no split since the write (no copies needed)
            assert node.host_value is not None
            host_pages, keys = node.host_value, self.node_hash_values(node)
        else:
            host_pages, keys = [], []
            for x in reversed(chain):
                assert x.host_value is not None
                host_pages += x.host_value
                keys += self.node_hash_values(x)
        op_id = st.write_storage(host_pages, keys)
        self.ongoing_backup[op_id] = node
        node.protect_host()
        self.storage_stats.backup_ops += 1
        if st.immediate:
            st.run_all()

    # ------------------------------------------------------------------------------ prefetch --
    def prefetch_from_storage(
        self,
        rid: Hashable,
        anchor: TreeNode,
        symbols: tuple[Hashable, ...],
        last_hash: int,
        now: float,
        extra_key: str | None = None,
    ) -> bool:
        """Issue a prefetch of ``symbols`` (page symbols) under ``anchor``; False if none was
        issued (threshold, capacity limit, or no host space)."""
        st = self.storage
        if st is None:
            return False
        ps, stats = self.page_size, self.storage_stats
        pages_n = len(symbols)
        if pages_n * ps < self.prefetch_threshold:
            stats.prefetch_below_threshold += 1
            return False
        if st.prefetch_rate_limited():
            stats.prefetch_rate_limited += 1
            return False
        old = self.ongoing_prefetch.get(rid)
        if old is not None:  # the same request id again before its prefetch ended
            self.defects["D9"] += 1
            self.release_aborted_request(rid)
        anchor.protect_host()
        host = st.host
        pages = host.alloc_pages(pages_n)
        if pages is None:
            self.evict_host(pages_n * ps)  # the full length, as SGLang does
            pages = host.alloc_pages(pages_n)
            if pages is None:
                pages_n = host.free_page_count()
                if pages_n * ps < self.prefetch_threshold:
                    anchor.release_host()
                    stats.prefetch_no_host_space += 1
                    return False
                symbols = symbols[:pages_n]
                pages = host.alloc_pages(pages_n)
                assert pages is not None
                stats.prefetch_truncated += 1
        op = st.prefetch(rid, pages, symbols, last_hash, now)
        tokens = pages_n * ps
        self.ongoing_prefetch[rid] = _Prefetch(anchor, tokens, pages, op, extra_key)
        st.prefetch_tokens_occupied += tokens
        stats.prefetch_issued += 1
        if st.immediate:
            st.run_all()
        return True

    def prefetch_kvcache(
        self,
        rid: Hashable,
        key: tuple[Hashable, ...],
        m: MatchResult,
        max_prefix_pages: int,
        now: float,
        extra_key: str | None = None,
    ) -> bool:
        """The scheduler's ``_prefetch_kvcache`` after its arrival-time match ``m`` of paged
        ``key`` (the caller made it, with its side effects): anchor at the deepest backed-up
        matched node, fetch the pages after the matched ones up to ``max_prefix_pages``, keyed
        as if they followed the anchor (misaligned when the device path ends in device-only
        nodes: D7, reproduced and counted)."""
        st = self.storage
        if st is None:
            return False
        ps = self.page_size
        anchor = m.last_host_node
        start = m.device_pages + m.host_hit_length // ps
        symbols = tuple(key[start:max_prefix_pages])
        last = self.last_hash(anchor, extra_key)
        dev = m.last_device_node
        misaligned = m.host_hit_length == 0 and dev is not anchor
        wanted = len(symbols) * ps >= self.prefetch_threshold
        if wanted and misaligned:
            right = st.hasher.find(self.last_hash(dev, extra_key), symbols)
            self.defects["D7"] += 1
            self.defect_tokens["D7"] += st.store.exists_prefix(right) * ps
        if wanted and extra_key is not None and anchor is self.root:
            # SGLang keys this prefetch in the no-extra-key namespace (D2)
            other = st.hasher.find(st.hasher.seed(None), symbols)
            mine = st.hasher.find(last, symbols)
            theirs, ours = st.store.exists_prefix(other), st.store.exists_prefix(mine)
            if theirs > ours:
                self.defects["D2"] += 1
                self.defect_tokens["D2"] += (theirs - ours) * ps
        return self.prefetch_from_storage(rid, anchor, symbols, last, now, extra_key)

    def storage_host_pages_outside(self) -> list[int]:
        """Host pages that prefetches hold outside the tree (reserved, being read, or queued
        for release): what the host-pool conservation check adds to the tree's pages."""
        st = self.storage
        if st is None:
            return []
        ps = self.page_size
        out: list[int] = []
        for pages in st.host_mem_release_queue:
            out += pages
        registered = set()
        for entry in self.ongoing_prefetch.values():
            op = entry.op
            registered.add(op)
            if op.hit_pages < 0:
                out += entry.host_pages
            elif op.hit_pages > 0:
                out += entry.host_pages[: op.hit_pages]
        for op in st.prefetch_queue:
            if op not in registered:
                out += op.host_pages
        for op in st.prefetch_buffer:
            if op not in registered:
                out += op.host_pages[op.completed_tokens // ps : op.hit_pages]
        return out

    def can_terminate_prefetch(self, op: PrefetchOp, now: float) -> bool:
        policy = self.prefetch_policy
        if policy == "best_effort":
            return True
        hit_tokens = max(op.hit_pages, 0) * self.page_size
        done = hit_tokens > 0 and op.completed_tokens == hit_tokens
        if not done and policy == "timeout":
            done = now - op.start_time > self._timeout_limit(op)  # strict, from arrival
        return done or op.terminated

    def _timeout_limit(self, op: PrefetchOp) -> float:
        """Seconds the timeout policy grants ``op``: the base alone until the query answered."""
        hit_tokens = max(op.hit_pages, 0) * self.page_size
        return min(
            self.timeout_max, self.timeout_base + self.timeout_per_ki_token * hit_tokens / 1024
        )

    def prefetch_deadline(self, rid: Hashable) -> float | None:
        """When the timeout policy would let ``rid``'s prefetch go if nothing else happens
        (seconds, the caller's clock), or None (no prefetch, or no timeout)."""
        entry = self.ongoing_prefetch.get(rid)
        return None if entry is None else self.deadline_of(entry.op)

    def deadline_of(self, op: PrefetchOp) -> float | None:
        """:meth:`prefetch_deadline` of an operation (None unless the policy is timeout)."""
        if self.prefetch_policy != "timeout":
            return None
        return op.start_time + self._timeout_limit(op)

    def check_prefetch_progress(self, rid: Hashable, now: float) -> bool:
        """True when ``rid`` has no prefetch in flight any more (terminating it now if its
        policy allows: fetched pages go into the tree as host-only nodes under the anchor)."""
        entry = self.ongoing_prefetch.get(rid)
        if entry is None:
            return True
        st = self.storage
        assert st is not None
        op = entry.op
        stats = self.storage_stats
        if self.prefetch_policy != "best_effort":
            stats.prefetch_tp_votes += 1  # can_terminate_prefetch's MAX all-reduce
        if not self.can_terminate_prefetch(op, now):
            return False
        completed, hit_keys = st.terminate_prefetch(op)
        stats.prefetch_tp_votes += 1  # the MIN all-reduce of the completed tokens
        ps = self.page_size
        c = completed // ps
        pages = entry.host_pages
        matched, attached = self._insert_helper_host(
            entry.anchor, op.symbols[:c], pages[:c], hit_keys[:c], entry.extra_key
        )
        if matched:
            self.free_host_pages(pages[:matched])
        if attached < c - matched:  # D1: the rest was not attached
            self.free_host_pages(pages[matched + attached : c])
        entry.anchor.release_host()
        del self.ongoing_prefetch[rid]
        st.prefetch_tokens_occupied = max(0, st.prefetch_tokens_occupied - entry.tokens)
        loaded = attached * ps
        self.prefetch_loaded_tokens_by_reqid[rid] = loaded
        stats.prefetch_terminated += 1
        stats.prefetched_tokens_total += loaded
        stats.prefetch_duplicate_tokens += matched * ps
        return True

    def _insert_helper_host(
        self,
        anchor: TreeNode,
        symbols: tuple[Hashable, ...],
        host_pages: list[int],
        hash_value: list[int],
        extra_key: str | None,
    ) -> tuple[int, int]:
        """Walk down from ``anchor`` along ``symbols``; attach the rest as one host-only node.
        Returns (pages the tree already had, pages attached)."""
        self._touch(anchor)
        n = len(symbols)
        if not n:
            return 0, 0
        node, off = anchor, 0
        while off < n:
            child = node.children.get(child_key(symbols, off, extra_key))
            if child is None:
                break
            self._touch(child)
            p = match_len(child.key, symbols, off)
            if p < len(child.key):
                child = self._split_node(child, p)
            node, off = child, off + p
        if off == n:
            return off, 0
        if node is not self.root and node.host_value is None:
            # SGLang attaches here and later crashes evicting ``node`` (D1)
            self.defects["D1"] += 1
            self.defect_tokens["D1"] += (n - off) * self.page_size
            return off, 0
        new = self._new_node(node.priority)
        new.extra_key = extra_key
        new.key = symbols[off:]
        new.host_value = host_pages[off:]
        new.hash_value = hash_value[off:]
        new.parent = node
        node.children[child_key(symbols, off, extra_key)] = new
        self._update_host_leaf_status(new)
        self._update_leaf_status(node)
        self._update_host_leaf_status(node)
        return off, n - off

    def pop_prefetch_loaded_tokens(self, rid: Hashable) -> int:
        return self.prefetch_loaded_tokens_by_reqid.pop(rid, 0)

    def release_aborted_request(self, rid: Hashable) -> None:
        """A queued request is aborted: its prefetch stops, nothing is inserted, the slots it
        filled are queued for release (the stages release the rest)."""
        if self.storage is None:
            return
        self.prefetch_loaded_tokens_by_reqid.pop(rid, None)
        entry = self.ongoing_prefetch.pop(rid, None)
        if entry is None:
            return
        st = self.storage
        completed, _ = st.terminate_prefetch(entry.op)
        entry.anchor.release_host()
        c = completed // self.page_size
        if c:
            st.host_mem_release_queue.append(entry.host_pages[:c])
        st.prefetch_tokens_occupied = max(0, st.prefetch_tokens_occupied - entry.tokens)
        self.storage_stats.prefetch_aborted += 1

    # -------------------------------------------------------------------------------- drains --
    def drain_storage_control_queues(self) -> None:
        """Revokes, then backup acks, then host slot releases (what was queued at the start)."""
        st = self.storage
        if st is None:
            return
        revokes, acks = st.prefetch_revoke_queue, st.ack_backup_queue
        releases = st.host_mem_release_queue
        n_rev, n_ack, n_rel = len(revokes), len(acks), len(releases)
        if not (n_rev or n_ack or n_rel):
            return
        for _ in range(n_rev):
            rid, op_id = revokes.popleft()
            entry = self.ongoing_prefetch.get(rid)
            if entry is None:
                continue
            if entry.op.op_id != op_id:
                self.defects["D9"] += 1  # SGLang would pop the newer prefetch here
                continue
            del self.ongoing_prefetch[rid]
            entry.anchor.release_host()
            st.prefetch_tokens_occupied = max(0, st.prefetch_tokens_occupied - entry.tokens)
        for _ in range(n_ack):
            op = acks.popleft()
            node = self.ongoing_backup.pop(op.op_id)
            node.release_host()
            self.storage_stats.backuped_tokens_total += op.completed_tokens
        if n_rel:
            pages: list[int] = []
            for _ in range(n_rel):
                pages += releases.popleft()
            self.free_host_pages(pages)

    def storage_reset(self) -> None:
        """The storage part of ``reset`` (flush): counts what SGLang's reset would trip on."""
        st = self.storage
        if st is None:
            return
        if st.prefetch_buffer:
            self.defects["D3"] += len(st.prefetch_buffer)
            self.defects["D4"] += 1
        stale = len(self.ongoing_prefetch) + len(self.ongoing_backup)
        if stale:
            self.defects["D10"] += stale
        st.reset()
        self._init_storage_state()
