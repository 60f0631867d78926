"""Scenario tests of the 0.5.23 core (hicache.policy.v0523): one per behaviour of
shared/design/SGLANG_0523.md that differs from 0.5.14."""

from __future__ import annotations

import pytest

from hicache.policy import ManualController, PageAllocator
from hicache.policy.radix import to_page_key
from hicache.policy.v0523 import UnifiedRadixCache, UNode


def make(
    device: int = 64, host: int = 128, page: int = 1, policy: str = "write_through", ev: str = "lru"
) -> tuple[UnifiedRadixCache, ManualController]:
    dev = PageAllocator(device // page, page, "device")
    hst = PageAllocator(host // page, page, "host") if host else None
    ctrl = ManualController(dev, hst)
    return UnifiedRadixCache(ctrl, write_policy=policy, eviction_policy=ev), ctrl


def put(
    c: UnifiedRadixCache, tokens: list[int], inserted_len: int = 0, priority: int = 0
) -> tuple[int, UNode]:
    """A request that matched nothing inserts ``tokens`` on fresh pages."""
    key = to_page_key(tokens, c.page_size)
    pages = c.controller.device.alloc_pages(len(key))
    assert pages is not None
    return c.insert(key, pages, prev_prefix_len=0, inserted_len=inserted_len, priority=priority)


def settle(c: UnifiedRadixCache, ctrl: ManualController) -> None:
    c.flush_pending_backups()
    ctrl.complete_all()
    c.check_hicache_events()


def test_eviction_for_an_allocation_frees_only_the_shortfall() -> None:
    c, ctrl = make(device=32, host=0)
    put(c, list(range(100, 116)))
    put(c, list(range(200, 216)))
    assert ctrl.device.available_size() == 0
    # 0.5.14 evicted the whole request size; 0.5.23 walks until 10 more tokens are free: one
    # 16-token leaf (victims are whole nodes)
    assert c.evict_for_alloc(10) == 16
    assert ctrl.device.available_size() == 16
    assert c.evictable_size() == 16


def test_write_through_backs_up_unbacked_ancestors_parent_first() -> None:
    c, ctrl = make(policy="write_through_selective")  # threshold 2
    put(c, [1, 2, 3, 4])
    # a second request sharing [1, 2] splits the node: the prefix gets hit 2 -> backed up;
    # the new leaf [5, 6] reaches 1 only
    fresh = ctrl.device.alloc_pages(2) or []
    prefix, _ = c.insert(to_page_key([1, 2, 5, 6], 1), [0, 1, *fresh])
    assert prefix == 2
    c.flush_pending_backups()
    assert [op.node_ids for op in ctrl.write_queue] and len(ctrl.write_queue) == 1
    # a third request hitting [1, 2, 5, 6] backs up [5, 6]; its parent is already backed up
    leaf = c.match_prefix(to_page_key([1, 2, 5, 6], 1)).last_device
    assert leaf.host_value is None
    # the chain rule: an unbacked leaf under an unbacked parent is backed up with it
    c2, ctrl2 = make(policy="write_through_selective")
    put(c2, [1, 2, 3, 4])
    fresh = ctrl2.device.alloc_pages(2) or []
    c2.insert(to_page_key([1, 2, 3, 4, 7, 8], 1), [0, 1, 2, 3, *fresh], prev_prefix_len=4)
    # [1..4] reaches 2 hits (backed up); [7, 8] is new (1 hit)
    c2.insert(to_page_key([1, 2, 3, 4, 7, 8], 1), [0, 1, 2, 3, 4, 5], prev_prefix_len=6)
    c2.flush_pending_backups()
    ids = [i for op in ctrl2.write_queue for i in (op.node_ids or [op.node_id])]
    nodes = [c2.tree.nodes[i] for i in ids]
    assert [len(n.key) for n in nodes] == [4, 2], "ancestor [1..4] first, then [7, 8]"


def test_watermark_a_request_does_not_count_its_own_second_insert() -> None:
    c, _ = make(policy="write_through_selective")
    _, leaf = put(c, [1, 2, 3, 4])
    assert leaf.hit_count == 1
    # the same request's finish re-inserts its prompt: inserted_len covers it, no hit
    c.insert(to_page_key([1, 2, 3, 4], 1), list(leaf.value or []), prev_prefix_len=4,
             inserted_len=4)  # fmt: skip
    assert leaf.hit_count == 1 and leaf.host_value is None
    # another request's insert counts (and reaches the selective threshold of 2)
    c.insert(to_page_key([1, 2, 3, 4], 1), list(leaf.value or []), prev_prefix_len=4)
    assert leaf.hit_count == 2 and leaf.host_value is not None


def test_an_evicted_node_met_by_insert_is_revalued_counted_and_in_prefix_len() -> None:
    c, ctrl = make(host=0, device=16, page=1)
    _, leaf = put(c, list(range(16)))
    c.evict(16)  # no host: the node is deleted
    assert not c.root.children
    # with a host tier an evicted node stays; re-inserting it counts a hit and its length
    c, ctrl = make(device=32, host=64)
    _, leaf = put(c, list(range(16)))
    settle(c, ctrl)
    c.evict(16)
    assert leaf.value is None and leaf.host_value is not None
    prefix, last = c.insert(to_page_key(list(range(16)), 1), ctrl.device.alloc_pages(16) or [])
    assert prefix == 16 and last is leaf and leaf.value is not None
    assert leaf.hit_count == 2


def test_duplicates_of_the_request_are_freed_by_insert_itself() -> None:
    c, ctrl = make(host=0)
    put(c, [1, 2, 3, 4])
    free_before = ctrl.device.available_size()
    mine = ctrl.device.alloc_pages(4)
    assert mine is not None
    prefix, _ = c.insert(to_page_key([1, 2, 3, 4], 1), mine, prev_prefix_len=0)
    assert prefix == 4
    assert ctrl.device.available_size() == free_before, "the request's 4 duplicates are freed"


def test_prompt_boundary_split_gives_outputs_their_own_leaf_with_lower_priority() -> None:
    c, _ = make(host=0, ev="priority")
    full = [1, 2, 3, 4, 5, 6]
    _, leaf = put(c, full)
    c.insert(to_page_key(full[:4], 1), list((leaf.value or [])[:4]), prev_prefix_len=4,
             inserted_len=4, priority=1)  # fmt: skip
    prompt = c.root.children[1]
    assert len(prompt.key) == 4 and prompt.priority == 1
    out = next(iter(prompt.children.values()))
    assert len(out.key) == 2 and out.priority == 0
    # the output tokens go first under priority eviction
    assert c.evict(1) == 2
    assert not prompt.children and prompt.value is not None


def test_write_back_demotes_each_victim_after_its_own_backup() -> None:
    c, ctrl = make(device=16, host=64, policy="write_back")
    put(c, list(range(100, 108)))
    put(c, list(range(200, 208)))
    assert c.evict(16) == 16
    kids = list(c.root.children.values())
    assert all(k.value is None and k.host_value is not None for k in kids)
    assert ctrl.write_ops == 2, "one backup (and one blocking wait) per victim"


def test_write_back_drops_the_subtree_when_the_host_cannot_take_it() -> None:
    # the host pool (4 tokens) cannot hold an 8-token victim even after evicting everything:
    # 0.5.14 left such a node resident (no progress); 0.5.23 deletes it
    c, ctrl = make(device=16, host=4, policy="write_back")
    put(c, list(range(100, 108)))
    put(c, list(range(200, 208)))
    assert c.evict(8) == 8
    assert len(c.root.children) == 1
    assert c.stats.backup_failures == 1 and c.stats.device_deleted_tokens == 8
    assert ctrl.write_ops == 0


def test_write_back_host_eviction_reclaims_duplicates_first() -> None:
    c, ctrl = make(device=32, host=16, policy="write_back")
    _, a = put(c, list(range(100, 116)))
    c.evict(16)  # a is backed up and demoted
    assert a.value is None and a.host_value is not None
    # load it back: its host copy stays, a duplicate
    m = c.match_prefix(to_page_key(list(range(100, 116)), 1))
    loaded, node = c.init_load_back(m.best, m.host_hit_length, m.last_device)
    assert loaded == 16 and node is a
    c.ready_to_load_host_cache()
    ctrl.complete_loads()
    c.loading_check()
    assert a.id in c.tree.host_duplicates
    # host pressure: the duplicate's host copy goes, the node stays on the device
    assert c.evict_host(16) == 16
    assert a.value is not None and a.host_value is None


def test_load_back_evicts_the_shortfall_before_loading_and_keeps_the_chain_locked() -> None:
    c, ctrl = make(device=32, host=64)
    _, a = put(c, list(range(100, 116)))
    settle(c, ctrl)
    c.evict(16)
    _, b = put(c, list(range(200, 232)))  # fills the device
    settle(c, ctrl)
    assert ctrl.device.available_size() == 0
    m = c.match_prefix(to_page_key([*range(100, 116), 1], 1))
    assert m.host_hit_length == 16
    loaded, node = c.init_load_back(m.best, m.host_hit_length, m.last_device)
    assert loaded == 16 and node is a
    assert b.value is None, "b was demoted to make room before the load"
    assert a.lock_ref == 1 and a.host_lock_ref == 1, "locked until the load's ack"
    c.ready_to_load_host_cache()
    ctrl.complete_loads()
    c.loading_check()
    assert a.lock_ref == 0 and a.host_lock_ref == 0


def test_load_back_below_the_threshold_is_skipped() -> None:
    c, ctrl = make(device=32, host=64)
    put(c, list(range(100, 108)))
    settle(c, ctrl)
    c.evict(8)
    m = c.match_prefix(to_page_key(list(range(100, 108)), 1))
    assert m.host_hit_length == 8
    assert c.init_load_back(m.best, m.host_hit_length, m.last_device) == (0, c.root)


def test_match_stamps_the_best_path_so_lru_evicts_the_other_branch() -> None:
    c, _ = make(host=0)
    put(c, list(range(100, 132)))
    put(c, list(range(200, 232)))
    c.match_prefix(to_page_key(list(range(100, 116)), 1))  # splits A, touches A's prefix
    c.evict(1)
    b = c.root.children.get(200)
    assert b is None, "B (older) goes before A's suffix"


def test_writes_of_one_step_are_merged_into_one_op() -> None:
    c, ctrl = make()
    put(c, [1, 2, 3, 4])
    put(c, [5, 6, 7, 8])
    assert not ctrl.write_queue and len(ctrl.pending_writes) == 2
    c.flush_pending_backups()
    assert len(ctrl.write_queue) == 1 and len(ctrl.write_queue[0].node_ids or []) == 2
    ctrl.complete_all()
    c.writing_check()
    assert all(n.host_value is not None and n.lock_ref == 0 for n in c.root.children.values())


@pytest.mark.parametrize("name", ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"])
def test_every_strategy_evicts_and_keeps_the_ledgers(name: str) -> None:
    c, ctrl = make(device=32, host=64, ev=name)
    for base in (100, 200, 300, 400):
        k = [base + i for i in range(8)]
        if ctrl.device.available_size() < 8:
            c.evict_for_alloc(8 - ctrl.device.available_size())
        put(c, k)
        settle(c, ctrl)
    resident = sum(len(n.value or []) for n in c.tree.nodes.values() if n is not c.root)
    assert c.evictable_size() + c.protected_size() == resident
    assert ctrl.device.available_size() + resident == 32


def test_unknown_write_policy_and_strategy_are_refused() -> None:
    with pytest.raises(ValueError, match="write policy"):
        make(policy="write_sometimes")
    with pytest.raises(ValueError, match="eviction strategy"):
        make(ev="random")
