"""The 0.5.23 tree's leaf sets and what leaves the tree (``unified_tree_core.py``): the D-leaf
and H-leaf rules (``_is_device_leaf``, ``_is_host_leaf``, ``_update_evictable_leaf_sets``),
demotion (``_demote``), deletion with tombstone clean-up (``_delete_unbacked_device_leaf``), the
write_back subtree drop (``drop_subtree_no_host``), host-leaf eviction (``_evict_host_leaf``,
``drive_host_eviction``) and host-duplicate reclaim (``_reclaim_full_host_duplicates``).

A part of :class:`~hicache.policy.v0523.tree.TreeCore`, kept in its own file: the attributes
declared below are the tree's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hicache.policy.radix import child_key
from hicache.policy.v0523.node import UNode

if TYPE_CHECKING:
    from hicache.policy.v0523.tree import Sink
    from hicache.policy.v0523.victims import PersistentVictims, PlainVictims


class TreeRemoval:
    """The leaf sets and removal steps of the tree core (mixed into ``TreeCore``)."""

    sink: Sink
    page_size: int
    root: UNode
    is_write_back: bool
    evictable_size: int
    device_leaves: set[UNode]
    host_leaves: set[UNode]
    host_duplicates: dict[int, UNode]
    nodes: dict[int, UNode]
    victims: PlainVictims | PersistentVictims
    host_victims: PlainVictims | PersistentVictims

    def tokens(self, pages: list[int] | None) -> int:
        return 0 if pages is None else len(pages) * self.page_size

    def is_device_leaf(self, n: UNode) -> bool:
        if n is self.root or n.value is None or n.lock_ref > 0:
            return False
        for c in n.children.values():  # noqa: SIM110 (a loop: no generator on this hot path)
            if c.value is not None:
                return False
        return True

    def is_host_leaf(self, n: UNode) -> bool:
        if n is self.root or n.value is not None or n.host_value is None:
            return False
        return n.host_lock_ref == 0 and n.lock_ref == 0 and not n.children

    def update_leaf_sets(self, n: UNode) -> None:
        if self.is_device_leaf(n):
            if n not in self.device_leaves:
                self.device_leaves.add(n)
                self.victims.on_add(n)
        else:
            self.device_leaves.discard(n)
        if self.is_host_leaf(n):
            if n not in self.host_leaves:
                self.host_leaves.add(n)
                self.host_victims.on_add(n)
        else:
            self.host_leaves.discard(n)

    def demote(self, node: UNode) -> int:
        """``_demote``: free the device copy of a backed-up node; returns tokens freed."""
        assert node.value is not None and node.host_value is not None
        freed = self.tokens(node.value)
        self.sink.free_device(node.value)
        self.evictable_size -= freed
        node.value = None
        self.update_leaf_sets(node)
        if node.parent is not None:
            self.update_leaf_sets(node.parent)
        return freed

    def _release_layers(self, node: UNode) -> int:
        """``_release_all_component_layers``: free both copies and leave the leaf sets;
        returns the device tokens freed."""
        freed = 0
        if node.value is not None:
            self.sink.free_device(node.value)
            freed = self.tokens(node.value)
            self.evictable_size -= freed
        if node.host_value is not None:
            self.sink.free_host(node.host_value)
            node.host_value = None
        self.device_leaves.discard(node)
        self.host_leaves.discard(node)
        return freed

    def _remove(self, node: UNode) -> None:
        """``_remove_leaf_from_parent``."""
        parent = node.parent
        assert parent is not None
        v = parent.children.pop(child_key(node.key, 0, None), None)
        assert v is node
        self.host_duplicates.pop(node.id, None)
        self.nodes.pop(node.id, None)

    def delete_unbacked_leaf(self, node: UNode) -> int:
        """``_delete_unbacked_device_leaf``; returns the device tokens freed."""
        freed = self._release_layers(node)
        parent = node.parent
        assert parent is not None
        self._remove(node)
        self.update_leaf_sets(parent)
        self._delete_tombstones(parent)
        return freed

    def _delete_tombstones(self, cur: UNode) -> None:
        """``_iteratively_delete_tombstone_ancestors``."""
        while cur is not self.root and not cur.children:
            if cur.lock_ref > 0 or cur.host_lock_ref > 0:
                break
            if cur.value is not None or cur.host_value is not None:
                self.update_leaf_sets(cur)
                break
            self.host_leaves.discard(cur)
            self._remove(cur)
            parent = cur.parent
            assert parent is not None
            self.update_leaf_sets(parent)
            cur = parent

    def drop_subtree_no_host(self, node: UNode) -> int | None:
        """The write_back fallback when a leaf's backup failed: delete it with its host-only
        descendants unless any is locked or in flight; returns the device tokens freed, or
        None when declined."""
        assert node.host_value is None and node.write_through_pending_id is None
        if node.load_back_pending_id is not None or node.lock_ref > 0 or node.host_lock_ref > 0:
            return None
        descendants: list[UNode] = []
        stack = list(node.children.values())
        while stack:
            cur = stack.pop()
            if (
                cur.write_through_pending_id is not None
                or cur.load_back_pending_id is not None
                or cur.lock_ref > 0
                or cur.host_lock_ref > 0
            ):
                return None
            descendants.append(cur)
            stack.extend(cur.children.values())
        freed = 0
        for desc in reversed(descendants):
            freed += self._release_layers(desc)
            self._remove(desc)
        return freed + self.delete_unbacked_leaf(node)

    def evict_host_leaf(self, node: UNode) -> int:
        """``_evict_host_leaf``; returns the host tokens freed."""
        assert self.is_host_leaf(node)
        freed = self.tokens(node.host_value)
        self.sink.free_host(node.host_value)  # type: ignore[arg-type]
        node.host_value = None
        self.host_leaves.discard(node)
        parent = node.parent
        assert parent is not None
        self._remove(node)
        self._delete_tombstones(parent)
        return freed

    def drive_host_eviction(self, num_tokens: int) -> int:
        """``drive_host_eviction(FULL, n)``: under write_back reclaim host duplicates first,
        then evict host leaves by the strategy; returns the host tokens freed."""
        freed = 0
        if self.is_write_back:
            freed = self._reclaim_duplicates(num_tokens)
        victims = self.host_victims
        victims.begin()
        try:
            while freed < num_tokens:
                x = victims.pop()
                if x is None:
                    break
                freed += self.evict_host_leaf(x)
                p = x.parent
                if p is not None and p in self.host_leaves:
                    victims.push_parent(p)
        finally:
            victims.end()
        return freed

    def _reclaim_duplicates(self, num_tokens: int) -> int:
        """``_reclaim_full_host_duplicates``: free host copies of nodes also on the device,
        in registration order; pass 1 spares evictable device leaves."""
        freed = 0
        swept: list[int] = []
        for spare in (True, False):
            if freed >= num_tokens:
                break
            for node in self.host_duplicates.values():
                if freed >= num_tokens:
                    break
                if node.value is None or node.host_value is None:
                    swept.append(node.id)
                    continue
                if spare and node in self.device_leaves:
                    continue
                if (
                    node.write_through_pending_id is not None
                    or node.load_back_pending_id is not None
                    or node.host_lock_ref != 0
                ):
                    continue
                freed += self.tokens(node.host_value)
                self.sink.free_host(node.host_value)
                node.host_value = None
                swept.append(node.id)
        for nid in swept:
            self.host_duplicates.pop(nid, None)
        return freed
