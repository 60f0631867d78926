"""Property test: random operation sequences against the policy core, checked after every step.

The machine plays a caller (requests that match, load, lock, insert and unlock) and the copy
engine (writes and loads that finish in order, when a rule says so). After every step:
``check_invariants`` (structure, prefix closures, locks, sizes, leaf sets, pending records,
allocator conservation) and a content check against a naive reference: every page the tree maps
holds exactly the data of the key prefix it is filed under (pages carry their content through
the controller's copies), and every matched prefix is a prefix of some inserted key.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from hicache.policy import HiRadixCache, ManualController, PageAllocator, TreeNode, to_page_key
from hicache.policy.allocator import device_pool
from hicache.policy.controller import LoadOp, WriteOp

ALPHABET = st.integers(min_value=0, max_value=2)
KEYS = st.lists(ALPHABET, min_size=0, max_size=14)


class ContentController(ManualController):
    """A ManualController whose pages carry content: the copies move it between the tiers."""

    def __init__(self, device: PageAllocator, host: PageAllocator | None) -> None:
        super().__init__(device, host)
        self.dev: dict[int, Any] = {}
        self.host_data: dict[int, Any] = {}

    def _issue_write(self, op: WriteOp) -> None:
        for d, h in zip(op.device_pages, op.host_pages, strict=True):
            self.host_data[h] = self.dev[d]

    def load(self, host_pages: list[int], node_id: int) -> list[int] | None:
        out = super().load(host_pages, node_id)
        if out is not None:
            op: LoadOp = self.pending_loads[-1]
            for d, h in zip(op.device_pages, op.host_pages, strict=True):
                self.dev[d] = self.host_data[h]
        return out


class PolicyMachine(RuleBasedStateMachine):
    cache: HiRadixCache
    ctrl: ContentController

    @initialize(
        page_size=st.sampled_from([1, 4]),
        write_policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
        eviction=st.sampled_from(["lru", "lfu", "slru", "fifo", "priority"]),
        device_pages=st.integers(min_value=4, max_value=12),
        host_extra=st.integers(min_value=1, max_value=12),
    )
    def setup(
        self, page_size: int, write_policy: str, eviction: str, device_pages: int, host_extra: int
    ) -> None:
        self.ps = page_size
        device = device_pool(device_pages, page_size)
        host = PageAllocator(device_pages + host_extra, page_size, "host")
        self.ctrl = ContentController(device, host)
        self.cache = HiRadixCache(self.ctrl, write_policy=write_policy, eviction_policy=eviction)
        self.inserted: set[tuple[Any, ...]] = set()  # every prefix of every inserted key
        self.held: list[TreeNode] = []  # nodes locked by "running requests"

    # ------------------------------------------------------------------------------ rules --
    @rule(tokens=KEYS)
    def match(self, tokens: list[int]) -> None:
        m = self.cache.match_prefix(tokens)
        key = to_page_key(tokens, self.ps)
        got = len(m.device_indices)
        for i, page in enumerate(m.device_indices):
            assert self.ctrl.dev[page] == key[: i + 1], "device page holds other content"
        matched = got + m.host_hit_length // self.ps
        assert matched <= len(key)
        if matched:
            assert key[:matched] in self.inserted, "matched a prefix that was never inserted"

    @rule(tokens=KEYS, chunked=st.booleans(), priority=st.integers(0, 3), lock=st.booleans())
    def request(self, tokens: list[int], chunked: bool, priority: int, lock: bool) -> None:
        """match -> load back a host hit -> lock -> insert the whole key -> maybe keep the lock."""
        c = self.cache
        key = to_page_key(tokens, self.ps)
        m = c.match_prefix(tokens)
        prefix = list(m.device_indices)
        last = m.last_device_node
        if m.host_hit_length:
            loaded, last = c.init_load_back(m.best_match_node, m.host_hit_length)
            prefix += loaded
        c.inc_lock_ref(last)
        need = len(key) - len(prefix)
        fresh = self.ctrl.device.alloc_pages(need)
        if fresh is None:
            c.evict(need * self.ps)
            fresh = self.ctrl.device.alloc_pages(need)
        if fresh is None:
            c.dec_lock_ref(last)
            return
        for i, page in enumerate(fresh):
            self.ctrl.dev[page] = key[: len(prefix) + i + 1]
        prefix_len = c.insert(tokens, prefix + fresh, chunked=chunked, priority=priority)
        # the caller frees its duplicates: fresh pages that fall inside the device prefix
        dup = prefix_len // self.ps - len(prefix)
        if dup > 0:
            self.ctrl.device.free(fresh[:dup])
        for i in range(1, len(key) + 1):
            self.inserted.add(key[:i])
        c.dec_lock_ref(last)
        if lock and key:
            node = c.match_prefix(tokens).last_device_node
            c.inc_lock_ref(node)
            self.held.append(node)

    @precondition(lambda self: bool(self.held))
    @rule(i=st.integers(min_value=0, max_value=50))
    def unlock(self, i: int) -> None:
        node = self.held.pop(i % len(self.held))
        self.cache.dec_lock_ref(node)

    @rule(n=st.integers(min_value=1, max_value=40))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(n=st.integers(min_value=1, max_value=40))
    def evict_host(self, n: int) -> None:
        self.cache.evict_host(n)

    @rule(count=st.integers(min_value=0, max_value=3))
    def finish_writes(self, count: int) -> None:
        self.ctrl.complete_writes(count)
        self.cache.writing_check()

    @rule(count=st.integers(min_value=0, max_value=2))
    def finish_loads(self, count: int) -> None:
        self.cache.ready_to_load_host_cache()
        self.ctrl.complete_loads(count)
        self.cache.loading_check()

    @rule(tokens=KEYS)
    def protect_then_release_host(self, tokens: list[int]) -> None:
        m = self.cache.match_prefix(tokens)
        node = m.best_match_node
        if node is self.cache.root:
            return
        node.protect_host()
        self.cache.evict_host(self.ps * 4)
        assert self.cache.is_in_tree(node), "evict_host dropped a host-protected node"
        node.release_host()

    # ------------------------------------------------------------------------- invariants --
    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants(device_pages_outside=[])
        # content: every page filed under a key prefix holds that prefix's data
        stack: list[tuple[TreeNode, tuple[Any, ...]]] = [(self.cache.root, ())]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                cpath = path + child.key
                base = len(path)
                for i in range(len(child.key)):
                    want = cpath[: base + i + 1]
                    if child.value is not None:
                        assert self.ctrl.dev[child.value[i]] == want, "device content mismatch"
                    if child.host_value is not None:
                        assert self.ctrl.host_data[child.host_value[i]] == want, "host mismatch"
                assert cpath in self.inserted
                stack.append((child, cpath))

    def teardown(self) -> None:
        if not hasattr(self, "cache"):
            return
        for node in self.held:
            self.cache.dec_lock_ref(node)
        self.held.clear()
        self.ctrl.complete_all()
        self.cache.ready_to_load_host_cache()
        self.ctrl.complete_all()
        self.cache.check_hicache_events()
        assert self.cache.protected_size() == 0, "locks leaked after every holder released"
        self.cache.check_invariants(device_pages_outside=[])


PolicyMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestPolicyMachine = PolicyMachine.TestCase
