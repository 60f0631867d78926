"""The timed engine (SimPy): agreement with the cache-only replay, conservation, determinism,
the layer pipeline, write_back stalls and retraction — with a hand-made cost model whose
numbers are easy to compute by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hicache.lifecycle import PagedRequest
from hicache.policy import PageKey
from sim.costs import count_runs
from sim.engine import Engine
from sim.hitrate import HitRateConfig, replay
from sim.metrics import RequestRow
from sim.scheduler import SchedulerParams, SimReq
from tests.sim.harness import costs, engine
from traces.io import read_trace
from traces.keys import page_symbols

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def SR(rid: int, arrival: float, prompt: int, outputs: int, symbols: PageKey) -> SimReq:
    """The scheduler state of a hand-made request."""
    return SimReq(PagedRequest(symbols, prompt, outputs, rid=rid, arrival_s=arrival))


def sim_reqs(trace: Any, page_size: int, spacing_s: float | None = None) -> list[SimReq]:
    out = []
    for i, r in enumerate(trace):
        arrival = i * spacing_s if spacing_s is not None else r.timestamp / 1000
        out.append(
            SR(i, arrival, r.input_length, max(1, r.output_length),
               PageKey(page_symbols(r, page_size, trace.block_size)))
        )  # fmt: skip
    return out


def by_rid(e: Engine) -> dict[int, RequestRow]:
    return {r.rid: r for r in e.recorder.requests}


def ttft(row: RequestRow) -> float:
    return row.first_token_s - row.arrival_s


def hit_rates(e: Engine) -> tuple[int, int, int]:
    rows = e.recorder.requests
    return (
        sum(r.prompt_tokens for r in rows),
        sum(r.device_hit_tokens for r in rows),
        sum(r.host_hit_tokens for r in rows),
    )


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_hit_rates_equal_cache_only_replay_when_requests_never_overlap(write_policy: str) -> None:
    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    ps, dev, host = 16, 4096, 16384
    e = engine(sim_reqs(trace, ps, spacing_s=100.0), page_size=ps, device_tokens=dev,
               host_tokens=host, write_policy=write_policy)  # fmt: skip
    e.run()
    prompt, dev_hit, host_hit = hit_rates(e)
    reqs = [
        PagedRequest(PageKey(page_symbols(r, ps, 512)), r.input_length, r.output_length)
        for r in trace
    ]
    ref = replay(reqs, HitRateConfig(dev, host, ps, "lru", write_policy))
    assert prompt == ref.prompt_tokens
    assert (dev_hit, host_hit) == (ref.device_hit_tokens, ref.host_hit_tokens)
    assert host_hit > 0  # the comparison exercises load-back


def test_no_host_tier_means_no_host_hits_and_no_copies() -> None:
    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    e = engine(sim_reqs(trace, 16), device_tokens=4096, host_tokens=0)
    e.run()
    _, _, host_hit = hit_rates(e)
    assert host_hit == 0 and not e.recorder.transfers


def test_conservation_at_every_sample() -> None:
    """Arrived = finished + in flight, and every device page is free xor in the tree xor held
    by a request, checked at every state change of a loaded run."""
    trace = read_trace(DATA / "synthetic" / "agentic.jsonl")
    e = engine(sim_reqs(trace, 16), device_tokens=8192, host_tokens=32768)
    real_sample = e._sample
    checks = {"n": 0}

    def checked_sample() -> None:
        s = e.sched
        held: list[int] = []
        for r in [*s.running, *s.waiting, *([s.chunked] if s.chunked else [])]:
            if r.kv is not None:
                held += r.kv.kv[r.kv.protected_pages :]
        e.cache.check_invariants(device_pages_outside=held)
        in_flight = len(s.waiting) + len(s.running)
        assert e._arrived == e._finished_n + in_flight
        checks["n"] += 1
        real_sample()

    e.sched.sample = checked_sample
    e.run()
    assert checks["n"] > 100 and e._finished_n == len(trace)


def test_determinism() -> None:
    trace = read_trace(DATA / "synthetic" / "shared-prefix.jsonl")
    runs = []
    for _ in range(2):
        e = engine(sim_reqs(trace, 16), device_tokens=4096, host_tokens=16384)
        e.run()
        runs.append((e.recorder.requests, e.recorder.transfers, e.env.now))
    assert runs[0] == runs[1]


def test_single_request_timeline_closed_form() -> None:
    # 100-token prompt, 5 outputs: prefill 100 * 1e-4 = 10 ms; 4 decode steps of 10 ms
    req = SR(0, 1.0, 100, 5, PageKey(tuple(range(100))))
    e = engine([req], page_size=1)
    e.run()
    (row,) = e.recorder.requests
    assert row.first_token_s == pytest.approx(1.0 + 0.01)
    assert row.finish_s == pytest.approx(1.0 + 0.01 + 4 * 0.01)
    assert ttft(row) == pytest.approx(0.01)


def test_layer_pipeline_by_hand() -> None:
    """Request B reloads A's 64-token prompt from host: its prefill (36 new tokens) waits for
    the layer-wise load. 4 layers; load 64 pages * 2 ms = 128 ms (32 ms per layer); compute
    36 * 1e-4 = 3.6 ms (0.9 ms per layer): the last layer ends 0.9 ms after the load ends."""
    a = list(range(64))
    reqs = [
        SR(0, 0.0, 64, 1, PageKey(tuple(a))),
        SR(1, 0.5, 150, 1, PageKey(tuple(range(1000, 1150)))),  # pushes A to host
        SR(2, 1.0, 100, 1, PageKey((*a, *range(2000, 2036)))),
    ]
    e = engine(reqs, page_size=1, device_tokens=200, host_tokens=800,
               costs=costs(load_s_per_page=2e-3))  # fmt: skip
    e.run()
    b = by_rid(e)[2]
    assert b.host_hit_tokens == 64  # host hit loaded
    (load,) = [t for t in e.recorder.transfers if t.direction == "h2d"]
    assert load.end_s - load.start_s == pytest.approx(64 * 2e-3)
    # the load starts at the batch start; the pipeline ends one layer of compute after it
    assert b.first_token_s == pytest.approx(load.end_s + 36 * 1e-4 / 4)
    assert b.load_stall_s == pytest.approx(b.first_token_s - 1.0 - 36 * 1e-4)


def test_write_back_eviction_stalls_the_scheduler() -> None:
    # device 128: A (100 tokens) then B (100 tokens) forces a write_back eviction of A, whose
    # D->H copy (100 pages * 5 ms = 0.5 s) blocks B's prefill
    stalls = {}
    for wp in ("write_back", "write_through"):
        reqs = [
            SR(0, 0.0, 100, 1, PageKey(tuple(range(100)))),
            SR(1, 1.0, 100, 1, PageKey(tuple(range(500, 600)))),
        ]
        e = engine(reqs, page_size=1, device_tokens=128, host_tokens=512, write_policy=wp,
                   costs=costs(write_s_per_page=5e-3))  # fmt: skip
        e.run()
        stalls[wp] = ttft(by_rid(e)[1])
    assert stalls["write_back"] == pytest.approx(0.5 + 100 * 1e-4)
    assert stalls["write_through"] == pytest.approx(100 * 1e-4)  # written long before


def test_retraction_when_decode_runs_out_of_memory() -> None:
    # four requests admitted together (the clip makes each reserve 40 + 1 + 1 tokens); their
    # outputs cannot all fit the device pool
    reqs = [SR(i, 0.0, 40, 60, PageKey(tuple(range(100 * i, 100 * i + 40)))) for i in range(4)]
    e = engine(reqs, page_size=1, device_tokens=260, host_tokens=1024,
               sched=SchedulerParams(page_size=1, init_new_token_ratio=0.01,
                                     clip_max_new_tokens=1))  # fmt: skip
    e.run()
    assert sum(r.retractions for r in e.recorder.requests) > 0  # someone was retracted
    assert len(e.recorder.requests) == 4  # and everyone still finished


def test_count_runs() -> None:
    assert count_runs([], []) == 0
    assert count_runs([1, 2, 3], [7, 8, 9]) == 1
    assert count_runs([1, 2, 5], [7, 8, 9]) == 2
    assert count_runs([1, 2, 3], [7, 9, 10]) == 2


def test_chunked_prefill_splits_a_long_prompt() -> None:
    req = SR(0, 0.0, 200, 2, PageKey(tuple(range(200))))
    e = engine([req], page_size=16, sched=SchedulerParams(page_size=16, chunked_prefill_size=64))
    e.run()
    prefills = [s for s in e.sched.spans if s[0] == "prefill"]
    assert len(prefills) == 4  # 64 + 64 + 64 + 8
    (row,) = e.recorder.requests
    assert row.computed_tokens == 200 and ttft(row) == pytest.approx(200 * 1e-4)
    # intermediate chunks count no hits and issue no write-through; the post-prefill insert
    # and the finish insert do
    assert e.ctrl.write_ops >= 1
    e.cache.check_invariants(device_pages_outside=[])


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    shared = tuple(range(300))
    reqs = [
        SR(0, 0.0, 300, 1, PageKey(shared)),
        SR(1, 5.0, 300, 1, PageKey(tuple(range(5000, 5300)))),  # no prefix, arrives first
        SR(2, 5.0, 316, 1, PageKey((*shared, *range(9000, 9016)))),
    ]
    order = {}
    for policy in ("fcfs", "lpm"):
        fresh = [SimReq(r.req) for r in reqs]
        e = engine(
            fresh,
            page_size=16,
            sched=SchedulerParams(
                page_size=16, policy=policy, max_prefill_tokens=320, chunked_prefill_size=-1
            ),
        )
        e.run()
        rows = by_rid(e)
        order[policy] = sorted((1, 2), key=lambda rid: rows[rid].first_token_s)
    assert order == {"fcfs": [1, 2], "lpm": [2, 1]}
