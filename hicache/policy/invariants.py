"""A real integrity check of the policy core's state (POLICY_CORE.md §1.5 plus conservation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hicache.policy.radix import TreeNode, child_key

if TYPE_CHECKING:
    from hicache.policy.hiradix import HiRadixCache


def _fail(msg: str) -> None:
    raise AssertionError(msg)


def check_cache_invariants(
    cache: HiRadixCache, device_pages_outside: Sequence[int] | None = None
) -> None:
    root = cache.root
    if root.lock_ref != 1 or root.value != [] or root.host_value != []:
        _fail("root must keep lock_ref 1, value [] and host_value []")
    write_through = cache.write_policy != "write_back"
    evictable = protected = 0
    device_owner: dict[int, TreeNode] = {}
    host_owner: dict[int, TreeNode] = {}
    want_leaves: set[TreeNode] = set()
    want_host_leaves: set[TreeNode] = set()
    pending: dict[int, list[TreeNode]] = {}

    stack: list[TreeNode] = [root]
    while stack:
        node = stack.pop()
        for ck, c in node.children.items():
            if c.parent is not node:
                _fail(f"{c!r}: parent link does not point to {node!r}")
            if not c.key:
                _fail(f"{c!r}: empty key")
            if child_key(c.key, 0, c.extra_key) != ck:
                _fail(f"{c!r}: stored under a child key that is not its first page")
            if c.extra_key != node.extra_key and node is not root:
                _fail(f"{c!r}: extra_key differs from its parent's")
            stack.append(c)
        if node is root:
            continue
        parent = node.parent
        assert parent is not None
        n = len(node.key)
        if node.value is not None:
            if len(node.value) != n:
                _fail(f"{node!r}: {len(node.value)} device pages for {n} key pages")
            if parent.value is None:
                _fail(f"{node!r}: device-resident under an evicted parent (prefix closure)")
            for p in node.value:
                if p in device_owner:
                    _fail(f"device page {p} owned by {device_owner[p]!r} and {node!r}")
                device_owner[p] = node
            if node.lock_ref > 0:
                protected += n
            else:
                evictable += n
        elif node.host_value is None:
            _fail(f"{node!r}: evicted but not backed up")
        if node.host_value is not None:
            if len(node.host_value) != n:
                _fail(f"{node!r}: {len(node.host_value)} host pages for {n} key pages")
            if write_through and parent is not root and parent.host_value is None:
                _fail(f"{node!r}: backed up under a parent without a host copy (write-through)")
            for p in node.host_value:
                if p in host_owner:
                    _fail(f"host page {p} owned by {host_owner[p]!r} and {node!r}")
                host_owner[p] = node
        if node.lock_ref < 0:
            _fail(f"{node!r}: negative lock_ref")
        if parent is not root and parent.lock_ref < node.lock_ref:
            _fail(f"{node!r}: lock_ref above its parent's ({parent.lock_ref})")
        if node.host_ref_counter < 0:
            _fail(f"{node!r}: negative host_ref_counter")
        if node.write_through_pending_id is not None:
            if node.host_value is None:
                _fail(f"{node!r}: pending write without a host copy")
            pending.setdefault(node.write_through_pending_id, []).append(node)
        if (
            node.value is not None
            and node.lock_ref == 0
            and all(c.value is None for c in node.children.values())
        ):
            want_leaves.add(node)
        if (
            node.value is None
            and node.lock_ref == 0
            and all(c.host_value is None for c in node.children.values())
        ):
            want_host_leaves.add(node)

    ps = cache.page_size
    if evictable * ps != cache.evictable_size():
        _fail(f"evictable_size {cache.evictable_size()} != {evictable * ps} counted in the tree")
    if protected * ps != cache.protected_size():
        _fail(f"protected_size {cache.protected_size()} != {protected * ps} counted in the tree")
    if want_leaves != cache.evictable_leaves:
        extra = cache.evictable_leaves - want_leaves
        missing = want_leaves - cache.evictable_leaves
        _fail(
            f"evictable_leaves wrong: extra {sorted(n.id for n in extra)}, "
            f"missing {sorted(n.id for n in missing)}"
        )
    if want_host_leaves != cache.evictable_host_leaves:
        extra = cache.evictable_host_leaves - want_host_leaves
        missing = want_host_leaves - cache.evictable_host_leaves
        _fail(
            f"evictable_host_leaves wrong: extra {sorted(n.id for n in extra)}, "
            f"missing {sorted(n.id for n in missing)}"
        )

    # pending writes: every pending node is published by its record, and vice versa
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

    # allocator conservation
    ctrl = cache.controller
    free_dev = ctrl.device.free_pages_snapshot()
    if len(set(free_dev)) != len(free_dev):
        _fail("device free list holds a page twice")
    both = set(free_dev) & device_owner.keys()
    if both:
        _fail(f"device pages both free and in the tree: {sorted(both)[:8]}")
    if device_pages_outside is not None:
        outside = list(device_pages_outside)
        out_set = set(outside)
        if len(out_set) != len(outside):
            _fail("a device page is held twice outside the tree")
        clash = out_set & (device_owner.keys() | set(free_dev))
        if clash:
            _fail(f"device pages held outside the tree are also free or in it: {sorted(clash)[:8]}")
        total = len(free_dev) + len(device_owner) + len(out_set)
        if total != ctrl.device.num_pages:
            _fail(
                f"device pages: free {len(free_dev)} + tree {len(device_owner)} + outside "
                f"{len(out_set)} != capacity {ctrl.device.num_pages}"
            )
    elif len(free_dev) + len(device_owner) > ctrl.device.num_pages:
        _fail("more device pages free or in the tree than the pool has")
    if ctrl.host is not None:
        free_host = ctrl.host.free_pages_snapshot()
        if len(set(free_host)) != len(free_host):
            _fail("host free list holds a page twice")
        if set(free_host) & host_owner.keys():
            _fail("host pages both free and in the tree")
        if len(free_host) + len(host_owner) != ctrl.host.num_pages:
            _fail(
                f"host pages: free {len(free_host)} + tree {len(host_owner)} != capacity "
                f"{ctrl.host.num_pages}"
            )
    elif host_owner:
        _fail("host copies exist without a host pool")
