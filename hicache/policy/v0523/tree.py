"""The 0.5.23 TreeCore, dense path: what the tree decides (``unified_cache/unified_tree_core.py``
and ``components/full.py``).

It owns the tree, lock counts, the evictable/protected ledgers, the device and host leaf sets,
the host-duplicate register, match, the insert walk with hit counting, splits, victim choice,
demotion and deletion, host eviction (:mod:`~hicache.policy.v0523.removal`), and the backup /
load-back specs. The controller
(:mod:`hicache.policy.v0523.cache`) decides *when*; SGLang hands it the tree's *actions*
(``FreeDeviceKV``, ``BackupKV``, ``UpdatePendingBackupOnNodeSplit``) to apply. Here the tree calls
the controller's :class:`Sink` at the point where SGLang's controller would apply each action:
an insert suspends at every ``BackupKV`` barrier and frees are applied in emission order before
it, so calling back in emission order is the same sequence of effects.

Lengths are in tokens; keys are paged tuples (:mod:`hicache.policy.radix`); values are page ids.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any, Protocol

from hicache.policy.radix import child_key, match_len
from hicache.policy.v0523.node import StrategyFn, UNode, make_strategy
from hicache.policy.v0523.removal import TreeRemoval
from hicache.policy.v0523.victims import MONOTONE, PersistentVictims, PlainVictims

#: The per-level recency step of a match stamp (``cur_time -= 0.00001``, unified_tree_core.py:1031).
_MATCH_STAMP_STEP = 0.00001


class Sink(Protocol):
    """Where the tree's actions go (the controller)."""

    def free_device(self, pages: list[int]) -> None: ...

    def free_host(self, pages: list[int]) -> None: ...

    def backup(self, chain: list[UNode]) -> None:
        """Apply a write-through ``BackupKV`` (ancestors first)."""
        ...

    def pending_split(self, ack_id: int, old: UNode, new: UNode) -> None:
        """``UpdatePendingBackupOnNodeSplit``: ``old`` was split; ``new`` is its prefix."""
        ...


class Match:
    """``MatchResult``: device pages of the matched prefix, host hit (tokens) and the nodes."""

    __slots__ = ("best", "device_pages", "host_hit_length", "last_device", "last_host")

    def __init__(
        self, device_pages: list[int], host_hit: int, last_device: UNode, best: UNode, hi: bool
    ) -> None:
        self.device_pages = device_pages
        self.host_hit_length = host_hit
        self.last_device = last_device
        self.best = best
        self.last_host = best if hi else last_device


class TreeCore(TreeRemoval):
    """The tree of one cache (see the module docstring)."""

    def __init__(
        self,
        sink: Sink,
        page_size: int,
        eviction_policy: str = "lru",
        eviction_policy_config: dict[str, Any] | None = None,
        fast_victims: bool = True,
    ) -> None:
        """``fast_victims``: keep the device-eviction heap across calls where that gives
        SGLang's order (:mod:`~hicache.policy.v0523.victims`); False: SGLang's per-call heap."""
        self.sink = sink
        self.page_size = page_size
        self.key_fn: StrategyFn = make_strategy(eviction_policy, eviction_policy_config, page_size)
        self.tlru = eviction_policy.lower() == "tlru"
        self._persistent = fast_victims and eviction_policy.lower() in MONOTONE
        self.enable_hicache = False
        self.is_write_back = False
        self.write_through_threshold = 256  # the TreeCore default; the cache sets 1 or 2
        self._time = 0.0
        self._next_id = 0
        self._next_uuid = 0
        self.reset()

    # ---------------------------------------------------------------- state --
    def reset(self) -> None:
        self.nodes: dict[int, UNode] = {}
        self.root = self._new_node()
        self.root.priority = -sys.maxsize
        self.root.value = []
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.device_leaves: set[UNode] = set()
        self.host_leaves: set[UNode] = set()
        kind = PersistentVictims if self._persistent else PlainVictims
        self.victims: PlainVictims | PersistentVictims = kind(self.key_fn, self.device_leaves)
        self.host_victims: PlainVictims | PersistentVictims = kind(
            self.key_fn, self.host_leaves, host=True
        )
        self.host_duplicates: dict[int, UNode] = {}

    def tick(self) -> float:
        """``get_and_increase_time_counter``."""
        t = self._time
        self._time += 1.0
        return t

    def _new_node(self, priority: int = 0) -> UNode:
        last = self.tick()
        node = UNode(self._next_id, last, self.tick(), priority)
        self._next_id += 1
        self.nodes[node.id] = node
        return node

    def update_duplicate(self, n: UNode) -> None:
        """``_update_duplicate_tracking``: register a settled device+host copy (lazily dropped)."""
        if (
            n is not self.root
            and n.value is not None
            and n.host_value is not None
            and n.write_through_pending_id is None
            and n.load_back_pending_id is None
        ):
            self.host_duplicates.setdefault(n.id, n)
        else:
            self.host_duplicates.pop(n.id, None)

    # ---------------------------------------------------------------- locks --
    def inc_lock_ref(self, node: UNode) -> int:
        """Device lock on ``node``'s root path, including an evicted bottom segment; returns
        the tokens moved from evictable to protected."""
        cur = node
        while cur is not self.root and cur.value is None:
            cur.lock_ref += 1
            cur = cur.parent  # type: ignore[assignment]
        delta = 0
        while cur is not self.root:
            if cur.lock_ref == 0:
                n = self.tokens(cur.value)
                self.evictable_size -= n
                self.protected_size += n
                delta += n
            cur.lock_ref += 1
            self.device_leaves.discard(cur)
            cur = cur.parent  # type: ignore[assignment]
        if node.value is None:
            # an evicted anchor may have been an H-leaf; a device-resident one was just taken
            # out of the D-leaves above and cannot be an H-leaf (SGLang updates the anchor
            # either way: the same sets)
            self.update_leaf_sets(node)
        return delta

    def dec_lock_ref(self, node: UNode) -> None:
        cur = node
        while cur is not self.root:
            if cur.lock_ref <= 0:
                raise AssertionError(f"FULL segment release hit lock_ref=0 on node {cur.id}")
            if cur.lock_ref == 1 and cur.value is not None:
                n = self.tokens(cur.value)
                self.evictable_size += n
                self.protected_size -= n
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self.update_leaf_sets(cur)
            cur = cur.parent  # type: ignore[assignment]
        # SGLang then updates the anchor again: a no-op here, since the loop updated it if its
        # lock reached 0, and a node still locked is in neither leaf set

    def move_lock_ref(self, old: UNode, new: UNode) -> None:
        """``dec_lock_ref(old); inc_lock_ref(new)`` (the checkpoint's lock move), in one walk
        of ``new``'s new part when ``old`` is ``new`` or one of its ancestors and that part is
        on the device.

        Not in SGLang: a shortcut with the same end state. On ``old``'s root path the two walks
        cancel: each node goes to ``lock_ref - 1`` and back, its tokens to evictable and back,
        and while it is down it still has a device child on the path (``new``'s side), so it
        enters neither leaf set (``old`` itself when it is ``new``: it may enter the device leaf
        set and leave it again at once; what the victim heap's ``on_add`` keeps of that no
        eviction call reads: the node is no leaf when the next call begins, and its stamp
        predates that call). So only the nodes
        strictly below ``old`` on ``new``'s path are locked, as ``inc_lock_ref`` would. Any
        other pair takes the two walks. ``tests/test_v0523_fast_paths.py`` holds the two
        equal."""
        below: list[UNode] = []
        node = new
        root = self.root
        while node is not old:
            if node is root or node.value is None:
                self.dec_lock_ref(old)
                self.inc_lock_ref(new)
                return
            below.append(node)
            node = node.parent  # type: ignore[assignment]
        if new.value is None:  # old is new, evicted: inc_lock_ref's evicted-anchor steps
            self.dec_lock_ref(old)
            self.inc_lock_ref(new)
            return
        leaves = self.device_leaves
        for node in below:
            if node.lock_ref == 0:
                n = self.tokens(node.value)
                self.evictable_size -= n
                self.protected_size += n
            node.lock_ref += 1
            leaves.discard(node)

    def inc_host_lock_ref(self, node: UNode) -> int | None:
        """Host lock on ``node``; returns the receipt's boundary tag (None: nothing locked)."""
        if node.host_value is None and not self.is_write_back:
            self.update_leaf_sets(node)
            return None
        if node.host_uuid is None:
            self._next_uuid += 1
            node.host_uuid = self._next_uuid
        uuid = node.host_uuid
        node.host_lock_ref += 1
        self.update_leaf_sets(node)
        return uuid

    def dec_host_lock_ref(self, node: UNode, uuid: int | None) -> None:
        anchor = node
        if uuid is not None:
            while True:
                if node.host_value is None and not self.is_write_back:
                    break
                if node.host_lock_ref <= 0:
                    raise AssertionError(f"host segment release hit 0 on node {node.id}")
                node.host_lock_ref -= 1
                self.update_leaf_sets(node)
                if node.host_uuid == uuid:
                    break
                if node.parent is None:
                    raise AssertionError(f"host lock boundary {uuid} not above {anchor.id}")
                node = node.parent
        self.update_leaf_sets(anchor)

    # ---------------------------------------------------------------- match --
    def match_prefix(self, key: tuple[Hashable, ...], limit: int | None = None) -> Match:
        """``_match_prefix_helper`` + ``_match_post_processor`` + FULL's host-hit finalizer, on
        the first ``limit`` pages of ``key`` (all when None; the ``RadixKey`` limit)."""
        end = len(key) if limit is None else min(limit, len(key))
        if not end:
            return Match([], 0, self.root, self.root, self.enable_hicache)
        hi = self.enable_hicache
        node = self.root
        off = 0
        values: list[list[int]] = []
        best = best_dev = self.root
        best_len = 0
        ck = child_key(key, 0, None)
        while off < end and ck in node.children:
            child = node.children[ck]
            if child.value is None and child.host_value is None:
                break  # a dead node
            plen = match_len(child.key, key, off, end)
            if plen < len(child.key):
                node = self.split(child, plen)
                if node.value is not None:
                    values.append(node.value)
                if node.value is not None or (hi and node.host_value is not None):
                    best = node
                if node.value is not None:
                    best_dev, best_len = node, len(values)
                break
            if child.value is not None:
                values.append(child.value)
            node = child
            if node.value is not None or (hi and node.host_value is not None):
                best = node
            if node.value is not None:
                best_dev, best_len = node, len(values)
            off += plen
            if off < end:
                ck = child_key(key, off, None)
        cur_time = self.tick()
        upd: UNode | None = best
        while upd is not None:
            upd.last_access_time = cur_time
            cur_time -= _MATCH_STAMP_STEP
            upd = upd.parent
        pages: list[int] = []
        for v in values[:best_len]:
            pages += v
        host_hit = 0
        n = best
        while n is not best_dev and n is not self.root:
            if n.host_value is not None:
                host_hit += self.tokens(n.host_value)
            n = n.parent  # type: ignore[assignment]
        return Match(pages, host_hit, best_dev, best, hi)

    def peek(self, key: tuple[Hashable, ...], end: int) -> tuple[int, int]:
        """The walk of :meth:`match_prefix` over ``key[:end]``, read-only: ``(device tokens,
        host-only tokens)`` of the matched prefix (a partly matched node counts its matched
        pages)."""
        node, off, dev, host = self.root, 0, 0, 0
        while off < end:
            child = node.children.get(child_key(key, off, None))
            if child is None or (child.value is None and child.host_value is None):
                break
            plen = match_len(child.key, key, off, end)
            if child.value is not None:
                dev += plen
            else:
                host += plen
            if plen < len(child.key):
                break
            node, off = child, off + plen
        return dev * self.page_size, host * self.page_size

    def split(self, child: UNode, split_len: int) -> UNode:
        """``_split_node`` (with FULL's ``redistribute_on_node_split``): the first
        ``split_len`` pages of ``child`` become a new parent."""
        parent = child.parent
        assert parent is not None
        new = self._new_node(priority=child.priority)
        new.children = {child_key(child.key, split_len, None): child}
        new.parent = parent
        new.key = child.key[:split_len]
        new.hit_count = child.hit_count
        new.creation_time = child.creation_time
        if self.tlru:
            new.tlru_cached_prefix_len = parent.tlru_cached_prefix_len + split_len * self.page_size
            new.tlru_history_len = child.tlru_history_len
        new.load_back_pending_id = child.load_back_pending_id
        child.parent = new
        child.key = child.key[split_len:]
        if child.hash_value is not None:
            new.hash_value, child.hash_value = (
                child.hash_value[:split_len],
                child.hash_value[split_len:],
            )
        new.lock_ref = child.lock_ref
        new.host_lock_ref = child.host_lock_ref
        new.host_uuid, child.host_uuid = child.host_uuid, None
        if child.value is not None:
            new.value, child.value = child.value[:split_len], child.value[split_len:]
        if child.host_value is not None:
            new.host_value = child.host_value[:split_len]
            child.host_value = child.host_value[split_len:]
        parent.children[child_key(new.key, 0, None)] = new
        ack_id = child.write_through_pending_id
        if ack_id is not None:
            new.write_through_pending_id = ack_id
            self.sink.pending_split(ack_id, child, new)
        child.last_access_time = self.tick()
        self.update_leaf_sets(new)
        self.update_leaf_sets(child)
        self.update_duplicate(new)
        return new

    # --------------------------------------------------------------- insert --
    def inc_hit_and_check(self, node: UNode) -> bool:
        """``_inc_hit_count_and_check``: count a hit; True when the node should be backed up."""
        if node.value is None or self.is_write_back:
            return False
        node.hit_count += 1
        return (
            self.enable_hicache
            and node.host_value is None
            and node.hit_count >= self.write_through_threshold
        )

    def backup_chain(self, node: UNode, write_back: bool = False) -> list[UNode]:
        """``_build_backup_kv_action``: the node, with its unbacked ancestors first
        (write-through only)."""
        chain = [node]
        if not write_back:
            anc = node.parent
            while anc is not None and anc is not self.root and anc.host_value is None:
                chain.append(anc)
                anc = anc.parent
            chain.reverse()
        return chain

    def insert(
        self,
        key: tuple[Hashable, ...],
        value: list[int],
        prev_prefix_len: int,
        inserted_len: int,
        priority: int,
        hint: UNode | None = None,
        key_end: int = -1,
    ) -> tuple[int, UNode]:
        """The resumable insert walk (WALK -> OVERLAP -> COMMIT -> TAIL), run to completion;
        returns ``(prefix_len, last_device_node)``. Barrier actions go to the sink in order.
        ``key_end`` >= 0: insert ``key[:key_end]`` (without copying the key; -1: all of it).

        ``hint``: a node known to lie on ``key``'s path (the request's locked node: its path
        spells the key's first pages). Down to ``min(prev_prefix_len, inserted_len)`` tokens
        the walk changes nothing on such a node but its recency stamp and priority (no split,
        no duplicate freed, no hit counted), so it follows the hint's path without comparing
        keys; below, the walk as without a hint. ``tests/policy/test_fast_paths_v0523.py``
        holds the two equal."""
        ps = self.page_size
        n = len(key) if key_end < 0 else min(key_end, len(key))
        self.root.last_access_time = self.tick()
        self.root.priority = max(self.root.priority, priority)
        if not n:
            return 0, self.root
        node = self.root
        off = 0
        total = 0
        if hint is not None and hint is not self.root:
            limit = min(prev_prefix_len, inserted_len)
            path: list[UNode] = []
            up: UNode | None = hint
            while up is not None and up is not self.root:
                path.append(up)
                up = up.parent
            for on_path in reversed(path):
                end = total + len(on_path.key) * ps
                if end > limit:
                    break
                on_path.last_access_time = self.tick()
                on_path.priority = max(on_path.priority, priority)
                node = on_path
                total = end
                off += len(on_path.key)
        while off < n:
            ck = child_key(key, off, None)
            child = node.children.get(ck)
            if child is None:
                break
            child.last_access_time = self.tick()
            plen = match_len(child.key, key, off, n)
            if plen < len(child.key):
                child = self.split(child, plen)
            child.priority = max(child.priority, priority)
            if child.value is None:
                self._unevict(child, value[off : off + plen])
            else:
                dup_start = max(0, prev_prefix_len - total)
                if dup_start < plen * ps:
                    # page-exact: prev_prefix_len and total are page multiples
                    self.sink.free_device(value[off + dup_start // ps : off + plen])
            end = total + plen * ps
            if end > inserted_len and self.inc_hit_and_check(child):
                self.sink.backup(self.backup_chain(child))
            node = child
            total = end
            off += plen
        if off >= n:
            return total, node
        leaf = self._add_leaf(node, key[off:n], value[off:n], priority)
        if not self.is_write_back:
            leaf_end = total + len(leaf.key) * ps
            if leaf_end > inserted_len and self.inc_hit_and_check(leaf):
                self.sink.backup(self.backup_chain(leaf))
        return total, leaf

    def _unevict(self, node: UNode, fresh: list[int]) -> None:
        """``_unevict_node_on_insert``: an evicted node takes the request's fresh pages (a list
        of its own: the caller's slice)."""
        node.value = fresh
        n = self.tokens(node.value)
        if node.lock_ref > 0:
            self.protected_size += n
        else:
            self.evictable_size += n
        self.update_leaf_sets(node)
        self.update_duplicate(node)
        if node.parent is not None:
            self.update_leaf_sets(node.parent)

    def _add_leaf(
        self, parent: UNode, key: tuple[Hashable, ...], value: list[int], priority: int
    ) -> UNode:
        """``_add_new_node`` (``value`` a list of the leaf's own: the caller's slice)."""
        new = self._new_node(priority=priority)
        new.parent = parent
        new.key = key
        if self.tlru:
            self._tlru_lens(new, parent)
        new.value = value
        parent.children[child_key(key, 0, None)] = new
        self.evictable_size += self.tokens(new.value)
        self.update_leaf_sets(new)
        self.update_leaf_sets(parent)
        return new

    def _tlru_lens(self, new: UNode, parent: UNode) -> None:
        """``_set_tlru_lens_and_raise_history``."""
        new.tlru_cached_prefix_len = parent.tlru_cached_prefix_len + len(new.key) * self.page_size
        if new.tlru_history_len < new.tlru_cached_prefix_len:
            new.tlru_history_len = new.tlru_cached_prefix_len
        cur: UNode | None = parent
        while cur is not None and cur.tlru_history_len < new.tlru_cached_prefix_len:
            cur.tlru_history_len = new.tlru_cached_prefix_len
            cur = cur.parent

    def insert_host(
        self,
        anchor: UNode,
        key: tuple[Hashable, ...],
        host_value: list[int],
        hash_value: list[int],
    ) -> tuple[int, bool]:
        """``insert_host``: attach pages fetched from L3 below ``anchor``; returns
        ``(prefix_len, dropped)``. Under write-through, matched nodes without a host copy are
        refilled from the fetch and ``prefix_len`` counts the already backed-up overlap (whose
        fetched pages the caller frees); a tail under an unbacked node is dropped. Under
        write_back nothing is refilled, ``prefix_len`` is the whole overlap and the new host node
        may sit under a device-only parent."""
        ps, wb = self.page_size, self.is_write_back
        node = anchor
        node.last_access_time = self.tick()
        if not key:
            return 0, False
        off = matched = host_prefix = 0
        refilled = False
        while off < len(key):
            child = node.children.get(child_key(key, off, None))
            if child is None:
                break
            node = child
            node.last_access_time = self.tick()
            plen = match_len(node.key, key, off)
            if plen < len(node.key):
                node = self.split(node, plen)
            if not wb:
                if node.host_value is None:
                    node.host_value = host_value[off : off + plen]
                    if node.hash_value is None:
                        node.hash_value = hash_value[off : off + plen]
                    self.update_leaf_sets(node)
                    if node.parent is not None:
                        self.update_leaf_sets(node.parent)
                    self.update_duplicate(node)
                    refilled = True
                else:
                    if refilled:
                        raise AssertionError(
                            f"write-through host-prefix invariant broken: backed node {node.id} "
                            "below a refilled node"
                        )
                    host_prefix += plen * ps
            matched += plen * ps
            off += plen
        prefix = matched if wb else host_prefix
        if off >= len(key):
            return prefix, False
        if node is not self.root and node.host_value is None and not wb:
            return prefix, True
        new = self._new_node(priority=node.priority)
        new.parent = node
        new.key = key[off:]
        if self.tlru:
            self._tlru_lens(new, node)
        new.hash_value = hash_value[off:]
        new.host_value = host_value[off:]
        node.children[child_key(key, off, None)] = new
        self.update_leaf_sets(new)
        self.update_leaf_sets(node)
        return prefix, False

    # ------------------------------------------------------------ load back --
    def load_back_chain(self, anchor: UNode) -> list[UNode] | None:
        """``build_load_back_spec``: the evicted nodes from the anchor up, root first; None
        when one of them is pinned by another load-back."""
        nodes: list[UNode] = []
        cur = anchor
        while cur.evicted:
            assert cur.host_value is not None
            nodes.append(cur)
            cur = cur.parent  # type: ignore[assignment]
        nodes.reverse()
        if any(n.load_back_pending_id not in (None, anchor.id) for n in nodes):
            return None
        return nodes

    def commit_load_back(self, anchor: UNode, nodes: list[UNode], device: list[int]) -> None:
        """``commit_load_back`` with FULL's ``commit_hicache_transfer(LOAD_BACK)``."""
        if self.is_write_back:
            for n in nodes:
                n.load_back_pending_id = anchor.id
        off = 0
        for n in nodes:
            k = len(n.host_value)  # type: ignore[arg-type]
            n.value = device[off : off + k]
            off += k
            t = self.tokens(n.value)
            if n.lock_ref > 0:
                self.protected_size += t
            else:
                self.evictable_size += t
            self.update_leaf_sets(n)
        self.update_leaf_sets(anchor)

    def finish_load_back(self, anchor: UNode) -> None:
        node: UNode | None = anchor
        while node is not None and node is not self.root:
            if self.is_write_back:
                if node.load_back_pending_id != anchor.id:
                    node = node.parent
                    continue
                node.load_back_pending_id = None
            self.update_duplicate(node)
            node = node.parent

    def copy_path_pages(self, node: UNode, into: list[int], start: int, n: int) -> None:
        """``into[start:n] = path_device_pages(node, root)[start:]``, the root path of ``node``
        being ``n`` pages long, without building the path's first ``start`` pages."""
        chunks: list[list[int]] = []
        total = 0
        cur = node
        while cur is not self.root:
            assert cur.value is not None
            chunks.append(cur.value)
            total += len(cur.value)
            cur = cur.parent  # type: ignore[assignment]
        assert total == n <= len(into), "the path does not cover the key"
        end = n
        for c in chunks:  # bottom-up
            if end <= start:
                break
            begin = end - len(c)
            if begin >= start:
                into[begin:end] = c
            else:
                into[start:end] = c[start - begin :]
            end = begin

    def path_device_pages(self, node: UNode, until: UNode) -> list[int]:
        """``collect_full_device_indices``: device pages from below ``until`` down to ``node``."""
        chunks: list[list[int]] = []
        while node is not until:
            assert node.value is not None
            chunks.append(node.value)
            node = node.parent  # type: ignore[assignment]
        out: list[int] = []
        for c in reversed(chunks):
            out += c
        return out
