"""A real integrity check of the policy core's state (POLICY_CORE.md §1.5 plus conservation)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hicache.policy.radix import TreeNode, child_key

if TYPE_CHECKING:
    from hicache.policy.hiradix import HiRadixCache


def _fail(msg: str) -> None:
    raise AssertionError(msg)


@dataclass
class _TreeCensus:
    """What one walk over the tree finds, for the checks against the cache's bookkeeping."""

    evictable: int = 0  # device pages of unlocked nodes
    protected: int = 0  # device pages of locked nodes
    device_owner: dict[int, TreeNode] = field(default_factory=dict)
    host_owner: dict[int, TreeNode] = field(default_factory=dict)
    want_leaves: set[TreeNode] = field(default_factory=set)
    want_host_leaves: set[TreeNode] = field(default_factory=set)
    pending: dict[int, list[TreeNode]] = field(default_factory=dict)  # write id -> nodes


def check_cache_invariants(
    cache: HiRadixCache, device_pages_outside: Sequence[int] | None = None
) -> None:
    """Raise ``AssertionError`` naming the first broken invariant (see
    ``HiRadixCache.check_invariants``); the checks run in a fixed order, so the same state
    always reports the same problem."""
    root = cache.root
    if root.lock_ref != 1 or root.value != [] or root.host_value != []:
        _fail("root must keep lock_ref 1, value [] and host_value []")
    write_through = cache.write_policy != "write_back"
    census = _walk_tree(root, write_through)
    _check_sizes_and_leaves(cache, census)
    _check_transfer_records(cache, census.pending, write_through)
    _check_device_pool(cache, census.device_owner, device_pages_outside)
    _check_host_pool(cache, census.host_owner)


# -- the tree walk ------------------------------------------------------------------------


def _walk_tree(root: TreeNode, write_through: bool) -> _TreeCensus:
    """Check every node (depth first; a node's child links before the node itself) and
    count what the later checks compare against."""
    census = _TreeCensus()
    stack: list[TreeNode] = [root]
    while stack:
        node = stack.pop()
        _check_child_links(node, root)
        stack.extend(node.children.values())
        if node is root:
            continue
        parent = node.parent
        assert parent is not None
        _check_device_copy(node, parent, census)
        _check_host_copy(node, parent, root, write_through, census)
        _check_refs(node, parent, root, census)
        _note_leaf(node, census)
    return census


def _check_child_links(node: TreeNode, root: TreeNode) -> None:
    for ck, c in node.children.items():
        if c.parent is not node:
            _fail(f"{c!r}: parent link does not point to {node!r}")
        if not c.key:
            _fail(f"{c!r}: empty key")
        if child_key(c.key, 0, c.extra_key) != ck:
            _fail(f"{c!r}: stored under a child key that is not its first page")
        if c.extra_key != node.extra_key and node is not root:
            _fail(f"{c!r}: extra_key differs from its parent's")


def _check_device_copy(node: TreeNode, parent: TreeNode, census: _TreeCensus) -> None:
    """Device pages: one per key page, prefix closure, single owner, size accounting;
    a node without them must be backed up."""
    n = len(node.key)
    if node.value is not None:
        if len(node.value) != n:
            _fail(f"{node!r}: {len(node.value)} device pages for {n} key pages")
        if parent.value is None:
            _fail(f"{node!r}: device-resident under an evicted parent (prefix closure)")
        for p in node.value:
            if p in census.device_owner:
                _fail(f"device page {p} owned by {census.device_owner[p]!r} and {node!r}")
            census.device_owner[p] = node
        if node.lock_ref > 0:
            census.protected += n
        else:
            census.evictable += n
    elif node.host_value is None:
        _fail(f"{node!r}: evicted but not backed up")


def _check_host_copy(
    node: TreeNode, parent: TreeNode, root: TreeNode, write_through: bool, census: _TreeCensus
) -> None:
    """Host pages: one per key page, prefix closure (write-through modes), single owner."""
    if node.host_value is None:
        return
    n = len(node.key)
    if len(node.host_value) != n:
        _fail(f"{node!r}: {len(node.host_value)} host pages for {n} key pages")
    if write_through and parent is not root and parent.host_value is None:
        _fail(f"{node!r}: backed up under a parent without a host copy (write-through)")
    for p in node.host_value:
        if p in census.host_owner:
            _fail(f"host page {p} owned by {census.host_owner[p]!r} and {node!r}")
        census.host_owner[p] = node


def _check_refs(node: TreeNode, parent: TreeNode, root: TreeNode, census: _TreeCensus) -> None:
    """Lock and host reference counts, and the pending-write mark."""
    if node.lock_ref < 0:
        _fail(f"{node!r}: negative lock_ref")
    if parent is not root and parent.lock_ref < node.lock_ref:
        _fail(f"{node!r}: lock_ref above its parent's ({parent.lock_ref})")
    if node.host_ref_counter < 0:
        _fail(f"{node!r}: negative host_ref_counter")
    if node.write_through_pending_id is not None:
        if node.host_value is None:
            _fail(f"{node!r}: pending write without a host copy")
        census.pending.setdefault(node.write_through_pending_id, []).append(node)


def _note_leaf(node: TreeNode, census: _TreeCensus) -> None:
    """Add the node to the leaf sets it should be in: unlocked with no device-resident
    child (device), or unlocked, evicted and with no backed-up child (host)."""
    if (
        node.value is not None
        and node.lock_ref == 0
        and all(c.value is None for c in node.children.values())
    ):
        census.want_leaves.add(node)
    if (
        node.value is None
        and node.lock_ref == 0
        and all(c.host_value is None for c in node.children.values())
    ):
        census.want_host_leaves.add(node)


# -- the cache's bookkeeping against the tree ---------------------------------------------


def _check_sizes_and_leaves(cache: HiRadixCache, census: _TreeCensus) -> None:
    ps = cache.page_size
    evictable = census.evictable
    protected = census.protected
    if evictable * ps != cache.evictable_size():
        _fail(f"evictable_size {cache.evictable_size()} != {evictable * ps} counted in the tree")
    if protected * ps != cache.protected_size():
        _fail(f"protected_size {cache.protected_size()} != {protected * ps} counted in the tree")
    _check_leaf_set("evictable_leaves", census.want_leaves, cache.evictable_leaves)
    _check_leaf_set("evictable_host_leaves", census.want_host_leaves, cache.evictable_host_leaves)


def _check_leaf_set(name: str, want: set[TreeNode], have: set[TreeNode]) -> None:
    if want != have:
        extra = have - want
        missing = want - have
        _fail(
            f"{name} wrong: extra {sorted(n.id for n in extra)}, "
            f"missing {sorted(n.id for n in missing)}"
        )


def _check_transfer_records(
    cache: HiRadixCache, pending: dict[int, list[TreeNode]], write_through: bool
) -> None:
    """Every pending node is published by its write record, and vice versa; every node
    being loaded is device-resident and locked. Consumes `pending`."""
    for ack_id, rec in cache.ongoing_write_through.items():
        nodes = pending.pop(ack_id, [])
        if set(nodes) != set(rec.publish_nodes):
            _fail(f"write {ack_id}: publish list does not match the nodes marked pending")
        if write_through and rec.lock_node.lock_ref <= 0:
            _fail(f"write {ack_id}: lock holder {rec.lock_node!r} is not locked")
    if pending:
        _fail(f"nodes marked pending with no write record: {sorted(pending)}")
    for node_id, node in cache.ongoing_load_back.items():
        if node.id != node_id or node.value is None or node.lock_ref <= 0:
            _fail(f"load {node_id}: node must be device-resident and locked until its ack")


# -- allocator conservation ---------------------------------------------------------------


def _check_device_pool(
    cache: HiRadixCache,
    device_owner: dict[int, TreeNode],
    device_pages_outside: Sequence[int] | None,
) -> None:
    """Every device page is free xor in exactly one node xor (if given) held outside."""
    pool = cache.controller.device
    free_dev = pool.free_pages_snapshot()
    if len(set(free_dev)) != len(free_dev):
        _fail("device free list holds a page twice")
    both = set(free_dev) & device_owner.keys()
    if both:
        _fail(f"device pages both free and in the tree: {sorted(both)[:8]}")
    if device_pages_outside is None:
        if len(free_dev) + len(device_owner) > pool.num_pages:
            _fail("more device pages free or in the tree than the pool has")
        return
    outside = list(device_pages_outside)
    out_set = set(outside)
    if len(out_set) != len(outside):
        _fail("a device page is held twice outside the tree")
    clash = out_set & (device_owner.keys() | set(free_dev))
    if clash:
        _fail(f"device pages held outside the tree are also free or in it: {sorted(clash)[:8]}")
    total = len(free_dev) + len(device_owner) + len(out_set)
    if total != pool.num_pages:
        _fail(
            f"device pages: free {len(free_dev)} + tree {len(device_owner)} + outside "
            f"{len(out_set)} != capacity {pool.num_pages}"
        )


def _check_host_pool(cache: HiRadixCache, host_owner: dict[int, TreeNode]) -> None:
    """Every host page is free xor in exactly one node; no host copies without a pool."""
    pool = cache.controller.host
    if pool is None:
        if host_owner:
            _fail("host copies exist without a host pool")
        return
    free_host = pool.free_pages_snapshot()
    if len(set(free_host)) != len(free_host):
        _fail("host free list holds a page twice")
    if set(free_host) & host_owner.keys():
        _fail("host pages both free and in the tree")
    outside = cache.storage_host_pages_outside()  # prefetch reservations (L3)
    out_set = set(outside)
    if len(out_set) != len(outside):
        _fail("a host page is held twice outside the tree (prefetches / release queue)")
    if out_set & host_owner.keys() or out_set & set(free_host):
        _fail("a host page held by a prefetch is also free or in the tree")
    if len(free_host) + len(host_owner) + len(out_set) != pool.num_pages:
        _fail(
            f"host pages: free {len(free_host)} + tree {len(host_owner)} + prefetches "
            f"{len(out_set)} != capacity {pool.num_pages}"
        )
    _check_host_pins(cache)


def _check_host_pins(cache: HiRadixCache) -> None:
    """Each node's host_ref_counter = the prefetches anchored on it + its in-flight backups."""
    want: dict[TreeNode, int] = {}
    for entry in cache.ongoing_prefetch.values():
        want[entry.anchor] = want.get(entry.anchor, 0) + 1
    for node in cache.ongoing_backup.values():
        want[node] = want.get(node, 0) + 1
    for node in [cache.root, *cache.iter_nodes()]:
        pins = node.host_ref_counter
        if cache._lb_pins is None and pins != want.get(node, 0) and cache.storage is not None:
            _fail(f"{node!r}: host_ref_counter {pins}, expected {want.get(node, 0)}")
