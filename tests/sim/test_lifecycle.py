"""The one request KV lifecycle (hicache/lifecycle.py) on hand-computed cases: keys, admit (the
input_len - 1 match, the load-back threshold, locks), allocation with eviction, after_prefill,
finish (outputs cached or skipped) and abort. Driven on the policy core with a
ManualController, so copies finish only when the test says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.lifecycle import (
    KVLifecycle,
    PagedRequest,
    ReqKV,
    cache_finished_req,
    cache_unfinished_req,
    paged_requests,
)
from hicache.policy import HiRadixCache, ManualController, PageAllocator, PageKey
from hicache.policy.allocator import device_pool
from traces.io import read_trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"


def make(
    ps: int = 1,
    device: int = 64,
    host: int = 0,
    outputs: str = "cache",
    write_policy: str = "write_through",
    load_back_threshold: int = 10,
) -> tuple[KVLifecycle, HiRadixCache, ManualController]:
    dev = device_pool(device // ps, ps)
    hst = PageAllocator(host // ps, ps, "host") if host else None
    ctrl = ManualController(dev, hst)
    cache = HiRadixCache(ctrl, write_policy=write_policy, load_back_threshold=load_back_threshold)
    return KVLifecycle(cache, outputs), cache, ctrl


def K(*symbols: object) -> PageKey:
    return PageKey(symbols)


def serve(life: KVLifecycle, key: PageKey, kv_tokens: int | None = None) -> ReqKV:
    """A whole request whose prompt is ``key`` (full pages): admit, allocate, prefill insert,
    decode pages up to ``kv_tokens`` (default: the prompt), finish."""
    ps = life.page_size
    prompt = len(key) * ps
    kv = life.admit(key, prompt).kv
    assert life.alloc_prompt(kv, prompt) is not None
    life.after_prefill(kv)
    tokens = prompt if kv_tokens is None else kv_tokens
    assert life.alloc_outputs(kv, tokens)
    life.finish(kv, key, [], tokens)
    return kv


def free(cache: HiRadixCache) -> int:
    return cache.controller.device.available_size()


# -------------------------------------------------------------------------------- keys --


def test_prompt_key_keeps_the_full_prompt_pages() -> None:
    life, _, _ = make(ps=4)
    r = PagedRequest(K("a", "b", "c"), input_length=10, output_length=1)
    assert life.prompt_key(r) == ("a", "b")  # 10 // 4 = 2 full pages
    r = PagedRequest(K("a", "b", "c"), input_length=12, output_length=1)
    assert life.prompt_key(r) == ("a", "b", "c")
    assert isinstance(life.prompt_key(r), PageKey)


def test_extend_key_numbers_output_symbols_once_per_request() -> None:
    life, _, _ = make(ps=4)
    prompt = K("a", "b")
    out: list[object] = []
    assert life.extend_key(prompt, out, 4) == ("a", "b", -1, -2) and out == [-1, -2]
    assert life.extend_key(prompt, out, 3) == ("a", "b", -1) and out == [-1, -2]
    other: list[object] = []
    assert life.extend_key(prompt, other, 3) == ("a", "b", -3)  # a fresh symbol
    assert life.extend_key(prompt, out, 1) == ("a",)
    assert life.extend_key(prompt, out, 2) is prompt


def test_paged_request_kv_tokens() -> None:
    # prompt + outputs but the last token, at least one output
    assert PagedRequest(K(), 10, 5).kv_tokens == 14
    assert PagedRequest(K(), 10, 0).kv_tokens == 10


def test_outputs_mode_is_checked() -> None:
    _, cache, _ = make()
    assert KVLifecycle(cache).outputs == "cache"  # the default
    with pytest.raises(ValueError, match="outputs must be one of cache, skip"):
        KVLifecycle(cache, "bogus")


TINY_TRACE = """\
{"format": "hicache-trace", "version": 1, "block_size": 16}
{"timestamp": 5000, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3], "session_id": "s", "turn": 0, "think_time_ms": 0}
{"timestamp": 5500, "input_length": 20, "output_length": 1, "hash_ids": [1, 4], "session_id": "s", "turn": 1, "think_time_ms": 800}
{"timestamp": 7000, "input_length": 16, "output_length": 2, "hash_ids": [9]}
"""  # noqa: E501


def test_paged_requests_from_a_tiny_trace(tmp_path: Path) -> None:
    # blocks of 16, pages of 8: arrivals count from the first request (5 s) and, like think
    # times, are divided by rate_scale 2: 0, 0.25, 1.0 s; think 0, 0.4, 0 s (none given)
    path = tmp_path / "tiny.jsonl"
    path.write_text(TINY_TRACE)
    reqs = paged_requests(read_trace(path), 8, rate_scale=2.0)
    assert [r.rid for r in reqs] == [0, 1, 2]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.25, 1.0])
    assert [r.think_time_s for r in reqs] == pytest.approx([0.0, 0.4, 0.0])
    assert [(r.session, r.turn) for r in reqs] == [("s", 0), ("s", 1), (None, None)]
    assert [(r.input_length, r.output_length) for r in reqs] == [(40, 3), (20, 1), (16, 2)]
    # one symbol per full page (40 // 8 = 5, 20 // 8 = 2, 16 // 8 = 2): page j of block hash
    # h is h * (16 // 8) + j, so the first block (hash 1: pages 2, 3) is shared
    assert [list(r.symbols) for r in reqs] == [[2, 3, 4, 5, 6], [2, 3], [18, 19]]
    assert [r.rid for r in paged_requests(read_trace(path), 8, limit=2)] == [0, 1]
    # rate_scale 1 by default
    assert [r.arrival_s for r in paged_requests(read_trace(path), 8)] == [0.0, 0.5, 2.0]


def test_paged_requests_scale_time_and_limit() -> None:
    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    rows = list(trace)[:3]
    reqs = paged_requests(trace, 16, rate_scale=2.0, limit=3)
    assert [r.rid for r in reqs] == [0, 1, 2]
    for r, row in zip(reqs, rows, strict=True):
        assert r.arrival_s == pytest.approx(row.timestamp / 1000 / 2.0)
        assert (r.input_length, r.output_length) == (row.input_length, row.output_length)
        assert (r.session, r.turn) == (row.session_id, row.turn)
        assert len(r.symbols) == row.input_length // 16


# ------------------------------------------------------------------------------- admit --


def test_match_uses_input_len_minus_one_page_aligned() -> None:
    # page 4, (a, b, c) cached (12 tokens). fill_len 12 -> match (11 // 4) * 4 = 8 tokens;
    # 13 -> 12; 5 -> 4; 4 -> 0 (at least one token is always recomputed)
    life, _, _ = make(ps=4)
    key = K("a", "b", "c")
    serve(life, key)
    for fill_len, hit in [(12, 8), (13, 12), (5, 4), (4, 0)]:
        assert life.match(key, fill_len).device_hit_length == hit


def test_admit_a_device_hit_locks_the_prefix() -> None:
    # page 1: P (12 tokens) cached; admit P + 3: device hit 12 (match on 14 tokens), the
    # request's kv starts with the tree's 12 pages, which become protected
    life, cache, _ = make()
    p = serve(life, K(*range(12)))
    assert (cache.evictable_size(), cache.protected_size()) == (12, 0)
    a = life.admit(K(*range(12), 100, 101, 102), 15)
    assert (a.device_pages, a.loaded_pages) == (12, 0)
    assert a.kv.protected_pages == 12 and a.kv.last_node is p.last_node
    assert (cache.evictable_size(), cache.protected_size()) == (0, 12)
    life.abort(a.kv)
    assert (cache.evictable_size(), cache.protected_size()) == (12, 0)


def demoted(length: int, threshold: int = 10) -> tuple[KVLifecycle, HiRadixCache, ManualController]:
    """Page 1, host tier, write_through: a ``length``-token prompt served, written, acked and
    demoted to host."""
    life, cache, ctrl = make(device=64, host=128, load_back_threshold=threshold)
    serve(life, K(*range(length)))
    assert ctrl.write_ops == 1  # written at its first insert (threshold 1)
    ctrl.complete_writes()
    cache.writing_check()
    assert cache.evict(length) == length
    return life, cache, ctrl


@pytest.mark.parametrize(("length", "loaded"), [(9, 0), (10, 10)])
def test_admit_loads_a_host_hit_from_the_threshold_on(length: int, loaded: int) -> None:
    # host hit of 9 tokens: below the threshold (10), recomputed; 10 tokens: loaded back
    life, cache, ctrl = demoted(length)
    a = life.admit(K(*range(length), 500, 501, 502, 503, 504), length + 5)
    assert (a.device_pages, a.loaded_pages) == (0, loaded)
    assert len(a.kv.kv) == loaded and a.kv.protected_pages == loaded
    if loaded:
        node = a.kv.last_node
        assert node.value == a.kv.kv and node.lock_ref == 2  # load_back's lock + the request's
        assert ctrl.start_loading() > 0 and ctrl.complete_loads() == 1
        cache.loading_check()
        assert node.lock_ref == 1
        assert free(cache) == 64 - loaded
    else:
        assert a.kv.last_node is cache.root and not ctrl.pending_loads
        assert free(cache) == 64


def test_a_one_token_host_hit_loads_when_the_threshold_allows() -> None:
    # load-back threshold 1: a 1-token host hit is loaded back
    life, _, _ = demoted(1, threshold=1)
    a = life.admit(K(0, 500), 2)
    assert (a.device_pages, a.loaded_pages) == (0, 1)


# ------------------------------------------------------------------------------ memory --


def two_leaves() -> tuple[KVLifecycle, HiRadixCache]:
    """Page 4, 8 pages, no host: two cached 2-page prompts (N1 older than N2) and 2 ballast
    pages: 8 tokens free, 16 evictable."""
    life, cache, _ = make(ps=4, device=32)
    serve(life, K("n1a", "n1b"))
    serve(life, K("n2a", "n2b"))
    assert cache.controller.device.alloc_pages(2) is not None
    assert (free(cache), cache.evictable_size()) == (8, 16)
    return life, cache


def test_alloc_evicts_the_full_need_not_the_shortfall() -> None:
    # 8 free < 12: evict(12) takes whole LRU nodes, N1 (8) then N2 (8): 24 free, 1 page taken
    life, cache = two_leaves()
    pages = life.alloc(1, 12)
    assert pages is not None and len(pages) == 1
    assert (free(cache), cache.evictable_size()) == (20, 0)


def test_alloc_does_not_evict_when_enough_is_free() -> None:
    life, cache = two_leaves()
    assert life.alloc(2, 8) is not None  # 8 free >= 8: no eviction
    assert (free(cache), cache.evictable_size()) == (0, 16)


def test_alloc_returns_none_when_the_pool_cannot_supply() -> None:
    life, cache = two_leaves()
    assert life.alloc(7, 28) is None  # 8 + 16 evicted = 24 < 28 tokens
    assert free(cache) == 24


def test_alloc_prompt_evicts_the_rest_of_the_prompt_plus_a_page() -> None:
    # page 4, 8 pages. S (1 page) and O (2 pages, older) cached; X = S + 6 more tokens (10):
    # device hit 1 page; the rest needs ceil(10 / 4) - 1 = 2 pages and evicts
    # 10 - 4 + 4 = 10 tokens when fewer are free. Ballast 3 pages -> 8 free < 10: evict(10)
    # takes O (8 tokens; S is X's prefix, locked) -> 16 free, 2 pages taken -> 8.
    life, cache, _ = make(ps=4, device=32)
    serve(life, K("o1", "o2"))
    serve(life, K("s"))
    assert cache.controller.device.alloc_pages(2) is not None
    x = life.admit(K("s", "x1"), 10).kv
    assert x.kv and len(x.kv) == 1
    assert cache.controller.device.alloc_pages(1) is not None
    assert (free(cache), cache.evictable_size()) == (8, 8)
    pages = life.alloc_prompt(x, 10)
    assert pages is not None and len(pages) == 2 and len(x.kv) == 3
    assert (free(cache), cache.evictable_size()) == (8, 0)
    assert life.alloc_prompt(x, 12) == []  # 3 pages already cover 12 tokens


def test_alloc_prompt_with_nothing_to_allocate_does_not_evict() -> None:
    # page 4, 8 pages: O (1 page) and S (2 pages) cached; X = S exactly (match on 8 of 9
    # tokens): its prefix covers 8 prompt tokens; nothing free, O evictable: asking for the
    # 8-token prompt allocates nothing and evicts nothing
    life, cache, _ = make(ps=4, device=32)
    serve(life, K("o"))
    serve(life, K("s1", "s2"))
    x = life.admit(K("s1", "s2"), 9).kv
    assert len(x.kv) == 2
    assert cache.controller.device.alloc_pages(5) is not None
    assert life.alloc_prompt(x, 8) == []
    assert cache.evictable_size() == 4


@pytest.mark.parametrize(("ps", "evicted"), [(1, 2), (2, 3)])
def test_alloc_prompt_over_estimates_a_page_only_when_paged(ps: int, evicted: int) -> None:
    # 12 pages; N1..N6 (1 page each, oldest first) cached, 5 ballast: 1 page free. A 2-page
    # prompt needs 2 pages and evicts the prompt's tokens, plus one page when page > 1:
    # page 1: evict(2) takes N1, N2; page 2: evict(4 + 2) takes N1..N3.
    life, cache, _ = make(ps=ps, device=12 * ps)
    nodes = [K(f"n{i}") for i in range(6)]
    for n in nodes:
        serve(life, n)
    assert cache.controller.device.alloc_pages(5) is not None
    x = life.admit(K("x1", "x2"), 2 * ps).kv
    pages = life.alloc_prompt(x, 2 * ps)
    assert pages is not None and len(pages) == 2
    hits = [life.match(n, ps + 1).device_hit_length for n in nodes]
    assert hits == [0] * evicted + [ps] * (6 - evicted)


def test_alloc_prompt_aborts_when_the_pool_is_exhausted() -> None:
    life, cache, _ = make(ps=4, device=16)
    serve(life, K("s"))
    x = life.admit(K("s", "x1", "x2"), 12).kv
    assert cache.controller.device.alloc_pages(3) is not None  # nothing free, S locked
    assert life.alloc_prompt(x, 12) is None
    assert x.kv == [] and x.last_node.lock_ref == 0  # aborted: the lock is released
    assert cache.evictable_size() == 4


def test_alloc_outputs_all_at_once_or_page_by_page() -> None:
    # page 4, 8 pages: a 12-token request (3 pages) decoding to 20 tokens needs 2 more pages
    life, cache, _ = make(ps=4, device=32)
    kv = life.admit(K("a", "b", "c"), 12).kv
    assert life.alloc_prompt(kv, 12) is not None
    assert life.alloc_outputs(kv, 20) and len(kv.kv) == 5
    assert life.alloc_outputs(kv, 20) and len(kv.kv) == 5  # nothing more to do
    # page by page: 1 page free, O (2 pages) evictable: the first page is free, the second
    # evicts one page's worth (4 tokens), which takes all of O
    life, cache, _ = make(ps=4, device=32)
    serve(life, K("o1", "o2"))
    kv = life.admit(K("a", "b", "c"), 12).kv
    assert life.alloc_prompt(kv, 12) is not None
    assert cache.controller.device.alloc_pages(2) is not None
    assert (free(cache), cache.evictable_size()) == (4, 8)
    assert life.alloc_outputs(kv, 20) and len(kv.kv) == 5
    assert (free(cache), cache.evictable_size()) == (4, 0)


def test_alloc_outputs_aborts_when_the_pool_runs_out() -> None:
    life, cache, _ = make(ps=4, device=16)
    kv = life.admit(K("a", "b"), 8).kv
    assert life.alloc_prompt(kv, 8) is not None
    life.after_prefill(kv)
    assert cache.controller.device.alloc_pages(1) is not None  # 1 page left
    assert not life.alloc_outputs(kv, 16)  # needs 2: gets 1, then nothing
    # aborted: the decode page is freed, the prompt (in the tree) unlocked
    assert kv.kv == [] and free(cache) == 4 and cache.evictable_size() == 8


# ------------------------------------------------------------------------------ insert --


def test_after_prefill_frees_duplicates_and_moves_the_lock() -> None:
    # page 4, 16 pages, no host. R1 and R2, same 3-page prompt, both admitted before either
    # is inserted (both miss): pages 0-2 and 3-5. R1's insert creates the node; R2's finds it
    # (prefix 12 tokens): R2's own pages 3-5 are freed and R2 now points at 0-2.
    life, cache, _ = make(ps=4, device=64)
    key = K("a", "b", "c")
    r1, r2 = life.admit(key, 12).kv, life.admit(key, 12).kv
    assert life.alloc_prompt(r1, 12) == [0, 1, 2] and life.alloc_prompt(r2, 12) == [3, 4, 5]
    life.after_prefill(r1)
    life.after_prefill(r2)
    assert r1.kv == r2.kv == [0, 1, 2]
    assert r1.protected_pages == r2.protected_pages == 3
    assert r1.last_node is r2.last_node and r1.last_node.lock_ref == 2
    assert free(cache) == 64 - 12 and cache.protected_size() == 12
    life.finish(r1, key, [], 12)
    life.finish(r2, key, [], 12)
    assert (free(cache), cache.evictable_size(), cache.protected_size()) == (52, 12, 0)


def test_after_prefill_of_a_chunk_counts_no_hit() -> None:
    # write_through, host tier: an intermediate chunk's insert writes nothing; the same
    # insert as the post-prefill one counts a hit and writes the node
    life, _, ctrl = make(device=64, host=128)
    kv = life.admit(K(*range(8)), 8).kv
    assert life.alloc_prompt(kv, 8) is not None
    life.after_prefill(kv, chunked=True)
    assert ctrl.write_ops == 0 and kv.last_node.hit_count == 0
    other = life.admit(K(*range(100, 108)), 8).kv
    assert life.alloc_prompt(other, 8) is not None
    life.after_prefill(other)
    assert ctrl.write_ops == 1 and other.last_node.hit_count == 1


@pytest.mark.parametrize(("outputs", "tree", "free_after"), [("cache", 12, 52), ("skip", 8, 56)])
def test_finish_inserts_prompt_and_outputs_or_only_the_prompt(
    outputs: str, tree: int, free_after: int
) -> None:
    # page 4, 16 pages: prompt 8 tokens (2 pages), KV of 13 tokens at finish (4 pages).
    # cache: the 3 full pages (prompt + 1 output page) stay in the tree, the partial 4th page
    # is freed -> 12 tokens cached, 52 free. skip: only the prompt's 2 pages stay -> 8, 56.
    life, cache, _ = make(ps=4, device=64, outputs=outputs)
    prompt = K("a", "b")
    kv = life.admit(prompt, 8).kv
    assert life.alloc_prompt(kv, 8) is not None
    life.after_prefill(kv)
    assert life.alloc_outputs(kv, 13) and len(kv.kv) == 4
    out: list[object] = []
    life.finish(kv, prompt, out, 13)
    assert (cache.evictable_size(), cache.protected_size(), free(cache)) == (tree, 0, free_after)
    assert out == ([-1] if outputs == "cache" else [])
    assert kv.kv == []


def test_abort_frees_its_own_pages_and_inserts_nothing() -> None:
    # page 4, 16 pages: S (1 page) cached; X = S + 2 pages, admitted (hit 1 page), allocated
    # 2 more pages, then aborted before its insert: its 2 pages are freed, S unlocked, and
    # nothing of X's own prompt is in the tree
    life, cache, _ = make(ps=4, device=64)
    serve(life, K("s"))
    x = life.admit(K("s", "x1", "x2"), 12).kv
    assert life.alloc_prompt(x, 12) is not None
    assert free(cache) == 64 - 12
    life.abort(x)
    assert x.kv == [] and free(cache) == 60
    assert (cache.evictable_size(), cache.protected_size()) == (4, 0)
    assert life.match(K("s", "x1", "x2"), 13).device_hit_length == 4


def test_cache_unfinished_req_counts_a_hit_by_default_and_takes_any_key() -> None:
    # called directly (not through after_prefill): not a chunk unless said so, so the new
    # node counts a hit and is written through; a plain list of page symbols is a paged key
    life, cache, ctrl = make(ps=4, device=64, host=128)
    pages = cache.controller.device.alloc_pages(3)
    assert pages is not None
    kv = ReqKV(key=["a", "b", "c"], kv=pages, last_node=cache.root)
    cache_unfinished_req(cache, kv)
    assert kv.protected_pages == 3 and kv.last_node.hit_count == 1
    assert ctrl.write_ops == 1
    assert life.match(K("a", "b", "c"), 13).device_hit_length == 12


def test_cache_finished_req_inserts_the_first_pages_and_frees_the_rest() -> None:
    # page 4, 16 pages: a 3-page key with insert_pages 2: 2 pages cached, the 3rd freed
    _, cache, _ = make(ps=4, device=64)
    pages = cache.controller.device.alloc_pages(3)
    assert pages is not None
    kv = ReqKV(key=K("a", "b", "c"), kv=pages, last_node=cache.root)
    cache_finished_req(cache, kv, insert_pages=2)
    assert (cache.evictable_size(), free(cache), kv.kv) == (8, 56, [])
    # a plain list key is paged: all 3 pages cached
    pages = cache.controller.device.alloc_pages(3)
    assert pages is not None
    kv = ReqKV(key=["x", "y", "z"], kv=pages, last_node=cache.root)
    cache_finished_req(cache, kv)
    assert (cache.evictable_size(), free(cache)) == (20, 44)


def test_finish_frees_pages_duplicated_by_an_earlier_finish() -> None:
    # page 4, 16 pages. R1 and R2, same 3-page prompt, both admitted before either is cached,
    # finish in their prefill step (no after_prefill): R1's finish caches its pages 0-2, R2's
    # finds them (prefix 3 pages beyond its 0 protected) and frees its own 3-5
    life, cache, _ = make(ps=4, device=64)
    key = K("a", "b", "c")
    r1, r2 = life.admit(key, 12).kv, life.admit(key, 12).kv
    assert life.alloc_prompt(r1, 12) == [0, 1, 2] and life.alloc_prompt(r2, 12) == [3, 4, 5]
    life.finish(r1, key, [], 12)
    life.finish(r2, key, [], 12)
    assert (cache.evictable_size(), free(cache)) == (12, 52)
    assert sorted(cache.controller.device.free_pages_snapshot())[:3] == [3, 4, 5]


# ---------------------------------------------------------------------------- counters --


def test_cache_counters_rates_and_collect() -> None:
    from hicache.lifecycle import CacheCounters

    c = CacheCounters(requests=2, prompt_tokens=200, device_hit_tokens=60, host_hit_tokens=40)
    assert (c.hit_rate, c.device_hit_rate, c.host_hit_rate) == pytest.approx((0.5, 0.3, 0.2))
    assert CacheCounters(device_hit_tokens=3).hit_rate == 3.0  # no prompt tokens: / 1
    # the 10-token demotion scenario, reloaded: 10 written, 10 evicted, then 10 loaded
    life, cache, ctrl = demoted(10)
    life.admit(K(*range(10), 500, 501), 12)
    ctrl.start_loading()
    c.collect(cache, ctrl)
    assert (c.tokens_written, c.tokens_loaded, c.device_evicted_tokens) == (10, 10, 10)
    assert (c.host_evicted_tokens, c.host_alloc_failures, c.load_back_failures) == (0, 0, 0)
    d = c.as_dict()
    assert list(d)[:2] == ["requests", "prompt_tokens"]
    assert list(d)[-4:] == ["hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate"]
    s = CacheCounters(prompt_tokens=100, device_hit_tokens=10, host_hit_tokens=5,
                      storage_hit_tokens=20)  # fmt: skip
    assert (s.hit_rate, s.storage_hit_rate) == pytest.approx((0.35, 0.2))
    assert (d["requests"], d["tokens_loaded"], d["hit_rate"]) == (2, 10, pytest.approx(0.5))


def test_with_symbols_keeps_every_other_field() -> None:
    """``PagedRequest.with_symbols`` is ``dataclasses.replace(r, symbols=...)``: a field added
    later and not passed on would make these differ."""
    import dataclasses

    values: dict[str, object] = {
        "symbols": PageKey(("a", "b")), "input_length": 130, "output_length": 7, "rid": 3,
        "arrival_s": 1.5, "session": "s", "turn": 2, "think_time_s": 0.25,
    }  # fmt: skip
    # none is a default, and a field added to PagedRequest must be added here
    assert set(values) == {f.name for f in dataclasses.fields(PagedRequest)}
    r = PagedRequest(**values)  # type: ignore[arg-type]
    got = r.with_symbols(PageKey(("c",)))
    assert got == dataclasses.replace(r, symbols=PageKey(("c",)))
