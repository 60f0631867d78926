"""The scheduler's decisions (POLICY_CORE.md §6) on hand-computed scenarios: PrefillAdder's
budgets, new_token_ratio, chunked prefill, the decode memory check and retraction, LPM.

Every number in an assertion is computed by hand in the comment above it. Most tests drive the
scheduler one step at a time (``tests/sim/harness.py``): queue requests, form one batch, run it,
run one decode segment, then look at the state. Page size 1 unless a page boundary matters.
"""

from __future__ import annotations

import pytest

from sim.engine import Engine
from sim.scheduler import SchedulerParams, SimReq
from tests.sim.harness import (
    admit,
    ballast,
    costs,
    decode_once,
    engine,
    prefill_all,
    req,
    run_batch,
)


def rids(batch: list[tuple[SimReq, int, int]] | None) -> list[int]:
    return [r.rid for r, _, _ in batch or []]


def eng(device: int, ps: int = 1, host: int = 0, **sched: object) -> Engine:
    """An engine with no requests of its own (the test queues them), ``device`` tokens and no
    host tier unless ``host``."""
    return engine(
        [],
        page_size=ps,
        device_tokens=device,
        host_tokens=host,
        sched=SchedulerParams(page_size=ps, **sched),  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------ PrefillAdder budgets --


@pytest.mark.parametrize(("prompt", "admitted"), [(672, True), (673, False)])
def test_rem_total_subtracts_the_running_requests_reserved_decode_tokens(
    prompt: int, admitted: bool
) -> None:
    # ratio 0.5, clip 300. Running: R1 (prompt 100, 401 outputs) and R2 (prompt 50, 51
    # outputs), each with 1 token decoded by its prefill:
    #   R1 reserves min(400, 300) * 0.5 = 150, R2 reserves min(50, 300) * 0.5 = 25 -> 175.
    # Free = 1000 - 150 (their prompts, locked in the tree) = 850, nothing evictable:
    #   rem_total = 850 - 175 = 675.
    # X (prompt p, 1 output) needs p + 1 + page 1 = p + 2 and is admitted iff p + 2 < 675.
    e = eng(1000, init_new_token_ratio=0.5, clip_max_new_tokens=300)
    assert prefill_all(e, req(1, 0, 100, 401), req(2, 0, 50, 51)) == 1
    assert e.sched._reserved() == pytest.approx(175.0)
    assert e.device.available_size() == 850 and e.cache.evictable_size() == 0
    batch = admit(e, req(3, 0, prompt, 1))
    assert rids(batch) == ([3] if admitted else [])


def test_reserved_uses_the_current_new_token_ratio_and_clip() -> None:
    # one running request with 99 outputs left, clip 4096: 99 * ratio
    e = eng(1000, init_new_token_ratio=0.4)
    prefill_all(e, req(1, 0, 10, 100))
    assert e.sched._reserved() == pytest.approx(99 * 0.4)
    e.sched.new_token_ratio = 0.1
    assert e.sched._reserved() == pytest.approx(99 * 0.1)


@pytest.mark.parametrize(
    ("outputs", "admitted", "waiting"), [(251, [1, 2], [3]), (252, [1], [2, 3])]
)
def test_in_batch_admissions_reserve_extend_outputs_and_a_page(
    outputs: int, admitted: list[int], waiting: list[int]
) -> None:
    # page 16, 1024 free tokens, nothing running. A (320 tokens, 100 outputs) reserves
    # 320 + 100 + 16 = 436 -> rem_total 588. B (320 tokens, n outputs) needs 336 + n: admitted
    # iff 336 + n < 588, i.e. n <= 251. With n = 251 B reserves 587 -> rem_total 1, and C
    # (16 tokens, 1 output: needs 33) is refused: 33 >= 1. With n = 252 B is refused
    # (NO_TOKEN), and C, which would fit (33 < 588), is not even tried: FCFS stops at the head.
    e = eng(1024, ps=16)
    batch = admit(e, req(1, 0, 320, 100), req(2, 0, 320, outputs), req(3, 0, 16, 1))
    assert rids(batch) == admitted
    assert [r.rid for r in e.sched.waiting] == waiting


def test_max_prefill_tokens_stops_the_batch_without_chunking() -> None:
    # chunking off, max_prefill_tokens 1000: 400 (rem_input 600), 400 (400 < 600: rem_input
    # 200), then 400 >= 200 -> OTHER; the 10-token request behind it is not tried.
    e = eng(10_000, chunked_prefill_size=-1, max_prefill_tokens=1000)
    batch = admit(e, *(req(i, 0, n, 1) for i, n in enumerate([400, 400, 400, 10])))
    assert rids(batch) == [0, 1]
    assert [(ext, cached) for _, ext, cached in batch or []] == [(400, 0), (400, 0)]


@pytest.mark.parametrize(("second", "admitted"), [(599, [0, 1]), (600, [0])])
def test_max_prefill_tokens_boundary(second: int, admitted: list[int]) -> None:
    # after 400 tokens, 600 remain: a second request of 600 tokens is refused (>=), 599 fits
    e = eng(10_000, chunked_prefill_size=-1, max_prefill_tokens=1000)
    assert rids(admit(e, req(0, 0, 400, 1), req(1, 0, second, 1))) == admitted


def test_the_first_request_may_exceed_max_prefill_tokens_alone() -> None:
    # an empty batch always takes its head request; then rem_input = 1000 - 1500 <= 0 ends it
    e = eng(10_000, chunked_prefill_size=-1, max_prefill_tokens=1000)
    assert rids(admit(e, req(0, 0, 1500, 1), req(1, 0, 10, 1))) == [0]


def test_max_running_requests_counts_running_and_batch() -> None:
    # cap 2, one request running: one more is admitted (1 + 0 < 2), the next is not (1 + 1)
    e = eng(1000, max_running_requests=2)
    prefill_all(e, req(0, 0, 10, 50))
    assert rids(admit(e, req(1, 0, 10, 1), req(2, 0, 10, 1))) == [1]
    # two running: no prefill batch at all, even with requests waiting
    e = eng(1000, max_running_requests=2)
    prefill_all(e, req(0, 0, 10, 50), req(1, 0, 10, 50))
    assert len(e.sched.running) == 2
    assert admit(e, req(2, 0, 10, 1)) is None


@pytest.mark.parametrize(("outputs", "admitted"), [(3, True), (4, False)])
def test_locking_the_device_prefix_can_turn_the_budget_into_no_token(
    outputs: int, admitted: bool
) -> None:
    # S (40 tokens, 1 output) finished: its prompt is in the tree, evictable; free 60.
    # X = S's 40 tokens + 55 new, n outputs: device hit 40, extend 55, needs 55 + n + 1.
    # Before the temporary lock rem_total = 60 + 40 = 100; once X locks S's node it is 60.
    # n = 3: 59 < 60, admitted. n = 4: 60 >= 60 -> NO_TOKEN after the lock (it passed the
    # first check, 60 < 100), and the temporary lock is released again.
    e = eng(100)
    prefill_all(e, req(0, 0, 40, 1))
    assert (e.device.available_size(), e.cache.evictable_size()) == (60, 40)
    x = req(1, 0, 95, outputs, symbols=(*range(40), *range(900, 955)))
    batch = admit(e, x)
    if admitted:
        assert batch == [(x, 55, 40)]
        assert e.cache.evictable_size() == 0  # X's own lock
    else:
        assert batch is None
        assert e.cache.evictable_size() == 40 and e.cache.protected_size() == 0


# ------------------------------------------------------------------------ new_token_ratio --


def test_new_token_ratio_parameters() -> None:
    # init = 0.5 * 1.5 = 0.75; min = 0.75 * 0.2 = 0.15; decay = (0.75 - 0.15) / 6 = 0.1
    e = eng(1000, init_new_token_ratio=0.5, schedule_conservativeness=1.5,
            min_new_token_ratio_factor=0.2, new_token_ratio_decay_steps=6)  # fmt: skip
    s = e.sched
    assert (s.init_ratio, s.min_ratio, s.ratio_decay) == pytest.approx((0.75, 0.15, 0.1))
    assert s.new_token_ratio == pytest.approx(0.75)
    # init is capped at 1: 0.8 * 2 = 1.6 -> 1; min 1 * 0.2 = 0.2; decay (1 - 0.2) / 4 = 0.2
    e = eng(1000, init_new_token_ratio=0.8, schedule_conservativeness=2.0,
            min_new_token_ratio_factor=0.2, new_token_ratio_decay_steps=4)  # fmt: skip
    s = e.sched
    assert (s.init_ratio, s.min_ratio, s.ratio_decay) == pytest.approx((1.0, 0.2, 0.2))
    # one decay step: all the way down at once, (0.5 - 0.1) / 1
    e = eng(1000, init_new_token_ratio=0.5, min_new_token_ratio_factor=0.2,
            new_token_ratio_decay_steps=1)  # fmt: skip
    assert e.sched.ratio_decay == pytest.approx(0.4)


@pytest.mark.parametrize(("outputs", "ratio"), [(5, 0.35), (20, 0.15)])
def test_new_token_ratio_decays_per_decode_step_down_to_the_minimum(
    outputs: int, ratio: float
) -> None:
    # init 0.75, min 0.15, decay 0.1 per step. Page 16, one 16-token request: the prefill
    # makes token 1; decode runs in segments up to a page boundary or the finish:
    # 5 outputs: one segment of 4 steps -> 0.75 - 0.4 = 0.35 at the finish;
    # 20 outputs: segments of 16 then 3 steps -> max(0.15, 0.75 - 1.9) = 0.15.
    # Then the server is idle: on_idle resets the ratio to init.
    e = engine([req(0, 0.0, 16, outputs)], sched=SchedulerParams(
        page_size=16, init_new_token_ratio=0.5, schedule_conservativeness=1.5,
        min_new_token_ratio_factor=0.2, new_token_ratio_decay_steps=6))  # fmt: skip
    at_finish: list[float] = []
    finish = e.sched.on_finish
    e.sched.on_finish = lambda r: (at_finish.append(e.sched.new_token_ratio), finish(r))[1]
    e.run()
    assert at_finish == [pytest.approx(ratio)]
    assert e.sched.new_token_ratio == pytest.approx(0.75)
    decodes = [end - start for kind, start, end, _ in e.sched.spans if kind == "decode"]
    assert decodes == pytest.approx([0.04] if outputs == 5 else [0.16, 0.03])


# ----------------------------------------------------------------------------- retraction --


def test_retraction_victim_is_fewest_decoded_then_longest_prompt() -> None:
    # ratio: init 0.5, min 0.1, decay 0.1 per step. Page 1, so every decode segment is 1 step.
    # A (prompt 10) decodes 2 steps alone; then B (prompt 5) and C (prompt 8) join; 1 more
    # step: decoded A 4, B 2, C 2 (the prefill makes the first token); ratio 0.5 - 0.3 = 0.2.
    # Victim = min over (decoded, -prompt): (4,-10), (2,-5), (2,-8) -> C (fewest decoded; tie
    # with B broken by the longer prompt). The ratio is re-estimated by the decode check, not
    # here.
    e = eng(1000, init_new_token_ratio=0.5, min_new_token_ratio_factor=0.2,
            new_token_ratio_decay_steps=4)  # fmt: skip
    a, b, c = req(0, 0, 10, 50), req(1, 0, 5, 50), req(2, 0, 8, 50)
    prefill_all(e, a)
    decode_once(e)
    decode_once(e)
    prefill_all(e, b, c)
    decode_once(e)
    assert [r.decoded for r in (a, b, c)] == [4, 2, 2]
    # the running KV total the scheduler keeps: A 10 + 3, B 5 + 1, C 8 + 1
    assert e.sched.kv_total == sum(r.kv_tokens for r in e.sched.running) == 28
    assert e.sched.new_token_ratio == pytest.approx(0.2)
    # pages: A 10 + 3 decode, B 5 + 1, C 8 + 1 = 28 -> 972 free
    assert e.device.available_size() == 972
    e.sched._retract_one()
    assert e.sched.running == [a, b] and list(e.sched.waiting) == [c]
    assert e.sched.kv_total == 13 + 6
    assert e.sched.new_token_ratio == pytest.approx(0.2)
    # C re-prefills its prompt and its 2 decoded tokens; its decode page is freed, its prompt
    # stays in the tree (inserted after prefill), unlocked
    assert (c.fill_len, c.filled, c.retractions, c.kv) == (10, 0, 1, None)
    assert e.device.available_size() == 973
    assert e.cache.evictable_size() == 8


def test_decode_check_needs_a_page_only_at_page_boundaries() -> None:
    # page 4, 16 pages. X (4 tokens, 1 output) finished: 1 evictable page. A (8 tokens: 2 full
    # pages) and B (6 tokens: 1.5 pages) hold 4 pages; ballast 10 pages -> 1 page (4 tokens)
    # free. Only A is at a page boundary, so the check needs 4 tokens: exactly what is free,
    # so the check evicts nothing and retracts nothing. The allocation then over-estimates
    # one page per request (alloc_for_decode: 2 x 4 = 8 tokens > 4 free) and 0.5.14 evicts
    # the whole 8: X goes. A gets a page; 1 page is left, fewer than the 2 the next step's
    # allocation asks, so the call is one step of 10 ms.
    e = eng(64, ps=4)
    x, a, b = req(9, 0, 4, 1), req(0, 0, 8, 10), req(1, 0, 6, 10)
    prefill_all(e, x)
    prefill_all(e, a, b)
    assert e.device.available_size() == 44
    ballast(e, 10)
    decode_once(e)
    assert e.sched.running == [a, b] and not e.sched.waiting
    assert (a.kv_tokens, b.kv_tokens, a.decoded, b.decoded) == (9, 7, 2, 2)
    assert a.kv is not None and b.kv is not None
    assert (len(a.kv.kv), len(b.kv.kv)) == (3, 2)
    assert e.device.available_size() == 4
    assert e.cache.evictable_size() == 0  # X, evicted by the over-estimate
    assert e.sched.spans[-1][0] == "decode"
    assert e.sched.spans[-1][2] - e.sched.spans[-1][1] == pytest.approx(0.01)
    # the next call: B reaches its boundary after 1 more step (7 -> 8 tokens) and takes the
    # last page; a step at a time while fewer pages are free than requests run
    decode_once(e)
    decode_once(e)
    assert (a.kv_tokens, b.kv_tokens) == (11, 9) and len(b.kv.kv) == 3
    assert e.device.available_size() == 0


def test_decode_check_evicts_before_retracting() -> None:
    # page 4, 16 pages. X (8 tokens, 1 output) finished: 2 evictable pages in the tree.
    # Y (12 tokens) and Z (20 tokens) take 3 + 5 pages; ballast the 6 free pages.
    # Both are at a page boundary: need 8 tokens, 0 free -> evict(8) removes X's 2 pages;
    # 8 free >= 8: no retraction; the allocation's over-estimate (2 pages) is covered, one
    # page each; 0 pages are left, fewer than the next step's over-estimate asks, so each
    # call is one step (SGLang's allocation tries to evict at each; nothing is left to evict)
    # and the next boundary is 4 calls away.
    e = eng(64, ps=4)
    x, y, z = req(0, 0, 8, 1), req(1, 0, 12, 10), req(2, 0, 20, 10)
    prefill_all(e, x)
    prefill_all(e, y, z)
    assert (e.device.available_size(), e.cache.evictable_size()) == (24, 8)
    ballast(e, 6)
    decode_once(e)
    assert (y.kv_tokens, z.kv_tokens) == (13, 21)
    for _ in range(3):
        decode_once(e)
    assert e.sched.running == [y, z] and y.retractions == z.retractions == 0
    assert (y.kv_tokens, z.kv_tokens) == (16, 24)
    assert e.cache.match_prefix(x.prompt).device_hit_length == 0  # X was evicted
    assert e.cache.evictable_size() == 0 and e.device.available_size() == 0


def test_decode_check_retracts_until_the_batch_fits() -> None:
    # page 4, 16 pages; ratio init 0.05, min 0.025, decay 0.0025 per step.
    # R (4 tokens, 20 outputs) prefills and decodes one 4-step segment alone: decoded 5, KV 8
    # tokens in 2 pages; ratio 0.05 - 4 * 0.0025 = 0.04. P and Q (4 tokens, 10 outputs) prefill
    # together: 1 page each. Ballast the 12 free pages.
    # Decode check: R (KV 8), P, Q (KV 4) all at a boundary: need 12 tokens, 0 free, nothing
    # evictable (prompts locked). retract_decode pops the last of the stable descending sort
    # on (decoded, -prompt), R P Q -> R P Q, so the tie P/Q goes to the last in the batch:
    #   1. Q: its only page is its prompt, in the tree, now unlocked; release_req evicts for
    #      20 tokens per request left (40): Q's prompt page; the check of R and P needs 8,
    #      4 free (evict(8) finds nothing more).
    #   2. P: unlocked, evicted for 20 tokens: 8 free; R needs 4: fits.
    # R gets the page; the ratio is re-estimated from R alone, min(1, (5 + 20) / (20 + 1)) = 1,
    # and not decayed on that step; the queue waits (Q, then P) for the next iteration.
    e = eng(64, ps=4, init_new_token_ratio=0.05, min_new_token_ratio_factor=0.5,
            new_token_ratio_decay_steps=10)  # fmt: skip
    r, p, q = req(0, 0, 4, 20), req(1, 0, 4, 10), req(2, 0, 4, 10)
    prefill_all(e, r)
    decode_once(e)
    assert (r.decoded, r.kv_tokens) == (5, 8)
    assert e.sched.new_token_ratio == pytest.approx(0.04)
    assert prefill_all(e, p, q) == 1
    assert e.device.available_size() == 48
    ballast(e, 12)
    decode_once(e)
    assert e.sched.running == [r] and list(e.sched.waiting) == [q, p]
    assert (r.retractions, p.retractions, q.retractions) == (0, 1, 1)
    assert (r.decoded, r.kv_tokens) == (6, 9)
    assert e.sched.new_token_ratio == 1.0
    assert e.device.available_size() == 4
    # both prompts were evicted by the retraction path
    assert e.cache.match_prefix(p.prompt).device_hit_length == 0
    assert e.cache.match_prefix(q.prompt).device_hit_length == 0
    assert e.cache.evictable_size() == 0


def test_decode_check_fails_when_one_request_cannot_fit() -> None:
    # a lone request at a page boundary, no page free, nothing evictable: nothing to retract
    e = eng(32, ps=4)
    prefill_all(e, req(0, 0, 4, 10))
    ballast(e, 7)
    msg = (
        r"^device pool cannot hold even one decoding request \(device_tokens too small for this "
        r"trace's longest request\)$"
    )
    with pytest.raises(RuntimeError, match=msg):
        decode_once(e)


# -------------------------------------------------------------------------- chunked prefill --


def test_chunked_prefill_first_chunk_page_aligned_later_ones_take_the_chunk_budget() -> None:
    # page 16, chunk 100. A = 250 tokens, B = 50 tokens, 1 output each. Budgets are charged
    # whole pages (_update_prefill_budget: ceil_paged_tokens).
    # batch 1: A's 250 (256 paged) > 100 -> truncated to 100 // 16 * 16 = 96 (add_one_req
    #          aligns prefix + chunk); A is the chunked request.
    # batch 2: A first (add_chunked_req): min(154 left, 100) = 100 tokens, not aligned; the
    #          chunk budget is charged 112 -> below zero: B is not tried.
    # batch 3: A's last 54 tokens (64 charged); 36 left: B's 50 (64 paged) is truncated to
    #          36 // 16 * 16 = 32 and becomes the chunked request.
    # batch 4: B's last 18 tokens.
    e = eng(10_000, ps=16, chunked_prefill_size=100)
    a, b = req(0, 0, 250, 1), req(1, 0, 50, 1)
    expected = [
        [(a, 96, 0)],
        [(a, 100, 96)],
        [(a, 54, 196), (b, 32, 0)],
        [(b, 18, 32)],
    ]
    chunked_after = [a, a, b, None]
    e.sched.arrive(a)
    e.sched.arrive(b)
    for want, chunked in zip(expected, chunked_after, strict=True):
        batch = e.sched._get_new_batch_prefill()
        assert batch == want
        assert e.sched.chunked is chunked
        run_batch(e, batch)
    assert e.sched._get_new_batch_prefill() is None
    assert (a.computed, b.computed) == (250, 50)
    assert a.finish >= 0 and b.finish >= 0


def test_chunked_prefill_respects_the_cached_prefix() -> None:
    # page 16, chunk 64. S (48 tokens = 3 pages) is cached; X = S + 100 new tokens (symbols
    # are per page: S's 3, then 6 new full pages). X's match (on 147 tokens) hits 48;
    # extend 100 > 64 -> chunk 64 (page-aligned: 48 + 64 = 112 is 7 pages); the next batch
    # continues with min(64, 36) = 36.
    e = eng(10_000, ps=16, chunked_prefill_size=64)
    prefill_all(e, req(0, 0, 48, 1))
    x = req(1, 0, 148, 1, symbols=(0, 1, 2, *range(500, 506)))
    batch = admit(e, x)
    assert batch == [(x, 64, 48)] and e.sched.chunked is x
    run_batch(e, batch)
    assert e.sched._get_new_batch_prefill() == [(x, 36, 112)]


# ----------------------------------------------------------------------------- LPM vs FCFS --


def lpm_setup(policy: str, lpm_max_queue: int = 128) -> tuple[Engine, list[SimReq]]:
    """Page 1, write_through. S3 (30 tokens) is cached then demoted to host; S1 (40) and S2 (20)
    stay on device. Queue: X (30 new), Y = S2 + 10, W = S3 + 10, Z = S1 + 10."""
    sched = SchedulerParams(page_size=1, policy=policy, lpm_max_queue=lpm_max_queue)
    e = engine([], page_size=1, device_tokens=1000, host_tokens=1000, sched=sched)
    s3 = req(3, 0, 30, 1, symbols=range(3000, 3030))
    s1 = req(1, 0, 40, 1, symbols=range(1000, 1040))
    s2 = req(2, 0, 20, 1, symbols=range(2000, 2020))
    for s in (s3, s1, s2):
        prefill_all(e, s)  # each is written through (write completes as the env runs)
    e.cache.writing_check()  # process the acks: the written nodes unpin
    assert e.cache.evict(30) == 30  # LRU: S3, the oldest, demoted to host
    queue = [
        req(10, 0, 30, 1),
        req(11, 0, 30, 1, symbols=(*range(2000, 2020), *range(7000, 7010))),
        req(12, 0, 40, 1, symbols=(*range(3000, 3030), *range(8000, 8010))),
        req(13, 0, 50, 1, symbols=(*range(1000, 1040), *range(9000, 9010))),
    ]
    return e, queue


def test_lpm_orders_by_device_plus_host_hit_and_fcfs_keeps_arrival_order() -> None:
    # hits (on input_len - 1 tokens): X 0, Y 20 (device), W 30 (host), Z 40 (device)
    e, queue = lpm_setup("lpm")
    batch = admit(e, *queue)
    assert rids(batch) == [13, 12, 11, 10]
    assert [(ext, cached) for _, ext, cached in batch or []] == [(10, 40), (10, 30), (10, 20),
                                                               (30, 0)]  # fmt: skip
    e, queue = lpm_setup("fcfs")
    assert rids(admit(e, *queue)) == [10, 11, 12, 13]


def test_lpm_falls_back_to_fcfs_above_the_queue_limit() -> None:
    e, queue = lpm_setup("lpm", lpm_max_queue=3)  # 4 waiting > 3
    assert rids(admit(e, *queue)) == [10, 11, 12, 13]
    e, queue = lpm_setup("lpm", lpm_max_queue=4)  # 4 waiting <= 4: sorted
    assert rids(admit(e, *queue)) == [13, 12, 11, 10]


# ----------------------------------------------------------------- timing of the main loop --


def test_decode_segments_stop_before_the_next_arrival() -> None:
    # page 16; a decode step costs 10 ms + 0.1 ms per KV token. A (16 tokens, 10 outputs) at
    # 0; B at 30 ms. Prefill A: 16 * 0.1 ms = 1.6 ms. First segment from 1.6 ms, KV 16:
    # steps of 11.6, 11.7, 11.8 ms...; the budget to B's arrival is 28.4 ms: 11.6 + 11.7 =
    # 23.3 fits, + 11.8 does not -> 2 steps, ends at 24.9 ms. Next: only 5.1 ms to B, less
    # than a step -> 1 step (11.8 ms), ends at 36.7 ms; then B's prefill (16 tokens, 1.6 ms).
    a = req(0, 0.0, 16, 10)
    b = req(1, 0.030, 16, 1)
    e = engine([a, b], sched=SchedulerParams(page_size=16),
               costs=costs(decode_step=0.01, decode_per_kv_token=1e-4))  # fmt: skip
    e.run()
    spans = [(k, s, t, bs) for k, s, t, bs in e.sched.spans]
    assert [k for k, *_ in spans[:4]] == ["prefill", "decode", "decode", "prefill"]
    assert [(s, t) for _, s, t, _ in spans[:4]] == [
        pytest.approx((0.0, 0.0016)),
        pytest.approx((0.0016, 0.0249)),
        pytest.approx((0.0249, 0.0367)),
        pytest.approx((0.0367, 0.0383)),
    ]
    assert b.first_token == pytest.approx(0.0383)


# ------------------------------------------------------------- prefill allocation, re-prefill --


def test_a_retracted_request_reprefills_its_prompt_and_decoded_tokens() -> None:
    # as in the victim test: C (prompt 8) is retracted with 2 tokens decoded. Its prompt is
    # still cached, so it re-prefills only its 2 decoded tokens (their symbols are unique:
    # never a hit): batch [(C, 2 new, 8 cached)]. That prefill produces its 3rd token; the
    # first-admission metrics (device hit 0, first token, admission time) are kept.
    e = eng(1000)
    a, b, c = req(0, 0, 10, 50), req(1, 0, 5, 50), req(2, 0, 8, 50)
    prefill_all(e, a)
    decode_once(e)
    decode_once(e)
    prefill_all(e, b, c)
    first, admitted = c.first_token, c.admitted
    decode_once(e)
    e.sched._retract_one()
    assert list(e.sched.waiting) == [c]
    batch = e.sched._get_new_batch_prefill()
    assert batch == [(c, 2, 8)]
    run_batch(e, batch)
    assert (c.decoded, c.kv_tokens, c.computed, c.filled) == (3, 10, 10, 10)
    assert (c.device_hit, c.first_token, c.admitted) == (0, first, admitted)
    assert c in e.sched.running and c.kv is not None and len(c.kv.kv) == 10


def test_prefill_allocation_evicts_the_extend_at_page_one() -> None:
    # page 1, 25 tokens: N1 (10, older) and N2 (10) finished, 5 free. X (10 tokens): the
    # allocation needs 10 > 5 free -> evict(10) takes N1 only.
    e = eng(25)
    n1, n2 = req(0, 0, 10, 1), req(1, 0, 10, 1)
    prefill_all(e, n1)
    prefill_all(e, n2)
    x = req(2, 0, 10, 1)
    prefill_all(e, x)
    assert e.cache.match_prefix(n1.prompt).device_hit_length == 0
    assert e.cache.match_prefix(n2.prompt).device_hit_length == 10
    assert x.prefill_s == pytest.approx(10 * 1e-4)


def test_prefill_allocation_over_estimates_a_page_per_request_when_paged() -> None:
    # page 4, 12 pages: N1 and N2 (2 pages each) finished; ballast 6 -> 8 tokens free. X (8
    # tokens) needs 8 + 1 request * 4 = 12 > 8 -> evict(12) takes N1 and N2 (whole nodes).
    e = eng(48, ps=4)
    n1, n2 = req(0, 0, 8, 1), req(1, 0, 8, 1)
    prefill_all(e, n1)
    prefill_all(e, n2)
    ballast(e, 6)
    assert (e.device.available_size(), e.cache.evictable_size()) == (8, 16)
    x = req(2, 0, 8, 1)
    prefill_all(e, x)
    # N1 and N2 evicted (16 tokens); X's 2 pages taken, then X's prompt cached (evictable)
    assert e.cache.match_prefix(n2.prompt).device_hit_length == 0
    assert (e.device.available_size(), e.cache.evictable_size()) == (16, 8)


def test_decode_processes_write_acks_before_its_memory_check() -> None:
    # page 4, 8 pages, host tier, write_through. X (8 tokens, 1 output) finished and was
    # written through (pinned until its ack is processed; the copy completes as the env runs).
    # Y (4 tokens) prefills; ballast the 5 free pages. Y is at a page boundary and needs 4
    # tokens: the decode step first processes the acks (flush_write_through_acks), so X, now
    # backed up, can be demoted to host to make room; no retraction is possible (Y is alone).
    e = eng(32, ps=4, host=64)  # write_through by default
    x, y = req(0, 0, 8, 1), req(1, 0, 4, 10)
    prefill_all(e, x)
    prefill_all(e, y)
    assert e.ctrl.write_ops == 2  # X's prompt at finish, Y's prompt after its prefill
    ballast(e, 5)
    decode_once(e)
    assert y.kv is not None and len(y.kv.kv) == 2
    m = e.cache.match_prefix(x.prompt)
    assert (m.device_hit_length, m.host_hit_length) == (0, 8)  # demoted, not deleted


def test_sim_req_defaults() -> None:
    r = req(7, 2.5, 10, 0)
    assert (r.rid, r.input_length, r.arrival, r.output_length) == (7, 10, 2.5, 1)
    assert SimReq(r.req, arrival=4.0).arrival == 4.0
    # only a negative arrival means "the trace's": 0 and 0.5 are real times
    assert SimReq(r.req, arrival=0.0).arrival == 0.0
    assert SimReq(r.req, arrival=0.5).arrival == 0.5


def test_a_last_chunk_of_one_token() -> None:
    # page 1, chunk 96: a 97-token prompt is prefilled as 96 + 1
    e = eng(1000, chunked_prefill_size=96)
    a = req(0, 0, 97, 1)
    batch = admit(e, a)
    assert batch == [(a, 96, 0)]
    run_batch(e, batch)
    batch = e.sched._get_new_batch_prefill()
    assert batch == [(a, 1, 96)] and e.sched.chunked is None
    run_batch(e, batch)
    assert a.finish >= 0 and a.computed == 97


def test_lpm_is_stable_for_equal_matches() -> None:
    # two more requests without any hit join the queue: equal scores keep arrival order
    e, queue = lpm_setup("lpm")
    queue += [req(14, 0, 30, 1), req(15, 0, 30, 1)]
    assert rids(admit(e, *queue)) == [13, 12, 11, 10, 14, 15]


def test_retraction_evicts_retract_decode_steps_per_remaining_request() -> None:
    # page 1, 150 tokens, ratio init 0.01. R1 and R2 (5 tokens, 50 outputs) prefill and decode
    # one step (decoded 2, 6 pages each). F1 (N1: 20 tokens) and F2 (N1 + N2: 40 tokens)
    # finish, so the tree holds the chain N1 -> N2; V (N1 + N2 + N3: 60 tokens) prefills its
    # last 20 and locks the chain. Ballast the 78 free pages.
    # Decode check: 3 tokens needed, nothing evictable (all locked). Victim: V (1 decoded).
    # Unlocking V's path makes N3, then N2, then N1 evictable; the 2 remaining requests need 2
    # tokens, 0 free -> evict(20 * 2 = 40): N3 (20) and N2 (20). N1 stays cached.
    e = eng(150, init_new_token_ratio=0.01)
    r1, r2 = req(0, 0, 5, 50), req(1, 0, 5, 50)
    n1, n2, n3 = range(1000, 1020), range(2000, 2020), range(3000, 3020)
    prefill_all(e, r1, r2)
    decode_once(e)
    prefill_all(e, req(2, 0, 20, 1, symbols=n1))
    prefill_all(e, req(3, 0, 40, 1, symbols=(*n1, *n2)))
    v = req(4, 0, 60, 20, symbols=(*n1, *n2, *n3))
    assert admit(e, v) == [(v, 20, 40)]
    run_batch(e, [(v, 20, 40)])
    assert e.device.available_size() == 78 and e.cache.evictable_size() == 0
    ballast(e, 78)
    decode_once(e)
    assert e.sched.running == [r1, r2] and list(e.sched.waiting) == [v]
    assert e.cache.match_prefix(v.prompt).device_hit_length == 20  # N1 only
    assert e.device.available_size() == 40 - 2


def test_a_request_can_be_retracted_twice() -> None:
    # P (4 tokens) and Q (8 tokens), 1 token decoded each: Q (longer prompt) is retracted;
    # P decodes a step alone (decoded 2); Q re-prefills its 1 decoded token (decoded 2); the
    # tie (2, 2) goes to the longer prompt again: Q, now retracted twice.
    e = eng(1000)
    p, q = req(0, 0, 4, 50), req(1, 0, 8, 50)
    prefill_all(e, p, q)
    e.sched._retract_one()
    assert list(e.sched.waiting) == [q]
    decode_once(e)
    batch = e.sched._get_new_batch_prefill()
    assert batch == [(q, 1, 8)]
    run_batch(e, batch)
    assert (p.decoded, q.decoded) == (2, 2)
    e.sched._retract_one()
    assert list(e.sched.waiting) == [q] and (p.retractions, q.retractions) == (0, 2)


def test_spans_are_kept_only_when_asked_for() -> None:
    """A run that keeps no compute spans (no Chrome trace) appends none: the scheduler checks
    its flag, since the compiled scheduler would not see an ``append`` overridden in a list
    subclass. Same requests, same decisions either way."""

    def run(record: bool) -> tuple[Engine, list[float]]:
        reqs = [req(0, 0.0, 16, 10), req(1, 0.030, 16, 3)]
        e = engine(reqs, record_spans=record,
                   costs=costs(decode_step=0.01, decode_per_kv_token=1e-4))  # fmt: skip
        e.run()
        return e, [r.finish for r in reqs]

    (kept, kept_ends), (dropped, dropped_ends) = run(True), run(False)
    assert len(kept.sched.spans) >= 3 and dropped.sched.spans == []
    assert dropped_ends == kept_ends and min(kept_ends) > 0


def test_decode_step_cost_depends_on_batch_size_and_kv() -> None:
    # page 16; a step costs 10 ms + 1 ms per request + 0.1 ms per KV token. A and B (16
    # tokens, 3 outputs) prefill together (3.2 ms), then one segment of 2 steps (to the finish):
    # KV 32, then 34: (10 + 2 + 3.2) + (10 + 2 + 3.4) = 30.6 ms.
    a, b = req(0, 0.0, 16, 3), req(1, 0.0, 16, 3)
    c = costs(decode_step=0.01, decode_per_request=1e-3, decode_per_kv_token=1e-4)
    e = engine([a, b], sched=SchedulerParams(page_size=16), costs=c)
    e.run()
    spans = [(k, s, t, bs) for k, s, t, bs in e.sched.spans]
    assert [(k, bs) for k, _, _, bs in spans] == [("prefill", 2), ("decode", 2)]
    assert spans[1][2] - spans[1][1] == pytest.approx(0.0306)
    assert a.finish == pytest.approx(0.0032 + 0.0306)


def test_decode_segment_budget_counts_each_steps_growing_kv() -> None:
    # page 16; a step costs 10 ms + 1 ms per KV token. A (16 tokens, 10 outputs) prefills in
    # 1.6 ms; B arrives 79 ms later. Steps from KV 16: 26, 27, 28 ms: two steps (53 ms) fit
    # the 79 ms budget, three (81 ms) do not -> the segment ends at 54.6 ms. The next one: 26
    # ms to B's arrival, less than a step (28 ms) -> 1 step, to 82.6 ms; B prefills next.
    a, b = req(0, 0.0, 16, 10), req(1, 0.0806, 16, 1)
    c = costs(decode_step=0.01, decode_per_kv_token=1e-3)
    e = engine([a, b], sched=SchedulerParams(page_size=16), costs=c)
    e.run()
    spans = e.sched.spans[:4]
    assert [k for k, *_ in spans] == ["prefill", "decode", "decode", "prefill"]
    assert [(s, t) for _, s, t, _ in spans] == [
        pytest.approx((0.0, 0.0016)),
        pytest.approx((0.0016, 0.0546)),
        pytest.approx((0.0546, 0.0826)),
        pytest.approx((0.0826, 0.0842)),
    ]


def test_outputs_skip_caches_only_the_prompt() -> None:
    # page 4: A (8 tokens, 9 outputs) finishes with 8 + 8 = 16 KV tokens. outputs="cache"
    # inserts all 4 full pages, "skip" only the prompt's 2.
    cached = {}
    for outputs in ("cache", "skip"):
        e = eng(64, ps=4, outputs=outputs)
        e.sched.arrive(req(0, 0, 8, 9))
        e.env.process(e.sched.run())
        e.env.run(until=10.0)
        cached[outputs] = e.cache.evictable_size()
    assert cached == {"cache": 16, "skip": 8}


def test_a_full_batch_does_not_even_sort_the_queue() -> None:
    # LPM, max_running_requests 1, one request running: no prefill batch, and the waiting
    # queue is left in arrival order (no matching: SGLang returns before calc_priority)
    sched = SchedulerParams(page_size=1, policy="lpm", max_running_requests=1)
    e = engine([], page_size=1, device_tokens=1000, host_tokens=1000, sched=sched)
    prefill_all(e, req(1, 0, 40, 1, symbols=range(1000, 1040)))  # S1 cached
    prefill_all(e, req(0, 0, 10, 50))  # running
    x, z = req(10, 0, 30, 1), req(13, 0, 50, 1, symbols=(*range(1000, 1040), *range(9000, 9010)))
    assert admit(e, x, z) is None
    assert list(e.sched.waiting) == [x, z]


def touched_first(e: Engine, h: SimReq, o: SimReq) -> bool:
    """After a batch attempt: does H (finished before O) survive a 10-token eviction, i.e. was
    H's path touched (matched) after O's?"""
    e.cache.evict(10)
    return e.cache.match_prefix(h.prompt).device_hit_length > 0


@pytest.mark.parametrize(("outputs", "ballast_pages"), [(61, 60), (62, 59)])
def test_an_exhausted_total_budget_still_matches_the_head(outputs: int, ballast_pages: int) -> None:
    # page 1, 100 tokens, ratio 0.5. H (10 tokens) then O (10 tokens) finished: evictable 20,
    # H the least recently used. R (10 tokens, n outputs) runs: it reserves (n - 1) * 0.5.
    # n = 61: 30 reserved, ballast 60: rem_total = 10 + 20 - 30 = 0; n = 62: 30.5 reserved,
    # ballast 59: rem_total = 0.5. Either way SGLang's loop has no room check before the head
    # (0.5.14 none at all; 0.5.23 stops only on a spent prefill or chunk budget): the queued
    # request (H + 5 tokens) is matched (touching H), then refused (NO_TOKEN, and the batch
    # is full); a 10-token eviction takes O, not H.
    e = eng(100, init_new_token_ratio=0.5)
    h, o = req(0, 0, 10, 1), req(1, 0, 10, 1)
    prefill_all(e, h)
    prefill_all(e, o)
    prefill_all(e, req(2, 0, 10, outputs))
    ballast(e, ballast_pages)
    assert admit(e, req(3, 0, 15, 1, symbols=(*range(10), *range(500, 505)))) is None
    assert e.sched.batch_is_full
    assert touched_first(e, h, o)


@pytest.mark.parametrize(("first", "matched"), [(20, False), (19, True)])
def test_an_exhausted_prefill_budget_stops_before_matching_the_next_request(
    first: int, matched: bool
) -> None:
    # chunking off, max_prefill_tokens 20. H then O cached (10 tokens each). A request of 20
    # tokens leaves rem_input 0: the loop stops, the next request (H + 5) is not matched.
    # With 19 tokens, rem_input 1: the next one is matched (touching H), then refused (OTHER).
    e = eng(100, chunked_prefill_size=-1, max_prefill_tokens=20)
    h, o = req(0, 0, 10, 1), req(1, 0, 10, 1)
    prefill_all(e, h)
    prefill_all(e, o)
    a = req(2, 0, first, 1)
    batch = admit(e, a, req(3, 0, 15, 1, symbols=(*range(10), *range(500, 505))))
    assert rids(batch) == [2]
    assert touched_first(e, h, o) is matched


def test_a_request_that_exactly_fills_the_chunk_budget_ends_the_batch() -> None:
    # page 1, chunk 100: A (100 tokens) fills it exactly (admitted whole); the batch is A
    # alone and the next request (H + 5) is not even matched
    e = eng(1000, chunked_prefill_size=100)
    h, o = req(0, 0, 10, 1), req(1, 0, 10, 1)
    prefill_all(e, h)
    prefill_all(e, o)
    a = req(2, 0, 100, 1)
    assert admit(e, a, req(3, 0, 15, 1, symbols=(*range(10), *range(500, 505)))) == [(a, 100, 0)]
    assert e.sched.chunked is None
    assert touched_first(e, h, o) is False


def test_one_token_left_in_the_chunk_budget_admits_a_one_token_chunk() -> None:
    # page 1, chunk 100: A (99 tokens) leaves 1; B (20 tokens) gets a 1-token chunk
    e = eng(1000, chunked_prefill_size=100)
    a, b = req(0, 0, 99, 1), req(1, 0, 20, 1)
    assert admit(e, a, b) == [(a, 99, 0), (b, 1, 0)] and e.sched.chunked is b


def test_a_chunk_budget_of_one_token() -> None:
    # chunked_prefill_size 1 is chunking (1 token per batch), not "off"
    e = eng(1000, chunked_prefill_size=1)
    a = req(0, 0, 3, 1)
    assert prefill_all(e, a) == 3 and a.computed == 3


def test_a_request_fits_the_chunk_only_in_whole_pages() -> None:
    # page 16, chunk 100: a 100-token request is 112 tokens in pages (ceil_paged_tokens) >
    # 100, so add_one_req truncates it to 96; a 96-token one fits whole
    e = eng(1000, ps=16, chunked_prefill_size=100)
    a = req(0, 0, 100, 1)
    assert admit(e, a) == [(a, 96, 0)] and e.sched.chunked is a
    e = eng(1000, ps=16, chunked_prefill_size=100)
    b = req(1, 0, 96, 1)
    assert admit(e, b) == [(b, 96, 0)] and e.sched.chunked is None


def test_a_one_token_extend_is_admitted() -> None:
    # S (10 tokens) cached; X = S + 1 token: match on 10 tokens hits all of S; extend 1
    e = eng(1000)
    prefill_all(e, req(0, 0, 10, 1))
    x = req(1, 0, 11, 1, symbols=(*range(10), 99))
    assert admit(e, x) == [(x, 1, 10)]


def test_a_truncated_request_ends_the_batch() -> None:
    # page 16, chunk 100. S (96 tokens) cached. A (250 tokens) is truncated to 96, leaving 4
    # tokens of chunk budget; B = S + 3 tokens would need only 3, but a truncation ends the
    # batch (the batch SGLang forms too: it rounds B's extend up to a page, 16 > 4, and
    # cannot truncate it to 4 // 16 * 16 = 0 tokens)
    e = eng(10_000, ps=16, chunked_prefill_size=100)
    prefill_all(e, req(9, 0, 96, 1))
    a = req(0, 0, 250, 1)
    b = req(1, 0, 99, 1, symbols=range(900_000, 900_006))
    assert admit(e, a, b) == [(a, 96, 0)]
    assert list(e.sched.waiting) == [b]


def test_non_chunked_prefill_budget_excludes_the_host_hit() -> None:
    # chunking off, max_prefill_tokens 100. W = S3 (30 tokens on host) + 10 new: its extend
    # before the load is 40, of which 30 come from host: it counts 10 against the budget.
    # After X (50 tokens), 50 remain: 10 < 50, W is admitted, loading its 30 host tokens.
    sched = SchedulerParams(page_size=1, chunked_prefill_size=-1, max_prefill_tokens=100)
    e = engine([], page_size=1, device_tokens=1000, host_tokens=1000, sched=sched)
    s3 = req(3, 0, 30, 1, symbols=range(3000, 3030))
    prefill_all(e, s3)
    e.cache.writing_check()
    assert e.cache.evict(30) == 30
    x = req(10, 0, 50, 1)
    w = req(12, 0, 40, 1, symbols=(*range(3000, 3030), *range(8000, 8010)))
    assert admit(e, x, w) == [(x, 50, 0), (w, 10, 30)]
    assert (w.device_hit, w.host_hit, w.host_hit_recomputed) == (0, 30, 0)


def test_a_host_hit_under_the_threshold_is_recomputed() -> None:
    # the same, with a 9-token host hit: under the load-back threshold (10), recomputed
    e = engine([], page_size=1, device_tokens=1000, host_tokens=1000)
    s = req(3, 0, 9, 1, symbols=range(3000, 3009))
    prefill_all(e, s)
    e.cache.writing_check()
    assert e.cache.evict(9) == 9
    w = req(12, 0, 19, 1, symbols=(*range(3000, 3009), *range(8000, 8010)))
    assert admit(e, w) == [(w, 19, 0)]
    assert (w.device_hit, w.host_hit, w.host_hit_recomputed) == (0, 0, 9)
    # admitted at the current time: S's prefill (0.9 ms) and its write (9 pages, 9 ms) ran
    assert w.admitted == pytest.approx(0.0099)


def test_the_prefill_allocation_guard() -> None:
    # the admission budget is bypassed by taking every page after the batch was formed: the
    # allocation fails with a message saying it is a bug
    e = eng(100)
    batch = admit(e, req(0, 0, 10, 1))
    assert batch is not None
    ballast(e, 100)
    msg = (
        r"^device pool exhausted during prefill allocation: the admission budget should have "
        r"prevented this \(please report with the config\)$"
    )
    with pytest.raises(RuntimeError, match=msg):
        run_batch(e, batch)


@pytest.mark.parametrize("ps", [2, 4])
def test_prefill_allocation_over_estimate_counts_every_request_of_the_batch(ps: int) -> None:
    # 16 pages; N1..N8 (1 page each) finished, oldest first; ballast 7: 1 page free. X and Y
    # (1 page each) in one batch need 2 pages + 2 requests * 1 page of over-estimate = 4 pages:
    # evict(4 pages of tokens) takes N1..N4; N5..N8 stay.
    e = eng(16 * ps, ps=ps)
    nodes = [req(i, 0, ps, 1) for i in range(8)]
    for n in nodes:
        prefill_all(e, n)
    ballast(e, 7)
    x, y = req(10, 0, ps, 1), req(11, 0, ps, 1)
    assert prefill_all(e, x, y) == 1
    hits = [e.cache.match_prefix(n.prompt).device_hit_length for n in nodes]
    assert hits == [0] * 4 + [ps] * 4


def test_prefill_time_and_load_stall_accumulate_over_chunks() -> None:
    """test_engine's layer-pipeline scenario with chunks of 64 tokens (page 1, 200 device
    tokens, write_through, loads 2 ms per page, 4 layers). A (64) is cached, written and pushed
    to host by B (150, prefilled as 64 + 64 + 22). C at 1.0 = A's 64 tokens + 100 new: the
    host hit is loaded (64 pages: 1.0-1.128) and the 100 new tokens come in chunks of 64 and
    36. Chunk 1: 6.4 ms of compute, 1.6 ms per layer: the pipeline ends at 1.128 + 0.0016 =
    1.1296 (stall 1.1296 - 1.0064 = 0.1232). Chunk 2: 3.6 ms, no load: first token at 1.1332.
    C's prefill time is 6.4 + 3.6 = 10 ms and its load stall 0.1232 s, summed over chunks."""
    a = list(range(64))
    reqs = [
        req(0, 0.0, 64, 1, symbols=a),
        req(1, 0.5, 150, 1),
        req(2, 1.0, 164, 1, symbols=(*a, *range(2000, 2100))),
    ]
    e = engine(reqs, page_size=1, device_tokens=200, host_tokens=800,
               costs=costs(load_s_per_page=2e-3),
               sched=SchedulerParams(page_size=1, chunked_prefill_size=64))  # fmt: skip
    e.run()
    c = reqs[2]
    assert (c.device_hit, c.host_hit) == (0, 64)
    assert c.first_token == pytest.approx(1.1332)
    assert c.prefill_s == pytest.approx(0.010)
    assert c.load_stall_s == pytest.approx(0.1232)


def test_an_intermediate_chunk_counts_no_hit_and_writes_nothing() -> None:
    # write_through with a host tier: after A's first chunk (96 of 250 tokens) its 96 tokens
    # are in the tree (locked by A) with no hit: nothing is written until the last chunk
    e = eng(10_000, ps=16, host=20_000, chunked_prefill_size=100)
    a = req(0, 0, 250, 1)
    batch = admit(e, a)
    assert batch == [(a, 96, 0)]
    run_batch(e, batch)
    assert e.ctrl.write_ops == 0
    assert a.kv is not None and a.kv.last_node.hit_count == 0
    assert e.cache.protected_size() == 96


def test_readmitting_a_retracted_request_reserves_its_remaining_outputs() -> None:
    # page 1, 200 tokens, ratio 0.5. P (4 tokens) and Q (8 tokens), 50 outputs each, prefill
    # in one batch; Q is retracted (1 decoded; its 8 prompt tokens stay cached, unlocked).
    # Re-admitting Q (9 tokens: 8 cached + 1 decoded) needs 1 + min(50 - 1, clip) + 1 = 51.
    # After locking Q's prefix: rem_total = 188 free - 111 ballast - P's 49 * 0.5 = 52.5 > 51:
    # admitted (the retraction cleared the full batch).
    e = eng(200, init_new_token_ratio=0.5)
    p, q = req(0, 0, 4, 50), req(1, 0, 8, 50)
    assert prefill_all(e, p, q) == 1
    e.sched._retract_one()
    ballast(e, 111)
    assert e.device.available_size() == 77 and e.sched._reserved() == pytest.approx(24.5)
    assert e.sched._get_new_batch_prefill() == [(q, 1, 8)]


@pytest.mark.parametrize(("budget_u", "k"), [(49, 2), (74, 2), (101, 3)])
def test_decode_segment_budget_with_two_requests(budget_u: int, k: int) -> None:
    # times in u = 1/512 s (exact binary fractions: the boundary cases compare exactly).
    # page 16; prefill 1/1024 s per token; a decode step 1/64 s + 1/1024 s per KV token.
    # A and B (16 tokens, 10 outputs) prefill together: 32 tokens = 16u. Decode from KV 32:
    # steps of 8 + 16 = 24u, then 25u, 26u, 27u (2 more KV tokens, 1u, per step); cumulative
    # 24, 49, 75, 102u. C arrives budget_u after the prefill ends: the segment takes as many
    # steps as fit the budget (at least one): 49u -> 2 (exactly fits), 74u -> 2, 101u -> 3.
    u = 1 / 512
    a, b = req(0, 0.0, 16, 10), req(1, 0.0, 16, 10)
    c = req(2, (16 + budget_u) * u, 16, 1)
    cm = costs(prefill_per_token=1 / 1024, decode_step=1 / 64, decode_per_kv_token=1 / 1024)
    e = engine([a, b, c], sched=SchedulerParams(page_size=16), costs=cm)
    e.run()
    kind, start, end, bs = e.sched.spans[1]
    cumulative = {2: 49, 3: 75}[k]
    assert (kind, bs) == ("decode", 2)
    assert (start, end) == (16 * u, (16 + cumulative) * u)  # exact


def test_the_prefill_budget_check_rounds_the_extend_up_to_a_page() -> None:
    # page 16, chunking off, max_prefill_tokens 100. A (64 tokens) leaves 36; B (34 tokens)
    # rounds up to 48 tokens (3 pages) >= 36 -> OTHER: the batch is A alone
    e = eng(10_000, ps=16, chunked_prefill_size=-1, max_prefill_tokens=100)
    a, b = req(0, 0, 64, 1), req(1, 0, 34, 1)
    assert admit(e, a, b) == [(a, 64, 0)]
