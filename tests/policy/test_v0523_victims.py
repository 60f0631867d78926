"""The persistent device-eviction heap (hicache.policy.v0523.victims) against SGLang's per-call
heap: random scheduler workloads through both, the whole state compared after every step."""

from __future__ import annotations

import pytest

from conformance.v0523 import run
from conformance.v0523.ours_side import OursUnifiedCache
from hicache.policy.v0523.victims import MONOTONE


def _side(fast: bool) -> run.Factory:
    return lambda c: OursUnifiedCache(
        page_size=c.page_size, device_pages=c.device_pages, host_pages=c.host_pages,
        write_policy=c.write_policy, eviction_policy=c.eviction_policy,
        eviction_policy_config=c.eviction_config, fast_victims=fast,
    )  # fmt: skip


@pytest.mark.parametrize("eviction", [*MONOTONE, "mru", "tlru"])
@pytest.mark.parametrize("policy", run.WRITE_POLICIES)
def test_persistent_heap_evicts_as_the_per_call_heap(eviction: str, policy: str) -> None:
    for page in (1, 4):
        for host in run.HOST_PAGES:
            combo = run.Combo(policy, eviction, page, host)
            for seed in range(2):  # a slice for make test; conformance runs ours (fast) by the
                # thousand against the real class's per-call heap
                res = run.run_sequence(combo, seed, 80, _side(True), _side(False))
                assert res is None, res


@pytest.mark.parametrize("eviction", ["mru", "tlru"])
def test_strategies_whose_keys_fall_keep_the_per_call_heap(eviction: str) -> None:
    # mru's key (-last access) falls at every touch, tlru's when a split makes a node TEL-safe:
    # the persistent heap would pop them out of order (the tlru case failed the test above)
    side = _side(True)(run.Combo("write_through", eviction, 1))
    assert type(side.cache.tree.victims).__name__ == "PlainVictims"
    side = _side(True)(run.Combo("write_through", "lru", 1))
    assert type(side.cache.tree.victims).__name__ == "PersistentVictims"


def _drive(kind: type, seed: int) -> list[int]:
    """Random calls on the victims interface alone, with what the tree rarely does: leaves added
    during a call, victims left in place, parents pushed, keys rising between calls."""
    import random

    from hicache.policy.v0523.node import UNode, make_strategy
    from hicache.policy.v0523.victims import PersistentVictims, PlainVictims

    assert kind in (PersistentVictims, PlainVictims)
    rng = random.Random(seed)
    nodes = [UNode(i, float(i), float(i), 0) for i in range(30)]
    clock = 100.0
    leaves: set[UNode] = set()
    v = kind(make_strategy("lru", None, 1), leaves)
    order: list[int] = []

    def add(n: UNode) -> None:
        if n not in leaves:
            leaves.add(n)
            v.on_add(n)

    for _ in range(200):
        r = rng.random()
        n = rng.choice(nodes)
        if r < 0.3:
            add(n)
        elif r < 0.4:
            leaves.discard(n)
        elif r < 0.6:
            clock += 1.0
            n.last_access_time = clock  # a touch: the key rises
        else:
            v.begin()
            popped: set[UNode] = set()  # a victim never turns back into a leaf in its call
            for _ in range(rng.randrange(1, 5)):
                x = v.pop()
                if x is None:
                    break
                order.append(x.id)
                popped.add(x)
                others = [m for m in nodes if m not in popped and m not in leaves]
                if rng.random() < 0.7:
                    leaves.discard(x)  # evicted
                    if others and rng.random() < 0.5:
                        p = rng.choice(others)
                        add(p)
                        v.push_parent(p)  # it just became a leaf: SGLang pushes it
                if others and rng.random() < 0.3:
                    add(rng.choice(others))  # a leaf from elsewhere: the next call's
            v.end()
    return order


@pytest.mark.parametrize("seed", range(40))
def test_victims_interface_orders_agree_on_the_rare_paths(seed: int) -> None:
    from hicache.policy.v0523.victims import PersistentVictims, PlainVictims

    assert _drive(PersistentVictims, seed) == _drive(PlainVictims, seed)
