"""POLICY_CORE.md §2-§4 and §7.2: each behaviour where the obvious implementation differs from
SGLang 0.5.14's."""

from __future__ import annotations

import pytest

from hicache.policy import HiRadixCache, ManualController, PageAllocator, host_pool_tokens
from tests.policy.harness import Harness

T = list(range(2000))


# ------------------------------------------------------------------------------ match_prefix --
def test_match_walks_through_host_nodes_and_reports_deepest_device_node() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:30])
    h.insert(T[:40])
    h.ack_writes()
    c.evict(10)  # demotes only the 10-token leaf [30:40]
    c.match_prefix(T[:20])  # touch the first node so the middle one is the LRU leaf next
    m = c.match_prefix(T[:40])
    assert m.device_hit_length == 30 and m.host_hit_length == 10
    assert m.last_device_node is h.node(T[:30])
    assert m.best_match_node is h.node(T[:40]) is m.last_host_node


def test_best_match_is_deepest_backed_up_node_not_deepest_matched() -> None:
    h = Harness(write_policy="write_through_selective")
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:20])  # second hit: written
    h.ack_writes()
    h.insert(T[:30])  # new leaf: hit 1, not written
    m = c.match_prefix(T[:30])
    assert m.host_hit_length == 0
    assert m.last_device_node is h.node(T[:30])
    assert m.best_match_node is h.node(T[:20])  # an ancestor of last_device_node
    h.check()


def test_match_splits_and_touches_even_without_admission() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    h.insert(T[500:520])
    h.ack_writes()
    before = c.now()
    c.match_prefix(T[:7])  # never admitted: still splits [0:20] at 7 and touches
    upper = h.node(T[:7])
    assert len(upper.key) == 7 and len(h.node(T[:20]).key) == 13
    assert upper.last_access_time > before
    # the split upper node is created after the child was touched: it is the newer one
    assert upper.creation_time == upper.last_access_time > h.node(T[:20]).last_access_time
    # LRU now prefers the subtree the lookup did not touch
    assert c.evict(1) == 20
    assert h.node(T[500:520]).evicted and not h.node(T[:20]).evicted
    h.check()


def test_match_touches_host_nodes_for_host_lru() -> None:
    h = Harness()
    c = h.cache
    _demote_all(h, [(0, 10), (10, 20)])  # two disjoint host-only nodes, [0:10] older
    c.match_prefix(T[0:10])  # touch the older one through a match (host hit)
    assert c.evict_host(1) == 10
    assert c.is_in_tree(h.node(T[0:10])) and T[10] not in c.root.children


def _demote_all(h: Harness, ranges: list[tuple[int, int]]) -> None:
    for lo, hi in ranges:
        h.insert(T[lo:hi])
    h.ack_writes()
    h.cache.evict(10**9)


# ------------------------------------------------------------------------------------ insert --
def test_insert_prefix_len_counts_device_nodes_only_and_partial_adopt() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:30])
    h.ack_writes()
    c.evict(30)
    # re-insert the first 20 tokens + 10 new: splits the H node, the upper part adopts pages
    fresh = h.device.alloc_pages(30)
    assert fresh is not None
    assert c.insert(T[:20] + T[1000:1010], fresh) == 0
    upper = h.node(T[:20])
    assert upper.value == fresh[:20] and upper.backuped and upper.hit_count == 1
    new_leaf = h.node(T[:20] + T[1000:1010])
    assert new_leaf.value == fresh[20:] and new_leaf.backuped  # under a backed-up parent
    lower = h.node(T[:30])
    assert lower.evicted  # the H remainder stays on host
    h.check()
    h.ack_writes()
    # a second insert now gets credit for the device part
    again = h.device.alloc_pages(30)
    assert again is not None
    assert c.insert(T[:20] + T[1000:1010], again) == 30
    h.device.free(again)
    h.check()


def test_new_leaf_hit_counts_per_policy() -> None:
    for policy, hit, written in [
        ("write_through", 1, True),
        ("write_through_selective", 1, False),
        ("write_back", 0, False),
    ]:
        h = Harness(write_policy=policy)
        h.insert(T[:20])
        node = h.node(T[:20])
        assert (node.hit_count, node.backuped) == (hit, written), policy
        h.insert(T[:20], chunked=True)
        assert node.hit_count == hit, policy


def test_write_back_never_counts_hits_and_match_never_counts() -> None:
    h = Harness(write_policy="write_back")
    for _ in range(3):
        h.insert(T[:20])
        h.cache.match_prefix(T[:20])
    assert h.node(T[:20]).hit_count == 0
    h2 = Harness(write_policy="write_through")
    h2.insert(T[:20])
    for _ in range(3):
        h2.cache.match_prefix(T[:20])
    assert h2.node(T[:20]).hit_count == 1


def test_priority_propagates_as_max_along_path() -> None:
    h = Harness(eviction_policy="priority")
    h.insert(T[:20], priority=5)
    h.insert(T[:10] + T[100:110], priority=2)  # splits [0:20] at 10
    upper = h.node(T[:10])
    assert upper.priority == 5  # split copies 5, insert keeps the max
    assert h.node(T[:20]).priority == 5
    assert h.node(T[:10] + T[100:110]).priority == 2
    h.insert(T[:10], priority=9)
    assert upper.priority == 9 and h.node(T[:20]).priority == 5


def test_extra_key_namespaces_never_share_nodes() -> None:
    h = Harness()
    c = h.cache
    pages = h.device.alloc_pages(20)
    assert pages is not None
    c.insert(T[:20], pages, extra_key="lora-a")
    assert c.match_prefix(T[:20]).device_hit_length == 0
    assert c.match_prefix(T[:20], extra_key="lora-b").device_hit_length == 0
    assert c.match_prefix(T[:20], extra_key="lora-a").device_hit_length == 20
    h.check()


# ------------------------------------------------------------------------------------- locks --
def test_lock_deltas_and_sizes() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:30])
    h.ack_writes()
    leaf = h.node(T[:30])
    assert c.inc_lock_ref(leaf) == -30
    assert c.inc_lock_ref(leaf) == 0
    assert (c.evictable_size(), c.protected_size()) == (0, 30)
    assert c.evict(30) == 0
    assert c.dec_lock_ref(leaf) == 0
    assert c.dec_lock_ref(leaf) == 30
    assert (c.evictable_size(), c.protected_size()) == (30, 0)
    h.check()


# ----------------------------------------------------------------------------- write_backup --
def test_host_full_evicts_full_node_length_not_shortfall() -> None:
    h = Harness(host_tokens=35)
    _demote_all(h, [(0, 10), (10, 20), (20, 30)])  # 30 of 35 host tokens, 3 H leaves
    assert h.host.available_size() == 5
    h.insert(T[500:515])  # needs 15: shortfall is 10 (one leaf) but it asks for 15 (two)
    assert h.cache.stats.host_evicted_tokens == 20
    assert h.host.available_size() == 5 + 20 - 15
    h.check()


def test_writing_check_is_fifo_and_stops_at_first_incomplete() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:10])
    h.insert(T[100:110])
    a, b = h.node(T[:10]), h.node(T[100:110])
    h.ctrl.complete_write_of(b.id)  # the second finishes first
    c.writing_check()
    assert a.lock_ref == 1 and b.lock_ref == 1  # the ack queue is FIFO
    assert b.write_through_pending_id is not None
    h.ctrl.complete_write_of(a.id)
    c.writing_check()
    assert a.lock_ref == 0 and b.lock_ref == 0
    h.check()


# ------------------------------------------------------------------------------------- evict --
def test_parent_pushed_into_same_heap_competes_with_leaves() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:30])  # parent [0:20] touched before leaf [20:30] is created
    h.insert(T[500:510])  # newest leaf
    h.ack_writes()
    # leaves: [20:30] (older) and [500:510]; after the first goes, its parent (older than
    # [500:510]) is pushed and evicted next: 10 + 20 = 30, the newer leaf stays.
    assert c.evict(15) == 30
    assert h.node(T[:20]).evicted and not h.node(T[500:510]).evicted
    h.check()


def test_write_through_deletes_unbacked_nodes_instead_of_demoting() -> None:
    h = Harness(write_policy="write_through_selective")
    c = h.cache
    h.insert(T[:20])  # hit 1: not written
    assert c.evict(1) == 20
    assert not c.root.children and c.stats.device_deleted_tokens == 20
    h.check()


def test_write_back_writes_parent_chain_in_one_eviction() -> None:
    h = Harness(write_policy="write_back")
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:30])
    assert c.evict(15) == 30  # leaf written (10 < 15), parent pushed and written too
    a, b = h.node(T[:20]), h.node(T[:30])
    assert a.evicted and b.evicted and a.backuped and b.backuped
    h.check()
    assert c.evict(1) == 0  # nothing left on device
    m = c.match_prefix(T[:30])
    assert m.host_hit_length == 30


def test_write_back_failed_write_leaves_node_on_device() -> None:
    h = Harness(host_tokens=10, write_policy="write_back")
    c = h.cache
    h.insert(T[:20])
    assert c.evict(20) == 0
    assert not h.node(T[:20]).evicted and c.stats.backup_failures == 1
    h.check()
    assert c.evict(20) == 0  # still a candidate next call (tried again)
    assert c.stats.backup_failures == 2


def _serve(h: Harness, tokens: list[int]) -> None:
    """One request as the scheduler runs it: match, load back, lock, allocate (evicting on
    failure), launch loads, insert, unlock, process write acks."""
    c = h.cache
    m = c.match_prefix(tokens)
    prefix, last = list(m.device_indices), m.last_device_node
    if m.host_hit_length:
        c.inc_lock_ref(last)
        loaded, new_last = c.init_load_back(m.best_match_node, m.host_hit_length)
        c.dec_lock_ref(last)
        prefix, last = prefix + loaded, new_last
    c.inc_lock_ref(last)
    need = len(tokens) - len(prefix)
    fresh = h.device.alloc_pages(need)
    if fresh is None:
        c.evict(need)
        fresh = h.device.alloc_pages(need)
    assert fresh is not None
    c.ready_to_load_host_cache()
    h.ack_loads()
    prefix_len = c.insert(tokens, prefix + fresh)
    if prefix_len > len(prefix):
        h.device.free(fresh[: prefix_len - len(prefix)])
    c.dec_lock_ref(last)
    c.writing_check()


def test_load_back_chain_survives_nested_write_back_eviction() -> None:
    """The SGLang 0.5.14 double free (found by driving the real class): load_back's nested
    evict under write_back fails a write, evict_host deletes the host-only node being loaded,
    the load then fills the detached node, and its device pages end up owned twice and freed
    twice. Device 16, host 17 (ratio 1.0 with the extra page), page 1, LRU."""
    h = Harness(device_tokens=16, host_tokens=17, write_policy="write_back")
    for tok in (1, 2, 1, 3, 4):
        _serve(h, [tok] * 10)
        h.check()  # each device page is free xor owned by exactly one tree node
    # with the chain pinned, the host pool cannot make room for the write-back, so the load
    # fails cleanly and the third request recomputes its prefix
    assert h.cache.stats.load_back_failures == 1 and h.cache.stats.loaded_tokens == 0


@pytest.mark.interpreted_only
def test_write_back_demotes_only_written_nodes_still_in_the_tree() -> None:
    """Belt and braces for the end of a write_back eviction: a written node that is no longer
    in the tree when the writes are waited for must not be demoted (its pages would be freed
    twice). Not reachable from a consistent state in 0.5.14 (see the test above for the real
    path), so the detachment is staged by hand between the write and the demotion."""
    h = Harness(write_policy="write_back")
    c = h.cache
    h.insert(T[:10])
    h.insert(T[100:110])
    a = h.node(T[:10])
    real_check = c.writing_check

    def detach_then_check(write_back: bool = False) -> None:
        real_check(write_back)
        if write_back and c.is_in_tree(a):
            del c.root.children[a.key[0]]  # as if evict_host had deleted it
            c.evictable_leaves.discard(a)

    c.writing_check = detach_then_check  # type: ignore[method-assign]
    free_before = h.device.available_size()
    c.evict(20)
    assert a.value is not None  # not demoted: its pages were not freed a second time
    assert h.device.available_size() == free_before + 10  # only [100:110]'s pages came back
    assert len(set(h.device.free_pages_snapshot())) == len(h.device.free_pages_snapshot())


# ------------------------------------------------------------------------------- evict_host --
def test_evict_host_never_drops_device_resident_copies() -> None:
    h = Harness(host_tokens=30)
    c = h.cache
    h.insert(T[:20])
    h.ack_writes()  # D+H, evictable
    assert c.evict_host(20) == 0
    assert h.node(T[:20]).backuped
    h.check()


def test_evict_host_pushes_parent_when_it_becomes_a_childless_host_leaf() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:30])
    h.ack_writes()
    c.evict(100)
    assert c.evict_host(15) == 30  # leaf (10), then its parent (20)
    assert not c.root.children
    h.check()


# -------------------------------------------------------------------------------- load_back --
def test_load_back_threshold_is_ten_tokens() -> None:
    for n, loaded in [(9, False), (10, True)]:
        h = Harness()
        c = h.cache
        h.insert(T[:n])
        h.ack_writes()
        c.evict(n)
        m = c.match_prefix(T[:n])
        pages, _ = c.init_load_back(m.best_match_node, m.host_hit_length)
        assert (len(pages) == n) is loaded
        h.check()


def test_load_back_locks_the_device_ancestor_during_its_eviction() -> None:
    # fifo: creation order decides, so the ancestor [0:10] would be the first victim if
    # load_back did not lock it while evicting for its own pages
    h = Harness(device_tokens=64, host_tokens=200, eviction_policy="fifo")
    c = h.cache
    h.insert(T[:10])
    h.insert(T[:25])  # ancestor A = [0:10], B = [10:25]
    h.ack_writes()
    assert c.evict(15) == 15  # demotes B only
    a, b = h.node(T[:10]), h.node(T[:25])
    assert b.evicted and not a.evicted
    for i in range(5):  # 10 + 50 device tokens used, 4 free
        h.insert(T[1000 + 100 * i : 1010 + 100 * i])
    h.ack_writes()
    m = c.match_prefix(T[:25])
    assert m.device_hit_length == 10 and m.host_hit_length == 15
    pages, node = c.init_load_back(m.best_match_node, m.host_hit_length)
    assert len(pages) == 15 and node is b
    assert not a.evicted and b.value == pages
    assert c.stats.device_demoted_tokens == 15 + 20  # two of the five leaves made room
    h.check()
    h.ack_loads()
    h.check()


def test_load_back_requests_full_length_not_shortfall() -> None:
    h = Harness(device_tokens=64, host_tokens=200)
    c = h.cache
    h.insert(T[:20])
    h.ack_writes()
    c.evict(20)  # [0:20] host-only, device empty
    for i in range(11):  # 55 device tokens in eleven 5-token leaves, 9 free
        h.insert(T[1000 + 100 * i : 1005 + 100 * i])
    h.ack_writes()
    m = c.match_prefix(T[:20])
    pages, _ = c.init_load_back(m.best_match_node, m.host_hit_length)
    assert len(pages) == 20
    # the shortfall is 11 (three leaves); SGLang asks evict(20): four leaves go
    assert c.stats.device_demoted_tokens == 20 + 20
    h.check()


def test_load_back_failure_returns_deepest_device_ancestor() -> None:
    h = Harness(device_tokens=32, host_tokens=100)
    c = h.cache
    h.insert(T[:10])
    h.insert(T[:30])
    h.ack_writes()
    assert c.evict(20) == 20  # B = [10:30] demoted, A = [0:10] stays
    a = h.node(T[:10])
    m = c.match_prefix(T[:30])
    assert m.device_hit_length == 10 and m.host_hit_length == 20
    held = h.device.alloc_pages(h.device.free_page_count())  # a running batch holds the rest
    assert held is not None
    got, node = c.init_load_back(m.best_match_node, m.host_hit_length)
    assert got == [] and node is a  # A is locked by load_back, so nothing could be evicted
    assert c.stats.load_back_failures == 1 and a.lock_ref == 0
    c.check_invariants(device_pages_outside=held)


def test_ready_to_load_merges_batch_loads() -> None:
    h = Harness()
    c = h.cache
    _demote_all(h, [(0, 10), (10, 20)])
    assert c.ready_to_load_host_cache() == -1
    for lo in (0, 10):
        m = c.match_prefix(T[lo : lo + 10])
        c.init_load_back(m.best_match_node, m.host_hit_length)
    assert c.ready_to_load_host_cache() != -1
    assert len(h.ctrl.load_queue) == 1 and len(h.ctrl.load_queue[0].node_ids) == 2
    h.ack_loads()
    assert c.protected_size() == 0
    h.check()


# ------------------------------------------------------------------------------------- reset --
def test_reset_clears_host_pool_and_node_ids() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    c.flush()
    assert c.root.id == 0 and not c.root.children
    assert h.host.available_size() == 128 and h.device.available_size() == 64
    h.insert(T[:5])
    assert h.node(T[:5]).id == 1
    h.check()


# ---------------------------------------------------------------------------- strategies §3 --
def _three_leaves(policy: str, write_policy: str = "write_through") -> Harness:
    """Leaves X (oldest, hit 3), Y (hit 1), Z (newest, hit 2)."""
    h = Harness(
        device_tokens=200, host_tokens=400, eviction_policy=policy, write_policy=write_policy
    )
    h.insert(T[:10], priority=3)  # X
    h.insert(T[100:110], priority=1)  # Y
    h.insert(T[200:210], priority=2)  # Z
    h.insert(T[:10])
    h.insert(T[:10])  # X: hits 3
    h.insert(T[200:210])  # Z: hits 2
    h.ack_writes()
    h.cache.match_prefix(T[:10])  # X becomes the most recently used
    return h


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("lru", ["Y", "Z", "X"]),
        ("mru", ["X", "Z", "Y"]),
        ("fifo", ["X", "Y", "Z"]),
        ("filo", ["Z", "Y", "X"]),
        ("lfu", ["Y", "Z", "X"]),
        ("slru", ["Y", "Z", "X"]),
        ("priority", ["Y", "Z", "X"]),
    ],
)
def test_strategy_orders(policy: str, order: list[str]) -> None:
    h = _three_leaves(policy)
    nodes = {"X": h.node(T[:10]), "Y": h.node(T[100:110]), "Z": h.node(T[200:210])}
    seen = []
    for _ in range(3):
        h.cache.evict(1)
        for name, n in nodes.items():
            if n.evicted and name not in seen:
                seen.append(name)
    assert seen == order


def test_lfu_and_slru_differ_from_lru_when_recency_and_frequency_disagree() -> None:
    def first_victim(policy: str) -> str:
        h = Harness(device_tokens=200, host_tokens=400, eviction_policy=policy)
        h.insert(T[:10])
        h.insert(T[:10])
        h.insert(T[:10])  # A: 3 hits, oldest touches
        h.insert(T[100:110])  # B: 1 hit, newer
        h.ack_writes()
        h.cache.evict(1)
        return "A" if h.node(T[:10]).evicted else "B"

    assert first_victim("lru") == "A"
    assert first_victim("lfu") == "B"
    assert first_victim("slru") == "B"


def test_lfu_degrades_to_lru_under_write_back() -> None:
    h = Harness(
        device_tokens=200, host_tokens=400, eviction_policy="lfu", write_policy="write_back"
    )
    h.insert(T[:10])
    h.insert(T[:10])
    h.insert(T[:10])
    h.insert(T[100:110])
    h.cache.evict(1)
    assert h.node(T[:10]).evicted  # hit counts are all 0: plain recency decides


def test_unknown_strategy_and_policy_rejected() -> None:
    dev = PageAllocator(8, 1)
    with pytest.raises(ValueError, match="unknown eviction strategy"):
        HiRadixCache(ManualController(dev, None), eviction_policy="random")
    with pytest.raises(ValueError, match="unknown write policy"):
        HiRadixCache(ManualController(dev, None), write_policy="write_around")


# --------------------------------------------------------------------------- sizing §4.2 --
def test_host_pool_sizing_examples() -> None:
    assert host_pool_tokens(100_000, 1, hicache_ratio=2.0) == 200_001
    assert host_pool_tokens(100_000, 64, hicache_ratio=2.0) == (200_000 // 64 + 1) * 64
    llama8b = 2 * 32 * 8 * 128 * 2
    assert host_pool_tokens(10_000, 1, hicache_size_gb=100, bytes_per_token=llama8b) == 762_940
    with pytest.raises(ValueError, match="larger than the device pool"):
        host_pool_tokens(100_000, 1, hicache_ratio=0.5)
    # a finite ratio whose pool overflows a float: an error, not an OverflowError from int()
    with pytest.raises(ValueError, match="too large"):
        host_pool_tokens(8192, 1, hicache_ratio=1e308)


# ------------------------------------------------------------------------ plain radix mode --
def test_no_host_tier_is_a_plain_radix_cache() -> None:
    h = Harness(host_tokens=None)
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:20])
    n = h.node(T[:20])
    assert n.hit_count == 2 and not n.backuped and not h.ctrl.write_queue
    assert c.evict(1) == 20 and not c.root.children
    h.check()


# ------------------------------------------------------------- the persistent eviction heap --
def test_node_that_stopped_being_a_leaf_is_not_evicted_from_an_old_heap_entry() -> None:
    h = Harness(write_policy="write_through_selective")
    c = h.cache
    h.insert(T[:20])
    h.insert(T[:20])  # written (2 hits)
    h.ack_writes()
    h.insert(T[100:105])
    c.match_prefix(T[:20])
    assert c.evict(5) == 5  # builds heap entries for both leaves, evicts [100:105] only
    h.insert(T[:30])  # [0:20] gains a device child (not written: 1 hit): no longer a leaf
    a, b = h.node(T[:20]), h.node(T[:30])
    assert a not in c.evictable_leaves
    assert c.evict(1) == 10  # the child goes first (deleted: no host copy) ...
    assert not c.is_in_tree(b) and not a.evicted
    h.check()
    assert c.evict(1) == 20  # ... and only then its parent
    h.check()


def test_heap_order_matches_a_fresh_heap_per_call() -> None:
    """Many evictions interleaved with touches: the persistent heap must pick exactly the node
    a freshly built heap over the evictable leaves would pick (SGLang's per-call heap)."""
    import random

    from hicache.policy.eviction import get_strategy

    rng = random.Random(7)
    for policy in ["lru", "lfu", "slru", "fifo", "mru", "filo", "priority"]:
        h = Harness(device_tokens=400, host_tokens=800, eviction_policy=policy)
        c = h.cache
        keyfn = get_strategy(policy)
        for step in range(300):
            lo = rng.randrange(0, 40) * 10
            if h.device.available_size() < 30:
                c.evict(30)
            h.insert(T[lo : lo + rng.choice([10, 20, 30])], priority=rng.randrange(3))
            h.ack_writes()
            if step % 3 == 0:
                c.match_prefix(T[lo : lo + 10])
            if step % 4 == 0 and c.evictable_leaves:
                expect = min(c.evictable_leaves, key=keyfn)
                c.evict(1)
                assert expect.evicted, (policy, step)
            h.check()


def test_allocators_reuse_pages_in_sglang_order() -> None:
    fifo = PageAllocator(6, 1, reuse="fifo")
    a = fifo.alloc_pages(4)
    assert a == [0, 1, 2, 3]
    fifo.free([3, 1])
    assert fifo.free_pages_snapshot() == [4, 5, 3, 1]  # appended at the tail
    front = PageAllocator(6, 64, reuse="front")
    b = front.alloc_pages(4)
    assert b == [0, 1, 2, 3]
    front.free([3, 1, 3])
    assert front.free_pages_snapshot() == [1, 3, 4, 5]  # sorted, unique, reused first
    assert front.alloc_pages(1) == [1]
    assert front.alloc(64 * 3) == [3, 4, 5] and front.alloc(64) is None
    with pytest.raises(ValueError, match="not a multiple of page_size"):
        front.alloc(10)


def test_free_distinct_leaves_the_free_list_as_free_does() -> None:
    """The policy core's frees skip SGLang's de-duplication; for distinct pages the resulting
    free lists (hence every later page id) are the same as ``free`` gives."""
    for reuse, page_size in (("front", 64), ("fifo", 1)):
        a = PageAllocator(12, page_size, reuse=reuse)
        b = PageAllocator(12, page_size, reuse=reuse)
        for pool in (a, b):
            assert pool.alloc_pages(9) == list(range(9))
            assert pool.alloc_pages(1) == [9]  # the head list is read from an offset now
        for batch in ([7, 2, 5], [], [0, 8], [9, 1]):
            a.free(list(batch))
            b.free_distinct(list(batch))
            assert a.free_pages_snapshot() == b.free_pages_snapshot()
            assert a.free_page_count() == b.free_page_count()
        assert a.alloc_pages(6) == b.alloc_pages(6)
    front = PageAllocator(4, 64, reuse="front")
    front.alloc_pages(4)
    front.free_distinct([3, 1])
    assert front.free_pages_snapshot() == [1, 3]  # sorted at the head, as free does


def test_match_limit_matches_only_a_prefix_without_copying() -> None:
    h = Harness()
    c = h.cache
    h.insert(T[:20])
    m = c.match_prefix(T[:20], limit=19)
    assert m.device_hit_length == 19 and len(h.node(T[:19]).key) == 19  # split at 19
    assert c.match_prefix(T[:20], limit=0).device_hit_length == 0
    h.check()
