"""The timed engine against SGLang 0.5.23's cache (``sglang_version="0.5.23"``): agreement with
the 0.5.23 cache-only replay, page conservation, determinism, and each scheduler step that
changed from 0.5.14 (``sim.scheduler_v0523``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hicache.lifecycle import PagedRequest
from hicache.policy import HiRadixCache, PageKey
from hicache.policy.v0523 import UnifiedRadixCache
from sim.engine import Engine
from sim.hitrate import HitRateConfig, replay
from sim.scheduler import SchedulerParams, SimReq
from sim.scheduler_v0523 import TOUCH_INTERVAL, Scheduler0523
from tests.sim.harness import costs, engine, req
from traces.io import read_trace
from traces.keys import page_symbols

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def sim_reqs(trace: Any, page_size: int, spacing_s: float | None = None) -> list[SimReq]:
    out = []
    for i, r in enumerate(trace):
        arrival = i * spacing_s if spacing_s is not None else r.timestamp / 1000
        key = PageKey(page_symbols(r, page_size, trace.block_size))
        out.append(SimReq(PagedRequest(key, r.input_length, max(1, r.output_length), rid=i,
                                       arrival_s=arrival)))  # fmt: skip
    return out


def engine23(reqs: list[SimReq], **kw: Any) -> Engine:
    return engine(reqs, sglang_version="0.5.23", **kw)


def tree_pages(cache: UnifiedRadixCache) -> list[int]:
    return [p for n in cache.tree.nodes.values() if n.value is not None for p in n.value]


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
@pytest.mark.parametrize("ps", [1, 16])
def test_hit_rates_equal_the_0523_cache_only_replay_when_requests_never_overlap(
    write_policy: str, ps: int
) -> None:
    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    dev, host = 4096, 16384
    e = engine23(sim_reqs(trace, ps, spacing_s=100.0), page_size=ps, device_tokens=dev,
                 host_tokens=host, write_policy=write_policy)  # fmt: skip
    assert isinstance(e.cache, UnifiedRadixCache) and isinstance(e.sched, Scheduler0523)
    e.run()
    rows = e.recorder.requests
    reqs = [
        PagedRequest(PageKey(page_symbols(r, ps, 512)), r.input_length, r.output_length)
        for r in trace
    ]
    ref = replay(reqs, HitRateConfig(dev, host, ps, "lru", write_policy, sglang_version="0.5.23"))
    assert sum(r.prompt_tokens for r in rows) == ref.prompt_tokens
    assert sum(r.device_hit_tokens for r in rows) == ref.device_hit_tokens
    assert sum(r.host_hit_tokens for r in rows) == ref.host_hit_tokens
    assert ref.host_hit_tokens > 0  # the comparison exercises load-back


def test_the_default_version_still_builds_0514s_cache() -> None:
    e = engine([req(0, 0.0, 64, 4)])
    assert isinstance(e.cache, HiRadixCache) and type(e.sched).__name__ == "Scheduler"


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_every_device_page_is_free_or_in_the_tree_or_held_at_every_sample(
    write_policy: str,
) -> None:
    """A loaded run (queueing, eviction, load-back, retraction): free + tree + held = pool."""
    trace = read_trace(DATA / "synthetic" / "agentic.jsonl")
    e = engine23(sim_reqs(trace, 16), device_tokens=8192, host_tokens=32768,
                 write_policy=write_policy)  # fmt: skip
    real_sample = e._sample
    checks = {"n": 0}
    cache = e.cache
    assert isinstance(cache, UnifiedRadixCache)

    def checked_sample() -> None:
        s = e.sched
        held: list[int] = []
        for r in [*s.running, *s.waiting, *([s.chunked] if s.chunked else [])]:
            if r.kv is not None:
                held += r.kv.kv[r.kv.protected_pages :]
        pages = tree_pages(cache) + held + e.device.free_pages_snapshot()
        assert sorted(pages) == list(range(e.device.num_pages))
        assert cache.evictable_size() + cache.protected_size() == len(tree_pages(cache)) * 16
        checks["n"] += 1
        real_sample()

    e.sched.sample = checked_sample
    e.run()
    assert checks["n"] > 100 and e._finished_n == len(trace)
    assert sum(r.retractions for r in e.recorder.requests) >= 0


def test_determinism() -> None:
    trace = read_trace(DATA / "synthetic" / "shared-prefix.jsonl")
    runs = []
    for _ in range(2):
        e = engine23(sim_reqs(trace, 16), device_tokens=4096, host_tokens=16384)
        e.run()
        runs.append((e.recorder.requests, e.recorder.transfers, e.env.now))
    assert runs[0] == runs[1]


def test_writes_of_one_batch_result_go_out_as_one_copy() -> None:
    """Two requests cached by one prefill batch: 0.5.14 writes each node by itself, 0.5.23
    merges the batch's backups into one device->host copy (they complete while the requests
    decode: a copy still running when the run ends is not recorded)."""
    writes = {}
    for v in ("0.5.14", "0.5.23"):
        e = engine([req(0, 0.0, 64, 2), req(1, 0.0, 64, 2)], sglang_version=v)
        e.run()
        writes[v] = [t for t in e.recorder.transfers if t.direction == "d2h"]
    assert len(writes["0.5.14"]) == 2 and len(writes["0.5.23"]) == 1
    assert writes["0.5.23"][0].pages == sum(t.pages for t in writes["0.5.14"])


def test_a_chunks_backup_starts_after_the_next_chunks_forward() -> None:
    """The chunk's checkpoint is the next iteration's stash, after check_hicache_events has
    flushed: its backup (0.5.23 counts the chunk's hit by the watermark, so write_through backs
    it up) is submitted after the next chunk's forward, not as the chunk ends."""
    sp = SchedulerParams(page_size=16, chunked_prefill_size=64)
    e = engine23([req(0, 0.0, 256, 1)], sched=sp, costs=costs(prefill_per_token=1e-3))
    e.run()
    ends = [end for kind, _, end, _ in e.sched.spans if kind == "prefill"]
    d2h = sorted(t.start_s for t in e.recorder.transfers if t.direction == "d2h")
    assert len(ends) == 4 and d2h
    assert d2h[0] > ends[0]
    assert d2h[0] == pytest.approx(ends[1])


def _touches(eviction: str, policy: str, n_waiting: int, passes: int) -> list[int]:
    """Drive admission ``passes`` times with ``n_waiting`` requests queued that cannot be
    admitted (the device is held by a running request) and return the pass numbers on which
    the queue's prefixes were touched (the tree's clock jumps by one per touched request)."""
    e = engine23([], eviction=eviction, sched=SchedulerParams(page_size=16, policy=policy),
                 device_tokens=1024, host_tokens=4096)  # fmt: skip
    s = e.sched
    assert isinstance(s, Scheduler0523)
    for i in range(n_waiting):
        s.arrive(req(i, 0.0, 2048, 4))  # longer than the device pool can ever give
    out = []
    for k in range(passes):
        before = e.cache.now()
        s._calc_priority()
        if e.cache.now() - before == n_waiting:
            out.append(k)
    return out


def test_waiting_prefixes_are_touched_every_32nd_pass_under_lru_and_fcfs() -> None:
    assert _touches("lru", "fcfs", 3, 2 * TOUCH_INTERVAL + 1) == [0, 32, 64]
    assert _touches("lfu", "fcfs", 3, TOUCH_INTERVAL + 1) == []  # other strategies: none


def test_the_touch_goes_head_last_so_lru_keeps_the_head_longest() -> None:
    """Three cached prompts, inserted oldest first, each queued again: the touch stamps them
    in reverse queue order, so LRU now evicts the queue's tail first (without the touch it
    would evict the oldest insert, the head's)."""
    e = engine23([], sched=SchedulerParams(page_size=16), device_tokens=1024, host_tokens=0)
    s, cache, life = e.sched, e.cache, e.sched.life
    assert isinstance(cache, UnifiedRadixCache)
    for i in range(3):  # a finished twin of each queued request puts its prompt in the tree
        twin = req(10 + i, 0.0, 64, 1, symbols=range(i * 100_000, i * 100_000 + 64))
        key = life.prompt_key(twin.req)
        a = life.admit(key, 64)
        assert life.reserve_prompt(a.kv, 64)
        a.kv.key = key
        life.finish(a.kv, key, [], 64)
    for i in range(3):
        s.arrive(req(i, 0.0, 64, 4))
    s._calc_priority()
    cache.evict(64)  # one prompt's worth: the least recently touched goes
    kept = [cache.peek_prefix(s._fill_key(s.waiting[i]))[0] for i in range(3)]
    assert kept == [64, 64, 0]


def test_a_config_run_under_0523_with_tlru_and_its_parameters() -> None:
    """Through the config (sglang.version, cache.eviction=tlru with
    --radix-eviction-policy-config): the summary names the version, and the parameters reach
    the cache. With SGLang's defaults (threshold 0) no node is tail-safe, and with a threshold
    above every prefix all are: both order as LRU does. A 1,024-token threshold makes only the
    short nodes near a leaf safe, which changes what is evicted (and the host hit rate)."""
    from hicache.config import load_config
    from sim.engine import run_simulation

    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    base = ["sglang.version=0.5.23", "gpu.device_tokens=4096", "cache.page_size=16",
            "cache.hicache_ratio=2", "cache.eviction=tlru"]  # fmt: skip

    def hits(*sets: str) -> tuple[float, float]:
        s = run_simulation(load_config(None, [*base, *sets]), trace)
        assert s["sglang_version"] == "0.5.23" and s["requests"] == len(trace)
        return s["device_hit_rate"], s["host_hit_rate"]

    default = hits()
    assert hits('cache.eviction_policy_config={"threshold": 1000000000}') == default
    assert hits('cache.eviction_policy_config={"threshold": 1024}') != default


def _host_hit_behind_a_chunk(version: str) -> tuple[Engine, list[tuple[SimReq, int, int]]]:
    """A's 64-token prompt cached, then moved to host; C (120 tokens) prefills in chunks of 64,
    so its last chunk leaves 8 tokens of the chunk budget; B (A's prompt + 40 tokens) waits
    behind it with a 64-token host hit. Returns the engine and the batch of C's last chunk."""
    from tests.sim.harness import admit, prefill_all, run_batch

    sp = SchedulerParams(page_size=16, chunked_prefill_size=64)
    e = engine([], sglang_version=version, sched=sp, device_tokens=1024, host_tokens=4096)
    prefill_all(e, req(0, 0.0, 64, 1, symbols=range(64)))
    e.cache.check_hicache_events()  # the backup's ack
    e.cache.evict(1024)  # A's prompt now lives on host only
    c = req(2, 0.0, 120, 4)
    first = admit(e, c)
    assert first is not None and first[0][1] == 64
    run_batch(e, first)
    e.sched.arrive(req(1, 0.0, 104, 4, symbols=[*range(64), *range(500_000, 500_040)]))
    batch = e.sched._get_new_batch_prefill()
    assert batch is not None
    return e, batch


def test_a_chunk_that_rounds_to_nothing_starts_no_load_in_0523() -> None:
    """B's extend (40) exceeds the 8 tokens left, and 8 rounds to no page: 0.5.23 decides
    OTHER before the load-back, so nothing is loaded; 0.5.14 loads B's host hit first and then
    stops, leaving the load queued (the chain stays pinned until its ack)."""
    e23, batch23 = _host_hit_behind_a_chunk("0.5.23")
    e14, batch14 = _host_hit_behind_a_chunk("0.5.14")
    assert [(r.rid, n) for r, n, _ in batch23] == [(2, 56)] == [(r.rid, n) for r, n, _ in batch14]
    assert [r.rid for r in e23.sched.waiting] == [1] == [r.rid for r in e14.sched.waiting]
    assert not e23.ctrl.pending_loads
    assert sum(len(op.device_pages) for op in e14.ctrl.pending_loads) == 4
