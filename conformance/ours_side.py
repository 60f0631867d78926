"""Our side: ``hicache.policy.HiRadixCache`` with a ``ManualController`` and ``PageAllocator`` s.

Built the way ``tests/policy/harness.py`` builds it: the device pool reuses pages in SGLang's
order for the page size (``device_pool``), the host pool is FIFO.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conformance.driver import MatchView, Node, Side
from conformance.ops import Config
from hicache.policy import HiRadixCache, ManualController, PageAllocator, to_page_key
from hicache.policy.allocator import device_pool
from hicache.policy.eviction import get_strategy
from hicache.policy.radix import TreeNode, child_key


def _flatten(key: tuple[Any, ...], page_size: int) -> list[int]:
    if page_size == 1:
        return list(key)
    return [t for page in key for t in page]


class OursSide(Side):
    """Adapts our policy core to the driver's primitives (page ids are used as they are)."""

    name = "ours"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.device = device_pool(cfg.device_pages, cfg.page_size)
        self.host = PageAllocator(cfg.host_pages, cfg.page_size, "host")
        self.ctrl = ManualController(self.device, self.host)
        self.cache = HiRadixCache(
            self.ctrl, write_policy=cfg.write_policy, eviction_policy=cfg.strategy
        )
        self._key = get_strategy(cfg.strategy)

    # -- cache calls ---------------------------------------------------------------------------
    def match(self, tokens: list[int], extra_key: str | None, limit: int | None) -> MatchView:
        m = self.cache.match_prefix(tokens, extra_key=extra_key, limit=limit)
        return MatchView(
            list(m.device_indices),
            m.host_hit_length,
            m.last_device_node,
            m.last_host_node,
            m.best_match_node,
        )

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        chunked: bool,
        priority: int,
        extra_key: str | None,
    ) -> int:
        return self.cache.insert(
            tokens, list(pages), chunked=chunked, priority=priority, extra_key=extra_key
        )

    def inc_lock(self, node: Node) -> int:
        return self.cache.inc_lock_ref(node)

    def dec_lock(self, node: Node) -> int:
        return self.cache.dec_lock_ref(node)

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(num_tokens)

    def evict_host(self, num_tokens: int) -> None:
        self.cache.evict_host(num_tokens)

    def init_load_back(self, node: Node, host_hit: int) -> tuple[list[int], Node]:
        pages, last = self.cache.init_load_back(node, host_hit)
        return list(pages), last

    def ready_to_load(self) -> int:
        return self.cache.ready_to_load_host_cache()

    def writing_check(self, write_back: bool = False) -> None:
        self.cache.writing_check(write_back=write_back)

    def loading_check(self) -> None:
        self.cache.loading_check()

    def check_events(self) -> None:
        self.cache.check_hicache_events()

    def protect_host(self, node: Node) -> None:
        node.protect_host()

    def release_host(self, node: Node) -> None:
        node.release_host()

    def reset(self) -> None:
        self.cache.reset()

    # -- pools and controller -----------------------------------------------------------------
    def alloc_device(self, num_pages: int) -> list[int] | None:
        return self.device.alloc_pages(num_pages)

    def free_device(self, pages: list[int]) -> None:
        self.device.free(list(pages))

    def clear_device(self) -> None:
        self.device.clear()

    def device_free_list(self) -> list[int]:
        return self.device.free_pages_snapshot()

    def host_free_list(self) -> list[int]:
        return self.host.free_pages_snapshot()

    def finish_writes(self, count: int | None) -> int:
        return self.ctrl.complete_writes(count)

    def finish_loads(self, count: int | None) -> int:
        return self.ctrl.complete_loads(count)

    # -- introspection -------------------------------------------------------------------------
    def root(self) -> Node:
        return self.cache.root

    def children(self, node: Node) -> list[Node]:
        return list(node.children.values())

    def parent(self, node: Node) -> Node | None:
        return node.parent

    def node_id(self, node: Node) -> int:
        return int(node.id)

    def node_tokens(self, node: Node) -> list[int]:
        return _flatten(node.key, self.page_size)

    def node_extra_key(self, node: Node) -> str | None:
        extra: str | None = node.extra_key
        return extra

    def node_fields(self, node: Node) -> dict[str, Any]:
        n: TreeNode = node
        return {
            "value": None if n.value is None else list(n.value),
            "host_value": None if n.host_value is None else list(n.host_value),
            "lock_ref": n.lock_ref,
            "host_ref": n.host_ref_counter,
            "hit_count": n.hit_count,
            "priority": n.priority,
            "pending_write": n.write_through_pending_id,
            "last_access": n.last_access_time,
            "creation": n.creation_time,
        }

    def is_evicted(self, node: Node) -> bool:
        return node.value is None

    def in_tree(self, node: Node) -> bool:
        root = self.cache.root
        while node is not root:
            if not self.cache.is_in_tree(node):
                return False
            node = node.parent
        return True

    def device_prefix(self, tokens: list[int], extra_key: str | None) -> list[int]:
        key = to_page_key(tokens, self.page_size)
        node, off, pages = self.cache.root, 0, []
        while off < len(key):
            child = node.children.get(child_key(key, off, extra_key))
            if child is None or child.value is None:
                break
            if tuple(key[off : off + len(child.key)]) != tuple(child.key):
                break
            pages += child.value
            node, off = child, off + len(child.key)
        return pages

    def evictable_leaves(self) -> Iterable[Node]:
        return self.cache.evictable_leaves

    def evictable_host_leaves(self) -> Iterable[Node]:
        return self.cache.evictable_host_leaves

    def eviction_key(self, node: Node) -> Any:
        return self._key(node)

    def sizes(self) -> tuple[int, int]:
        return self.cache.evictable_size(), self.cache.protected_size()

    def write_records(self) -> list[tuple[int, Node, int, list[Node]]]:
        ps = self.page_size
        return [
            (ack, rec.lock_node, rec.backup_len * ps, list(rec.publish_nodes))
            for ack, rec in self.cache.ongoing_write_through.items()
        ]

    def load_records(self) -> list[tuple[int, Node]]:
        return list(self.cache.ongoing_load_back.items())

    def write_acks(self) -> list[tuple[list[int], bool]]:
        return [([op.node_id], op.done) for op in self.ctrl.write_queue]

    def load_acks(self) -> list[tuple[list[int], bool]]:
        return [(list(b.node_ids), b.done) for b in self.ctrl.load_queue]

    def queued_loads(self) -> list[int]:
        return [op.node_id for op in self.ctrl.pending_loads]
