"""A small driver around the policy core for tests: pools, a manual controller, helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache.policy import HiRadixCache, ManualController, PageAllocator, to_page_key
from hicache.policy.allocator import device_pool


class Harness:
    """Owns the pools, the ManualController and the cache, and plays the caller's part.

    ``insert`` behaves like SGLang's callers: the caller holds its own device pages for the whole
    key (fresh ones here), inserts them and frees its duplicates ``[0, prefix_len)``.
    """

    def __init__(
        self,
        device_tokens: int = 64,
        host_tokens: int | None = 128,
        page_size: int = 1,
        write_policy: str = "write_through",
        eviction_policy: str = "lru",
    ) -> None:
        self.page_size = page_size
        self.device = device_pool(device_tokens // page_size, page_size)
        self.host = (
            None
            if host_tokens is None
            else PageAllocator(host_tokens // page_size, page_size, "host")
        )
        self.ctrl = ManualController(self.device, self.host)
        self.cache = HiRadixCache(
            self.ctrl, write_policy=write_policy, eviction_policy=eviction_policy
        )

    def key(self, tokens: Sequence[Any]) -> tuple[Any, ...]:
        return to_page_key(tokens, self.page_size)

    def insert(self, tokens: Sequence[Any], *, chunked: bool = False, priority: int = 0) -> int:
        """Insert like a request would: the device prefix it already shares with the tree (whole
        nodes, found without touching) plus fresh pages for the rest; duplicates are freed."""
        key = self.key(tokens)
        shared = self._device_prefix(key)
        fresh = self.device.alloc_pages(len(key) - len(shared))
        if fresh is None:
            raise AssertionError(
                f"device pool cannot supply pages for a {len(tokens)}-token insert"
            )
        prefix = self.cache.insert(tokens, shared + fresh, chunked=chunked, priority=priority)
        dup = prefix // self.page_size - len(shared)
        if dup > 0:
            self.device.free(fresh[:dup])
        return prefix

    def _device_prefix(self, key: tuple[Any, ...]) -> list[int]:
        node, off, pages = self.cache.root, 0, []
        while off < len(key):
            child = node.children.get(key[off])
            if child is None or child.value is None or key[off : off + len(child.key)] != child.key:
                break
            pages += child.value
            node, off = child, off + len(child.key)
        return pages

    def ack_writes(self) -> None:
        self.ctrl.complete_writes()
        self.cache.writing_check()

    def ack_loads(self) -> None:
        self.ctrl.complete_loads()
        self.cache.loading_check()

    def node(self, tokens: Sequence[Any]) -> Any:
        """The node whose path ends exactly after ``tokens`` (walks without touching)."""
        key = self.key(tokens)
        node = self.cache.root
        off = 0
        while off < len(key):
            node = node.children[key[off]]
            off += len(node.key)
        assert off == len(key), f"no node ends after {len(tokens)} tokens"
        return node

    def check(self) -> None:
        self.cache.check_invariants(device_pages_outside=[])
