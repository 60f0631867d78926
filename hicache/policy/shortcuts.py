"""What :class:`~hicache.policy.hiradix.HiRadixCache` has that SGLang's class has not: a
read-only peek at a key's cached tiers (for routers) and a one-walk lock move (for chunked
prefill). Kept apart so that ``hiradix.py`` reads beside SGLang's ``HiRadixCache`` method by
method. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache.policy.radix import TreeNode, child_key, match_len, to_page_key


class Shortcuts:
    """Mixed into ``HiRadixCache``; uses its tree, page size, lock counters and leaf sets."""

    root: TreeNode
    page_size: int
    evictable_leaves: set[TreeNode]
    evictable_host_leaves: set[TreeNode]
    _evictable_pages: int
    _protected_pages: int

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
