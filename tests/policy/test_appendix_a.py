"""POLICY_CORE.md Appendix A: scenarios observed on the real SGLang 0.5.14 HiRadixCache.

Same fake pools (device 64 tokens, host 128 tokens, page 1, LRU unless noted) and the same
expected numbers.
"""

from __future__ import annotations

from tests.policy.harness import Harness

T = list(range(1000))  # token ids; a prefix of T is a key


def test_s1_write_through_lifecycle() -> None:
    h = Harness(write_policy="write_through")
    c = h.cache
    # inserting 20 tokens creates a D+H node at once, locked until its ack is processed
    assert h.insert(T[:20]) == 0
    a = h.node(T[:20])
    assert a.backuped and not a.evicted
    assert h.host.available_size() == 128 - 20
    assert (c.protected_size(), c.evictable_size()) == (20, 0)
    h.check()
    h.ack_writes()
    assert (c.protected_size(), c.evictable_size()) == (0, 20)
    # extending to 30 tokens: old node's hit count -> 2 (no new write), new leaf written
    assert h.insert(T[:30]) == 20
    b = h.node(T[:30])
    assert a.hit_count == 2 and b.hit_count == 1
    assert [op.node_id for op in h.ctrl.write_queue] == [b.id]
    assert a.lock_ref == 1 and b.lock_ref == 1  # the leaf's write pins both nodes
    h.check()
    h.ack_writes()
    # evict(15) evicts 30: leaf (10), then the parent pushed into the heap (20)
    assert c.evict(15) == 30
    assert a.evicted and b.evicted and c.evictable_size() == 0
    h.check()
    m = c.match_prefix(T[:40])
    assert (m.device_hit_length, m.host_hit_length) == (0, 30)
    # a 25-token lookup splits the H leaf 5 + 5; the upper half copies the hit count
    m = c.match_prefix(T[:25])
    assert (m.device_hit_length, m.host_hit_length) == (0, 25)
    upper = m.best_match_node
    assert len(upper.key) == 5 and upper.evicted and upper.hit_count == b.hit_count == 1
    assert upper.parent is a and b.parent is upper and len(b.key) == 5
    h.check()
    pages, node = c.init_load_back(m.best_match_node, m.host_hit_length)
    assert len(pages) == 25 and node is upper
    assert a.lock_ref == 1 and upper.lock_ref == 1 and not a.evicted and not upper.evicted
    assert c.protected_size() == 25
    assert c.ready_to_load_host_cache() != -1
    h.check()
    h.ack_loads()
    assert a.lock_ref == 0 and upper.lock_ref == 0 and c.evictable_size() == 25
    h.check()


def test_s1_short_host_hit_is_not_loaded() -> None:
    h = Harness(write_policy="write_through")
    c = h.cache
    h.insert(T[:20])
    h.ack_writes()
    assert c.evict(1) == 20
    m = c.match_prefix(T[:5])  # 5-token host hit (< 10): splits the H node, not loaded
    assert m.host_hit_length == 5
    pages, node = c.init_load_back(m.best_match_node, m.host_hit_length)
    assert pages == [] and node is c.root
    assert c.ready_to_load_host_cache() == -1
    h.check()


def test_s2_write_through_selective() -> None:
    h = Harness(write_policy="write_through_selective")
    h.insert(T[:20])
    a = h.node(T[:20])
    assert a.hit_count == 1 and not a.backuped and not h.ctrl.write_queue
    h.insert(T[:20], chunked=True)  # chunked insert changes nothing
    assert a.hit_count == 1 and not a.backuped
    h.insert(T[:20])  # second non-chunked insert -> hit 2 -> written
    assert a.hit_count == 2 and a.backuped and a.write_through_pending_id == a.id
    assert a.lock_ref == 1
    # inserting a 10-token prefix splits the pending node: both halves pending and locked
    h.insert(T[:10])
    upper = h.node(T[:10])
    assert upper.write_through_pending_id == a.id and a.write_through_pending_id == a.id
    assert upper.lock_ref == 1 and a.lock_ref == 1
    assert upper.hit_count == 3  # copied 2, then +1 by this insert
    h.check()
    h.ack_writes()  # the one ack publishes and unlocks both halves
    assert upper.write_through_pending_id is None and a.write_through_pending_id is None
    assert upper.lock_ref == 0 and a.lock_ref == 0
    h.check()


def test_s3_reinsert_over_host_node_adopts_pages() -> None:
    h = Harness(write_policy="write_through")
    c = h.cache
    h.insert(T[:20])
    h.ack_writes()
    a = h.node(T[:20])
    old_host = list(a.host_value or [])
    c.evict(20)
    assert a.evicted
    ops_before = h.ctrl.write_ops
    hit_before = a.hit_count
    fresh = h.device.alloc_pages(20)
    assert fresh is not None
    assert c.insert(T[:20], fresh) == 0  # no prefix credit
    assert a.value == fresh and a.host_value == old_host  # old host copy kept
    assert h.ctrl.write_ops == ops_before and not h.ctrl.write_queue  # no controller call
    assert a.hit_count == hit_before
    assert c.evictable_size() == 20 and a in c.evictable_leaves
    h.check()


def test_s4_write_back_evict_writes_then_demotes() -> None:
    h = Harness(write_policy="write_back")
    c = h.cache
    h.insert(T[:20])
    h.insert(T[500:530])
    a, b = h.node(T[:20]), h.node(T[500:530])
    assert a.hit_count == b.hit_count == 0 and not h.ctrl.write_queue
    assert c.evict(25) == 50  # 20 < 25, so the second leaf is written too
    assert a.evicted and b.evicted and a.backuped and b.backuped
    assert c.stats.write_back_tokens == 50 and h.ctrl.write_ops == 2
    assert not h.ctrl.write_queue  # waited for
    assert h.device.available_size() == 64 and h.host.available_size() == 128 - 50
    h.check()


def _fill_host(h: Harness, sizes: list[int]) -> None:
    """Insert disjoint keys of the given sizes, write them, and demote them to host-only."""
    base = 0
    for n in sizes:
        h.insert(T[base : base + n])
        h.ack_writes()
        h.cache.evict(n)
        base += n


def test_s5_host_full_evicts_host_then_retries() -> None:
    h = Harness(write_policy="write_through")
    _fill_host(h, [20, 40, 40, 23])  # 123 of 128 host tokens used, all host-only
    first = h.node(T[:20])
    assert h.host.available_size() == 5
    h.insert(T[900:915])  # 15-token write, 5 free: fails, evict_host(15) drops the LRU H leaf
    assert not h.cache.is_in_tree(first)
    assert h.cache.stats.host_evicted_tokens == 20
    new = h.node(T[900:915])
    assert new.backuped and h.host.available_size() == 5 + 20 - 15
    assert h.ctrl.host_alloc_failures == 1
    h.check()


def test_s6b_host_smaller_than_node() -> None:
    h = Harness(device_tokens=64, host_tokens=10, write_policy="write_through")
    c = h.cache
    h.insert(T[:20])
    a = h.node(T[:20])
    assert not a.backuped and h.ctrl.host_alloc_failures == 2  # fail, evict_host, fail
    h.insert(T[:30])
    b = h.node(T[:30])
    # a (hit 2) tried again twice; the child is never attempted (parent not backed up)
    assert h.ctrl.host_alloc_failures == 4 and not b.backuped and b.hit_count == 1
    assert c.evict(30) == 30  # both deleted, not demoted
    assert not c.root.children
    assert c.stats.device_deleted_tokens == 30 and c.stats.device_demoted_tokens == 0
    h.check()


def test_s7_pending_writes_pin_nodes() -> None:
    h = Harness(write_policy="write_through")
    c = h.cache
    h.insert(T[:10])
    h.insert(T[100:110])
    h.insert(T[200:210])
    assert c.evict(64) == 0  # everything pinned by pending writes
    h.ack_writes()
    c.match_prefix(T[:10])
    c.match_prefix(T[200:210])  # T[100:110] is now the least recently used
    assert c.evict(1) == 10
    assert h.node(T[100:110]).evicted
    assert not h.node(T[:10]).evicted and not h.node(T[200:210]).evicted
    h.check()


def test_s8_page_size_4() -> None:
    h = Harness(page_size=4, write_policy="write_through")
    c = h.cache
    value = h.device.alloc_pages(2)
    assert value is not None
    c.insert(T[:10], value)  # 10 tokens -> 8 stored
    ((ck, node),) = c.root.children.items()
    assert ck == (0, 1, 2, 3) and len(node.key) * 4 == 8
    assert c.total_size() == 8
    m = c.match_prefix(T[:7])  # 7 tokens -> 4 aligned; splits the node at 4
    assert m.device_hit_length == 4
    assert len(m.last_device_node.key) == 1 and len(c.root.children[(0, 1, 2, 3)].key) == 1
    h.check()


def test_s9_evict_host_lru_skips_protected() -> None:
    h = Harness(write_policy="write_through")
    c = h.cache
    _fill_host(h, [10, 10, 10])
    oldest, middle, newest = h.node(T[:10]), h.node(T[10:20]), h.node(T[20:30])
    oldest.protect_host()
    assert c.evict_host(5) == 10
    assert c.is_in_tree(oldest) and not c.is_in_tree(middle) and c.is_in_tree(newest)
    h.check()
    oldest.release_host()
    assert c.evict_host(5) == 10  # the protected node was re-queued and is now the LRU
    assert not c.is_in_tree(oldest)
    h.check()
