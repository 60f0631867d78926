"""The cluster routers (sim/routers.py) on hand-made instances and requests: every policy's
choice is computed by hand in the test, including the load-balance and cache thresholds of
``cache_aware`` exactly at their boundaries, its tree eviction, and the crossover of the
tier-aware cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.config import ROUTER_POLICIES, RouterConfig
from hicache.lifecycle import PagedRequest
from hicache.policy.radix import PageKey
from sim.routers import (
    CacheAwareRouter,
    InstanceView,
    PrefixTree,
    TierAwareRouter,
    build_router,
)

PS = 4  # tokens per page in every test


@dataclasses.dataclass
class View:
    """A fake instance: fixed numbers, and a record of how often its load was read."""

    index: int
    load: int = 0
    waiting: int = 0
    running: int = 0
    device: int = 0
    host: int = 0
    reads: int = 0

    def in_flight(self) -> int:
        self.reads += 1
        return self.load

    def waiting_tokens(self) -> int:
        return self.waiting

    def running_tokens(self) -> int:
        return self.running

    def cached_prefix(self, req: PagedRequest) -> tuple[int, int]:
        return self.device, self.host


def views(*loads: int) -> list[View]:
    return [View(i, load) for i, load in enumerate(loads)]


def set_loads(vs: Sequence[View], *loads: int) -> None:
    for v, load in zip(vs, loads, strict=True):
        v.load = load


def req(
    symbols: Sequence[Hashable], input_length: int | None = None, session: Hashable = None
) -> PagedRequest:
    """A request of full pages ``symbols`` (its input length is those pages unless given)."""
    n = len(symbols) * PS if input_length is None else input_length
    return PagedRequest(PageKey(tuple(symbols)), input_length=n, output_length=1, session=session)


def picks(policy: str, vs: Sequence[InstanceView], n: int, seed: int = 0) -> list[int]:
    r = build_router(RouterConfig(policy=policy, seed=seed), len(vs), PS)
    return [r.route(req([1]), vs, float(t)) for t in range(n)]


# ------------------------------------------------------------------------------ simple --


def test_round_robin_cycles() -> None:
    assert picks("round_robin", views(5, 0, 9), 7) == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_reproducible_with_a_seed_and_differs_with_another() -> None:
    vs = views(0, 0, 0, 0)
    first = picks("random", vs, 40, seed=1)
    assert first == picks("random", vs, 40, seed=1)
    assert first != picks("random", vs, 40, seed=2)
    assert set(first) == {0, 1, 2, 3}


def test_power_of_two_is_reproducible_with_a_seed_and_differs_with_another() -> None:
    vs = views(0, 0, 0, 0)  # all ties: the first draw wins, so the picks expose the draws
    first = picks("power_of_two", vs, 40, seed=1)
    assert first == picks("power_of_two", vs, 40, seed=1)
    assert first != picks("power_of_two", vs, 40, seed=2)


def test_power_of_two_draws_two_distinct_instances_and_takes_the_lower_load() -> None:
    vs = views(3, 1, 2, 7, 5)
    r = build_router(RouterConfig(policy="power_of_two", seed=3), len(vs), PS)
    for t in range(200):
        for v in vs:
            v.reads = 0
        pick = r.route(req([1]), vs, float(t))
        drawn = [v for v in vs if v.reads]
        assert len(drawn) == 2 and all(v.reads == 1 for v in drawn)
        assert pick == min(drawn, key=lambda v: v.load).index


def test_power_of_two_with_one_instance_returns_it() -> None:
    assert picks("power_of_two", views(4), 3) == [0, 0, 0]


def test_least_load_takes_the_fewest_in_flight_ties_to_the_lowest_index() -> None:
    assert picks("least_load", views(2, 1, 1), 1) == [1]
    assert picks("least_load", views(0, 0, 0), 1) == [0]


def test_session_affinity_sticks_to_the_first_instance_and_sessionless_go_least_loaded() -> None:
    vs = views(0, 0)
    r = build_router(RouterConfig(policy="session_affinity"), 2, PS)
    assert r.route(req([1], session="a"), vs, 0.0) == 0  # tie -> lowest index
    set_loads(vs, 5, 0)
    assert r.route(req([1, 2], session="a"), vs, 1.0) == 0  # stays although 1 is idle
    assert r.route(req([7], session="b"), vs, 2.0) == 1  # a new session goes least-loaded
    assert r.route(req([8]), vs, 3.0) == 1
    set_loads(vs, 0, 5)
    assert r.route(req([7, 9], session="b"), vs, 4.0) == 1
    assert r.route(req([8]), vs, 5.0) == 0


# ------------------------------------------------------------------------ cache_aware --


def cache_aware(instances: int = 3, **knobs: Any) -> CacheAwareRouter:
    knobs.setdefault("tree_block_tokens", 0)  # a node per page unless a test says otherwise
    r = build_router(RouterConfig(policy="cache_aware", **knobs), instances, PS)
    assert isinstance(r, CacheAwareRouter)
    return r


CONVERSATION = [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8]]


def test_cache_aware_keeps_a_conversation_on_one_instance_until_the_abs_threshold() -> None:
    # abs 2, rel 1.5: imbalanced iff max - min > 2 and max > 1.5 min
    r = cache_aware(balance_abs_threshold=2, balance_rel_threshold=1.5)
    vs = views(0, 0, 0)
    assert r.route(req(CONVERSATION[0]), vs, 0.0) == 0  # cold: least loaded, tie -> 0
    set_loads(vs, 1, 0, 0)
    # matched 8 of 16 tokens: 0.5 > 0.3; it follows its prefix rather than the idle instances
    assert r.route(req(CONVERSATION[1]), vs, 1.0) == 0
    set_loads(vs, 3, 1, 1)  # max - min == 2: not above abs, balanced
    assert r.route(req(CONVERSATION[2]), vs, 2.0) == 0
    set_loads(vs, 4, 1, 1)  # max - min == 3 > 2 and 4 > 1.5: imbalanced -> least loaded, tie 1
    assert r.route(req(CONVERSATION[3]), vs, 3.0) == 1
    # the spilled request was inserted for the instance it went to
    assert r.tree.held_tokens(CONVERSATION[3], 1) == 8 * PS
    r.tree.check_integrity()


def test_cache_aware_rel_threshold_is_strict_and_must_hold_with_abs() -> None:
    # abs 2, rel 2: loads (x, 5, 5) with x - 5 > 2 are imbalanced only once x > 10
    r = cache_aware(balance_abs_threshold=2, balance_rel_threshold=2.0)
    vs = views(0, 0, 0)
    assert r.route(req(CONVERSATION[0]), vs, 0.0) == 0
    set_loads(vs, 8, 5, 5)  # abs crossed (3 > 2) but 8 <= 10: balanced
    assert r.route(req(CONVERSATION[1]), vs, 1.0) == 0
    set_loads(vs, 10, 5, 5)  # exactly max == rel * min: still balanced
    assert r.route(req(CONVERSATION[2]), vs, 2.0) == 0
    set_loads(vs, 11, 6, 5)  # 11 > 10 and 6 > 2: imbalanced -> the least loaded, 2
    assert r.route(req(CONVERSATION[3]), vs, 3.0) == 2


def test_cache_aware_sends_a_cold_request_to_the_least_loaded() -> None:
    r = cache_aware()
    vs = views(0, 0, 0)
    assert r.route(req([1, 2]), vs, 0.0) == 0
    set_loads(vs, 1, 2, 0)
    assert r.route(req([100, 101]), vs, 1.0) == 2
    assert r.route(req([], input_length=3), vs, 2.0) == 2  # no full page: rate 0


def test_cache_aware_match_rate_exactly_at_the_threshold_does_not_count() -> None:
    r = cache_aware(instances=2, cache_threshold=0.5)
    vs = views(0, 0)
    assert r.route(req([1, 2]), vs, 0.0) == 0
    set_loads(vs, 1, 0)
    assert r.route(req([1, 2, 9]), vs, 1.0) == 0  # 8 / 12 > 0.5: the match wins
    assert r.route(req([1, 2, 3, 4]), vs, 2.0) == 1  # 8 / 16 == 0.5: least loaded
    # a partial last page counts in the denominator: 8 / 17 < 0.5
    assert r.route(req([1, 2], input_length=17), vs, 3.0) == 1  # (1, 2) now also on 1
    assert r.route(req([1, 2, 9, 10], input_length=17), vs, 4.0) == 0  # 12 / 17, on 0 only


def test_cache_aware_several_holders_of_the_deepest_node_go_to_the_lowest_index() -> None:
    # abs 0, rel 1: any difference in load is an imbalance
    r = cache_aware(instances=3, balance_abs_threshold=0, balance_rel_threshold=1.0)
    vs = views(1, 0, 0)
    assert r.route(req([1, 2]), vs, 0.0) == 1  # imbalanced: least loaded, inserted there
    set_loads(vs, 1, 1, 0)
    assert r.route(req([1, 2]), vs, 1.0) == 2  # imbalanced again: (1, 2) now on 1 and 2
    set_loads(vs, 1, 1, 1)  # balanced; least loaded would be 0, the holders are 1 and 2
    assert r.route(req([1, 2, 5]), vs, 2.0) == 1


def test_cache_aware_eviction_removes_the_lru_leaves_of_an_instance_over_its_limit() -> None:
    # limit 2 pages per instance; evictions at 10, 20, ... of simulated time
    r = cache_aware(instances=2, eviction_interval_s=10.0, max_tree_tokens=2 * PS)
    vs = views(0, 1)
    a, b = [1, 2], [5, 6]
    assert r.route(req(a), vs, 0.0) == 0
    assert r.route(req(b), vs, 1.0) == 0  # cold -> least loaded: instance 0 holds 4 pages
    assert r.route(req(a), vs, 2.0) == 0  # a full match refreshes a's pages to t = 2
    set_loads(vs, 1, 0)
    assert r.route(req([40, 41]), vs, 5.0) == 1  # cold; before the boundary nothing goes
    assert r.tree.sizes == [4 * PS, 2 * PS]
    # first call at/after t = 10 evicts first: b's leaf (t = 1), then its parent, stop at 2 pages
    assert r.route(req([*a, 3]), vs, 12.0) == 0  # a survived: 8 / 12 > 0.3
    assert r.tree.held_tokens(b, 0) == 0 and b[0] not in r.tree.root.children
    assert r.tree.held_tokens([40, 41], 1) == 2 * PS  # instance 1 was within its limit
    assert r.route(req([*b, 7]), vs, 13.0) == 1  # b is cold now: least loaded
    set_loads(vs, 0, 1)
    assert r.route(req([*b, 7]), vs, 14.0) == 1  # ... and followed there once re-inserted
    r.tree.check_integrity()


def test_cache_aware_match_refreshes_the_matched_instance_even_when_not_chosen() -> None:
    # the gateway's prefix_match refreshes the tenant it returns, whatever the caller then does
    r = cache_aware(2, cache_threshold=0.5, eviction_interval_s=10.0, max_tree_tokens=2 * PS)
    vs = views(0, 1)
    a, b = [1, 2], [5, 6]
    assert r.route(req(a), vs, 0.0) == 0
    assert r.route(req(b), vs, 1.0) == 0
    set_loads(vs, 1, 0)
    assert r.route(req([*a, 8, 9]), vs, 2.0) == 1  # 8 / 16 is not > 0.5, yet a is now t = 2
    r.route(req([40]), vs, 10.0)  # evicts instance 0's oldest leaves: b's (t = 1)
    assert r.tree.held_tokens(a, 0) == 2 * PS and r.tree.held_tokens(b, 0) == 0


def test_cache_aware_evicts_lazily_once_per_interval() -> None:
    r = cache_aware(instances=1, eviction_interval_s=10.0, max_tree_tokens=PS)
    vs = views(0)
    r.route(req([1, 2]), vs, 25.0)  # evicts (nothing over), then inserts 2 pages
    r.route(req([3]), vs, 29.9)  # next boundary is 30: no eviction yet
    assert r.tree.sizes == [3 * PS]
    r.route(req([4]), vs, 30.0)  # evicts down to 1 page (the newest leaf, 3), then inserts 4
    assert r.tree.held_tokens([3], 0) == PS and r.tree.held_tokens([4], 0) == PS
    assert r.tree.held_tokens([1], 0) == 0
    r.tree.check_integrity()


def test_prefix_tree_evicts_leaves_first_and_keeps_other_instances() -> None:
    tree = PrefixTree(2, PS)
    tree.insert([1, 2, 3], 0, 0.0)  # one path, one time: only its leaf is ever a candidate
    tree.insert([5, 6], 0, 1.0)
    tree.insert([5, 6], 1, 1.0)
    tree.insert([1, 2, 3], 0, 2.0)
    tree.evict(2 * PS)
    assert tree.held_tokens([1, 2, 3], 0) == 2 * PS  # the path shrank from its leaf
    assert tree.held_tokens([5, 6], 0) == 0
    assert tree.held_tokens([5, 6], 1) == 2 * PS  # the node stays for instance 1
    assert tree.sizes == [2 * PS, 2 * PS]
    tree.check_integrity()


def test_prefix_tree_equal_times_evict_the_older_node_first() -> None:
    tree = PrefixTree(1, PS)
    tree.insert([0], 0, 5.0)
    tree.insert([1], 0, 5.0)
    tree.evict(PS)
    assert tree.held_tokens([0], 0) == 0 and tree.held_tokens([1], 0) == PS


class NaiveTree:
    """The gateway's tree as plain sets of paths: per instance, every prefix it holds and its
    time; eviction re-scans all leaves for each removal (what tree.rs does, without a heap)."""

    def __init__(self, instances: int) -> None:
        self.held: list[dict[tuple[int, ...], float]] = [{} for _ in range(instances)]
        self.serial: dict[tuple[int, ...], int] = {}  # node creation order, as in the tree
        self.created = 0

    def insert(self, path: Sequence[int], instance: int, now: float) -> None:
        for k in range(1, len(path) + 1):
            prefix = tuple(path[:k])
            if prefix not in self.serial:
                self.created += 1
                self.serial[prefix] = self.created
            self.held[instance][prefix] = now

    def touch(self, path: Sequence[int], now: float) -> None:
        """Refresh the lowest-index holder of the deepest matched prefix along the match."""
        k = len(path)
        while k and tuple(path[:k]) not in self.serial:
            k -= 1
        if k:
            deepest = tuple(path[:k])
            instance = min(i for i, h in enumerate(self.held) if deepest in h)
            for j in range(1, k + 1):
                self.held[instance][tuple(path[:j])] = now

    def evict(self, max_pages: int) -> None:
        for held in self.held:
            while len(held) > max_pages:
                leaves = [p for p in held if not any(q[:-1] == p for q in held)]
                oldest = min(leaves, key=lambda p: (held[p], self.serial[p]))
                del held[oldest]
                if not any(oldest in h for h in self.held):
                    del self.serial[oldest]


def tree_contents(tree: PrefixTree) -> list[dict[tuple[Hashable, ...], float]]:
    out: list[dict[tuple[Hashable, ...], float]] = [{} for _ in tree.sizes]
    stack: list[tuple[tuple[Hashable, ...], Any]] = [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for symbol, child in node.children.items():
            for instance, stamp in child.tenants.items():
                out[instance][(*path, symbol)] = stamp
            stack.append(((*path, symbol), child))
    return out


STEP = st.tuples(
    st.sampled_from(["insert", "touch", "evict"]),
    st.lists(st.integers(0, 3), max_size=5),  # a path over a tiny alphabet
    st.integers(0, 1),  # the instance of an insert
    st.integers(0, 4),  # the limit of an eviction, in pages
)


@settings(max_examples=400)
@given(st.lists(STEP, max_size=40))
def test_prefix_tree_agrees_with_a_naive_model(
    steps: list[tuple[str, list[int], int, int]],
) -> None:
    tree, naive = PrefixTree(2, PS), NaiveTree(2)
    tree.compact_slack = 0  # compaction must not lose a candidate either
    for t, (op, path, instance, limit) in enumerate(steps):
        now = float(t // 4)  # equal times happen: ties go to the older node
        if op == "insert":
            tree.insert(path, instance, now)
            naive.insert(path, instance, now)
        elif op == "touch":
            matched = tree.match(path)
            if matched:
                tree.touch(matched, min(matched[-1].tenants), now)
            naive.touch(path, now)
        else:
            before = list(tree.sizes)
            tree.evict(limit * PS)
            naive.evict(limit)
            for size, old in zip(tree.sizes, before, strict=True):
                # an instance over the limit shrinks to it; one within it is left alone
                assert size == (limit * PS if old > limit * PS else old)
        tree.check_integrity()
        assert tree_contents(tree) == naive.held


# ------------------------------------------------------------------------- tier_aware --


def tier_aware(**knobs: Any) -> TierAwareRouter:
    r = build_router(RouterConfig(policy="tier_aware", **knobs), 2, PS)
    assert isinstance(r, TierAwareRouter)
    return r


def test_tier_aware_prefers_a_host_hit_until_its_queue_outweighs_it() -> None:
    # a 40-token (10-page) prompt; instance 1 holds 32 tokens (8 pages) of it on host only.
    # idle 0 recomputes: cost 10. Holder 1: 10 - 0.75 * 8 = 4, plus waiting / 4.
    # crossover: waiting / 4 + 4 == 10 -> waiting == 24 tokens (a tie goes to index 0)
    r = tier_aware()
    prompt = req(range(10))
    idle, holder = View(0), View(1, host=32)
    assert r.cost(prompt, idle) == 10.0 and r.cost(prompt, holder) == 4.0
    assert r.route(prompt, [idle, holder], 0.0) == 1
    holder.waiting = 20  # 9 < 10
    assert r.route(prompt, [idle, holder], 0.0) == 1
    holder.waiting = 24  # 10 == 10: tie -> lowest index
    assert r.route(prompt, [idle, holder], 0.0) == 0
    holder.waiting = 28  # 11 > 10
    assert r.route(prompt, [idle, holder], 0.0) == 0


def test_tier_aware_counts_running_tokens_and_device_over_host() -> None:
    r = tier_aware()
    prompt = req(range(10))
    on_device, on_host = View(0, device=32, running=4), View(1, host=32)
    assert r.cost(prompt, on_device) == 2.0 + 1.0  # 10 - 8 pages, + 4 / 4 running
    assert r.cost(prompt, on_host) == 4.0  # 10 - 0.75 * 8
    assert r.route(prompt, [on_device, on_host], 0.0) == 0
    on_device.running = 12  # 2 + 3 = 5 > 4
    assert r.route(prompt, [on_device, on_host], 0.0) == 1


def test_tier_aware_host_weight_zero_makes_host_hits_worthless() -> None:
    r = tier_aware(host_weight=0.0)
    prompt = req(range(10))
    idle, holder = View(0), View(1, host=32)
    assert r.cost(prompt, holder) == r.cost(prompt, idle) == 10.0
    assert r.route(prompt, [idle, holder], 0.0) == 0  # a tie: the lowest index


def test_tier_aware_credit_never_makes_prefill_negative() -> None:
    r = tier_aware()
    # a fully cached prompt on a busy queue: the credit only cancels this request's pages
    assert r.cost(req(range(2)), View(0, device=8, waiting=4)) == 1.0
    assert r.cost(req(range(2)), View(0, device=8)) == 0.0


# ---------------------------------------------------------------------------- factory --


@pytest.mark.parametrize("policy", ROUTER_POLICIES)
def test_build_router_builds_every_policy(policy: str) -> None:
    r = build_router(RouterConfig(policy=policy), 3, PS)
    assert r.name == policy
    assert r.route(req([1, 2]), views(0, 0, 0), 0.0) in range(3)


def test_build_router_rejects_an_unknown_policy_naming_the_choices() -> None:
    cfg = RouterConfig()
    object.__setattr__(cfg, "policy", "fastest")  # past RouterConfig's own check
    with pytest.raises(ValueError, match=r"fastest.*round_robin.*tier_aware"):
        build_router(cfg, 2, PS)
    with pytest.raises(ValueError, match=r"router\.policy"):
        RouterConfig(policy="fastest")


def test_cache_aware_tree_keys_whole_blocks() -> None:
    """tree_block_tokens = 2 pages: a node per 2 pages, keyed by each block's last page symbol
    (which identifies the block and all before it); a partial last block is not inserted and
    the match rate counts whole blocks."""
    r = cache_aware(instances=2, tree_block_tokens=2 * PS, cache_threshold=0.5)
    assert r.pages == 2 and r.tree.page_size == 2 * PS
    five = req([1, 2, 3, 4, 5])  # 5 pages: blocks (1, 2) and (3, 4); page 5 left out
    assert list(r.keys(five)) == [2, 4]
    vs = views(0, 0)
    assert r.route(five, vs, 0.0) == 0
    assert r.tree.sizes == [4 * PS, 0]
    # 4 of 5 pages matched (0.8 > 0.5): to instance 0 even though it is busier
    vs[0].load = 1
    assert r.route(req([1, 2, 3, 4, 9]), vs, 1.0) == 0
    # only the first block shared: 2 of 6 pages (0.33): least loaded
    assert r.route(req([1, 2, 7, 8, 9, 10]), vs, 2.0) == 1
