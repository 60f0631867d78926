"""The 0.5.23 checkpoint's shortcuts (``KVLifecycle0523.shortcuts``: the prompt insert reads the
key in place, the request's pages are spliced from the inserted path below its protected prefix
only, the lock moves in one walk, ``TreeCore.move_lock_ref``) decide exactly what SGLang's steps
do: the whole tree, its ledgers, leaf sets and free lists after every request of cache-only
replays under pressure, and whole timed runs (``sim/differential.py``'s cases, under 0.5.23)."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.config import load_config
from hicache.lifecycle import PagedRequest
from hicache.policy.v0523 import UNode
from hicache.policy.v0523.tree import TreeCore
from sim.differential import random_case
from sim.engine import Engine, run_simulation
from sim.hitrate import CacheReplay0523, HitRateConfig, requests_for
from tests.policy.test_fast_paths_v0523 import assert_same_run
from tests.sim.harness import observe_run
from traces.io import read_trace

TRACE = "traces/data/mooncake/conversation_trace.jsonl"


def _tree_state(tree: TreeCore) -> list[Any]:
    nodes = []
    stack = [tree.root]
    while stack:
        n = stack.pop()
        nodes.append((n.id, tuple(n.key), n.value, n.host_value, n.lock_ref, n.host_lock_ref,
                      n.hit_count, n.priority, n.last_access_time, n.host_uuid,
                      n.write_through_pending_id, n.load_back_pending_id,
                      n in tree.device_leaves, n in tree.host_leaves))  # fmt: skip
        stack.extend(n.children.values())
    return [sorted(nodes, key=lambda x: x[0]), tree.evictable_size, tree.protected_size,
            sorted(tree.host_duplicates), tree._time]  # fmt: skip


def _replay_states(reqs: list[PagedRequest], cfg: HitRateConfig, fast: bool) -> list[Any]:
    rp = CacheReplay0523(cfg)
    rp.life.shortcuts = fast
    out: list[Any] = []
    for r in reqs:
        got = rp.step(r)
        dev, host = rp.device, rp.host
        out.append((got, _tree_state(rp.cache.tree), dev.free_pages_snapshot(),
                    None if host is None else host.free_pages_snapshot()))  # fmt: skip
    out.append(repr(rp.finish()))
    return out


_SLICES = {
    # (trace, first request, requests, device pages, host pages): pools of a few requests'
    # worth, so requests evict, back up and load back (and a few run out of memory)
    "synthetic": ("traces/data/mooncake/synthetic_trace.jsonl", 0, 400, 4_000, 16_000),
    "conversation": (TRACE, 0, 600, 1_500, 3_000),
}


@pytest.fixture(scope="module")
def slices() -> dict[str, list[PagedRequest]]:
    return {k: requests_for(read_trace(t), 64)[a : a + n] for k, (t, a, n, _, _) in _SLICES.items()}


@pytest.mark.parametrize("trace", list(_SLICES))
@pytest.mark.parametrize("eviction", ["lru", "lfu", "fifo", "mru", "tlru"])
@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_the_checkpoint_shortcuts_decide_as_sglangs_steps_cache_only(
    slices: dict[str, list[PagedRequest]], trace: str, policy: str, eviction: str
) -> None:
    _, _, _, dev, host = _SLICES[trace]
    cfg = HitRateConfig(
        device_tokens=64 * dev,
        host_tokens=64 * host,
        page_size=64,
        write_policy=policy,
        eviction=eviction,
        sglang_version="0.5.23",
    )
    plain = _replay_states(slices[trace], cfg, False)
    fast = _replay_states(slices[trace], cfg, True)
    assert len(plain) == len(fast)
    for i, (a, b) in enumerate(zip(plain, fast, strict=True)):
        assert a == b, f"request {i}"
    assert sum(dev_hit for (dev_hit, _), *_ in plain[:-1]) > 0  # the slice reuses prefixes


def _timed(seed: int, fast: bool, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    case = random_case(seed)
    sets = [s for s in case.sets if not s.startswith("sglang.version")]
    sets += ["sglang.version=0.5.23"]
    got: dict[str, Any] = {}
    with mp.context() as m:
        init = Engine.__init__

        def switch(self: Engine, *args: Any, **kw: Any) -> None:
            init(self, *args, **kw)
            for inst in self.instances:
                inst.sched.life.shortcuts = fast  # type: ignore[union-attr]
            got["engine"] = self

        m.setattr(Engine, "__init__", switch)
        observe_run(m, got)
        got["summary"] = run_simulation(load_config(None, sets), case.trace, None,
                                        progress=False)  # fmt: skip
    got["summary"].pop("wall_time_s", None)
    got["tree"] = [_tree_state(inst.cache.tree) for inst in got.pop("engine").instances]
    return got


@pytest.mark.parametrize("seed", [2, 3, 10, 22, 32, 47, 54, 81])
def test_the_checkpoint_shortcuts_decide_as_sglangs_steps_timed(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_same_run(_timed(seed, False, monkeypatch), _timed(seed, True, monkeypatch))


def _chain(tree: TreeCore, pages: list[list[int]]) -> list[UNode]:
    """A root path of device nodes holding ``pages`` (one list a node), each locked once by
    a request's lock on the last."""
    out = []
    parent = tree.root
    for i, v in enumerate(pages):
        n = tree._new_node()
        n.parent, n.key, n.value = parent, tuple(range(100 * i, 100 * i + len(v))), list(v)
        parent.children[n.key[0]] = n
        tree.evictable_size += len(v) * tree.page_size
        parent = n
        out.append(n)
    return out


class _Sink:
    def free_device(self, pages: list[int]) -> None: ...
    def free_host(self, pages: list[int]) -> None: ...
    def backup(self, chain: list[UNode]) -> None: ...
    def pending_split(self, ack_id: int, old: UNode, new: UNode) -> None: ...


@pytest.mark.parametrize("old_depth", [0, 1, 2, 3])
@pytest.mark.parametrize("new_depth", [1, 2, 3])
@pytest.mark.parametrize("evicted", [None, 0, 1, 2])
def test_move_lock_ref_ends_where_dec_then_inc_does(
    old_depth: int, new_depth: int, evicted: int | None
) -> None:
    if old_depth > new_depth:
        return
    states = []
    for fast in (False, True):
        tree = TreeCore(_Sink(), 4)
        chain = _chain(tree, [[1, 2], [3], [4, 5, 6]])
        for n in chain:
            tree.update_leaf_sets(n)
        old = tree.root if old_depth == 0 else chain[old_depth - 1]
        tree.inc_lock_ref(old)
        if evicted is not None and evicted >= old_depth:
            # an evicted node below the lock (as a load-back's anchor path may hold)
            node = chain[evicted]
            pages = node.value
            assert pages is not None
            node.host_value, node.value = pages, None
            tree.evictable_size -= len(pages) * 4
            tree.update_leaf_sets(node)
        new = chain[new_depth - 1]
        if fast:
            tree.move_lock_ref(old, new)
        else:
            tree.dec_lock_ref(old)
            tree.inc_lock_ref(new)
        states.append(_tree_state(tree))
    assert states[0] == states[1]


@pytest.mark.parametrize("start", [0, 1, 2, 3, 5, 6])
def test_copy_path_pages_is_the_paths_pages_spliced(start: int) -> None:
    tree = TreeCore(_Sink(), 1)
    chain = _chain(tree, [[10, 11], [12], [13, 14, 15]])
    into = list(range(100, 108))
    want = list(into)
    want[start:6] = tree.path_device_pages(chain[-1], tree.root)[start:]
    tree.copy_path_pages(chain[-1], into, start, 6)
    assert into == want
