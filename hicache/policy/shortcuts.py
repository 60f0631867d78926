"""What :class:`~hicache.policy.hiradix.HiRadixCache` has that SGLang's class has not: a
read-only peek at a key's cached tiers (for routers), and for chunked prefill a one-walk lock
move and a chunk's insert and re-match that compare no key above the request's locked node.
Kept apart so that ``hiradix.py`` reads beside SGLang's ``HiRadixCache`` method by
method. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hicache.policy.radix import TreeNode, child_key, key_source, match_len, to_page_key

if TYPE_CHECKING:
    from hicache.policy.hiradix import CacheStats, HiRadixCache, MatchResult


class Shortcuts:
    """Mixed into ``HiRadixCache``; uses its tree, page size, lock counters and leaf sets."""

    root: TreeNode
    page_size: int
    evictable_leaves: set[TreeNode]
    evictable_host_leaves: set[TreeNode]
    _evictable_pages: int
    _protected_pages: int
    _clock: int
    _dirty: set[TreeNode]
    _host_dirty: set[TreeNode]
    stats: CacheStats

    def dec_lock_ref(self, node: TreeNode) -> int:
        raise NotImplementedError

    def inc_lock_ref(self, node: TreeNode) -> int:
        raise NotImplementedError

    def move_lock_ref(self, old: TreeNode, new: TreeNode) -> None:
        """``dec_lock_ref(old); inc_lock_ref(new)`` (what ``cache_unfinished_req`` does after
        each chunk), in one walk when ``old`` is ``new`` or one of its ancestors.

        Not in SGLang: a shortcut with the same end state. Above ``new``'s new part the two
        walks cancel: each node of ``old``'s path goes to ``lock_ref - 1`` and back, and while
        it is briefly down it still has a resident child on the path (``new``'s side), so it
        never becomes an evictable leaf; only the counters move, and back. So only the nodes
        strictly below ``old`` on ``new``'s path are locked, as ``inc_lock_ref`` would. Any
        other pair takes the two walks."""
        below: list[TreeNode] = []
        node = new
        root = self.root
        while node is not old:
            if node is root:
                self.dec_lock_ref(old)
                self.inc_lock_ref(new)
                return
            below.append(node)
            parent = node.parent
            assert parent is not None
            node = parent
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        for node in below:
            if node.lock_ref == 0:
                n = len(node.key)
                self._evictable_pages -= n
                self._protected_pages += n
            node.lock_ref += 1
            leaves.discard(node)
            host_leaves.discard(node)

    def peek_prefix(self, key: Sequence[Any], limit: int | None = None) -> tuple[int, int]:
        """``(device tokens, host-only tokens)`` of ``key``'s cached prefix, read-only.

        Not in SGLang: what a router that sees an instance's tiers (``sim.routers``
        ``tier_aware``) asks. Walks like :meth:`match_prefix` (same ``limit``) but touches no
        node, splits none and counts no statistics, so peeking never changes a decision.
        """
        pkey = to_page_key(key, self.page_size)
        if not pkey or (limit is not None and limit < self.page_size):
            return 0, 0
        n = len(pkey) if limit is None else min(len(pkey), limit // self.page_size)
        node, off, dev, host = self.root, 0, 0, 0
        while off < n:
            child = node.children.get(child_key(pkey, off, None))
            if child is None:
                break
            p = match_len(child.key, pkey, off, n)
            if child.value is not None:
                dev += p
            else:
                host += p
            if p < len(child.key):
                break
            node, off = child, off + p
        return dev * self.page_size, host * self.page_size

    # ------------------------------------------------------------- a chunk of a locked path --
    def locked_path(
        self, last: TreeNode, done: int, pkey: tuple[Any, ...]
    ) -> list[TreeNode] | None:
        """The nodes from the root (excluded) down to ``last`` when they hold exactly
        ``pkey[:done]`` on device, locked, without extra keys: the path a chunked request holds
        between chunks. ``None`` otherwise. Changes nothing but the key memo (a cache)."""
        path: list[TreeNode] = []
        root = self.root
        node = last
        while node is not root:
            if node.value is None or node.lock_ref <= 0 or node.extra_key is not None:
                return None
            path.append(node)
            parent = node.parent
            assert parent is not None
            node = parent
        path.reverse()
        src = key_source(pkey)
        off = 0
        for node in path:
            ck = node.key
            end = off + len(ck)
            if end > done:
                return None
            memo = node._kmemo
            if memo is None or memo[1] is not src or memo[2] != off or memo[0] is not ck:
                if match_len(ck, pkey, off) != len(ck):
                    return None
                if src is not None and end <= len(src):
                    node._kmemo = (ck, src, off)  # as insert and match_prefix remember it
            off = end
        return path if off == done else None

    def insert_locked(
        self,
        path: list[TreeNode],
        done: int,
        pkey: tuple[Any, ...],
        value: Sequence[int],
        walked: bool = False,
    ) -> int:
        """``insert(pkey, value, chunked=True)`` when ``path`` is :meth:`locked_path` of the
        caller's last node for ``pkey[:done]`` (``done`` > 0); to be followed by
        :meth:`rematch_locked` of the same path, as ``cache_unfinished_req`` does.

        Not in SGLang: the same end state, clock values and return once the re-match has run.
        Above the caller's node nothing can happen but touches: every node there is on device,
        locked and equal to the key (checked by :meth:`locked_path`), so it is neither split,
        adopted nor counted (a chunked insert counts no hit), and, being locked, no eviction
        reads its access time, which the re-match sets again right after. So the clock only
        moves on; insert's priority (0) raises any lower one, unless ``walked``: every node of
        ``path`` was walked by an insert of this request since it was last split."""
        self.stats.insert_calls += 1
        if len(value) < len(pkey):
            raise ValueError(f"insert: {len(value)} pages given for a key of {len(pkey)} pages")
        self._clock += len(path)
        if not walked:
            for node in path:
                if node.priority < 0:
                    node.priority = 0
        return _core(self)._insert_from(path[-1], done, pkey, value, True, 0, None)

    def rematch_locked(self, path: list[TreeNode], done: int, pkey: tuple[Any, ...]) -> MatchResult:
        """``match_prefix(pkey)`` right after :meth:`insert_locked` of the same ``path``,
        ``done`` and key (the tree above ``path[-1]`` unchanged since). Not in SGLang: the same
        result, end state and clock values; above ``path[-1]`` the walk only touches."""
        self.stats.match_calls += 1
        core = _core(self)
        core._touch(self.root)
        leaves, host_leaves = self.evictable_leaves, self.evictable_host_leaves
        clock = self._clock
        segments: list[list[int]] = []
        for node in path:
            clock += 1
            node.last_access_time = clock
            if node in leaves:
                self._dirty.add(node)
            elif node in host_leaves:
                self._host_dirty.add(node)
            assert node.value is not None
            segments.append(node.value)
        self._clock = clock
        return core._match_from(path[-1], done, len(pkey), pkey, segments)


def _core(shortcuts: Shortcuts) -> HiRadixCache:
    """The cache these shortcuts are mixed into (its walks, for the type checker)."""
    return shortcuts  # type: ignore[return-value]
