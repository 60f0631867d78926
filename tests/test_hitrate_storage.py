"""The cache-only replay with an L3 tier: three hit rates, and what L3 can and cannot give."""

from __future__ import annotations

import pytest

from hicache.lifecycle import PagedRequest
from hicache.policy import PageKey
from sim.hitrate import HitRateConfig, replay, requests_for
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import read_trace


@pytest.fixture(scope="module")
def conversation() -> list[PagedRequest]:
    trace = read_trace(MOONCAKE_CONVERSATION)
    return requests_for(trace, 64)[:1200]


def _req(rid: int, tokens: list[int], page: int = 4) -> PagedRequest:
    n = len(tokens) // page
    sym = PageKey(tuple(tuple(tokens[i * page : (i + 1) * page]) for i in range(n)))
    return PagedRequest(rid=rid, arrival_s=float(rid), input_length=len(tokens), output_length=1,
                        symbols=sym)  # fmt: skip


def test_unlimited_store_reaches_the_infinite_cache(conversation: list[PagedRequest]) -> None:
    """Every request fits the device (so nothing is lost to out-of-memory), the host is small:
    with an unbounded store and wait_complete, device + host + L3 hits equal the hit rate of a
    cache that never evicts, while L3 alone supplies most of it."""
    inf = replay(conversation, HitRateConfig(device_tokens=64 * 2**22, host_tokens=64 * 2**23))
    cfg = HitRateConfig(device_tokens=64 * 2048, host_tokens=64 * 4096, storage=True,
                        prefetch_policy="wait_complete")  # fmt: skip
    r = replay(conversation, cfg)
    assert r.oom_requests == 0
    assert r.hit_rate == pytest.approx(inf.hit_rate, abs=1e-12)
    assert r.storage_hit_rate > 0.5 * r.hit_rate
    without = replay(conversation, HitRateConfig(device_tokens=64 * 2048, host_tokens=64 * 4096))
    assert without.hit_rate < 0.5 * inf.hit_rate


def test_hits_shorter_than_the_prefetch_threshold_are_lost() -> None:
    """A request whose uncached prefix part is below the threshold issues no prefetch: with
    threshold 16 a 12-token L3 hit is recomputed, with threshold 8 it is loaded. A 32-token hit
    is loaded under both."""
    page = 4
    a = list(range(1000, 1040))
    # fillers push what came before out of L1 and L2
    fill = [[5000 + 100 * i + j for j in range(40)] for i in range(8)]
    fill2 = [[9000 + 100 * i + j for j in range(40)] for i in range(8)]
    b = [*a[:12], 1, 2, 3, 4, 5, 6, 7, 8, 9]
    c = [*a[:32], 11, 12, 13, 14, 15]
    reqs = [_req(i, t, page) for i, t in enumerate([a, *fill, b, *fill2, c])]
    got = {}
    for thr in (8, 16):
        cfg = HitRateConfig(device_tokens=48, host_tokens=96, page_size=page, storage=True,
                            prefetch_policy="wait_complete", prefetch_threshold=thr)  # fmt: skip
        r = replay(reqs, cfg)
        assert r.device_hit_tokens + r.host_hit_tokens == 0
        got[thr] = r.storage_hit_tokens
    assert got == {8: 12 + 32, 16: 32}


def test_storage_share_rises_with_memory_pressure(conversation: list[PagedRequest]) -> None:
    rates = []
    for host_pages in (16384, 8192, 4096):  # less host, more L3
        cfg = HitRateConfig(device_tokens=64 * 2048, host_tokens=64 * host_pages,
                            storage=True, prefetch_policy="wait_complete")  # fmt: skip
        rates.append(replay(conversation, cfg).storage_hit_rate)
    assert rates[0] < rates[1] < rates[2]


def test_best_effort_gets_nothing_for_a_lone_request(conversation: list[PagedRequest]) -> None:
    """SGLang checks a request in the scheduler pass it arrives in: best_effort ends the
    prefetch there, before any read, so an idle server gains nothing from L3."""
    cfg = HitRateConfig(device_tokens=64 * 2048, host_tokens=64 * 4096, storage=True,
                        prefetch_policy="best_effort")  # fmt: skip
    r = replay(conversation, cfg)
    assert r.storage_hit_tokens == 0 and r.prefetches_issued > 0 and r.storage_read_tokens > 0


def test_a_small_store_gives_less_than_an_unbounded_one(
    conversation: list[PagedRequest],
) -> None:
    base = dict(device_tokens=64 * 2048, host_tokens=64 * 4096, storage=True,
                prefetch_policy="wait_complete")  # fmt: skip
    small = replay(conversation, HitRateConfig(storage_tokens=64 * 8192, **base))  # type: ignore[arg-type]
    big = replay(conversation, HitRateConfig(**base))  # type: ignore[arg-type]
    assert small.storage_hit_rate < big.storage_hit_rate


def test_storage_configuration_errors() -> None:
    with pytest.raises(ValueError, match="needs a host tier"):
        HitRateConfig(device_tokens=64, storage=True).validate()
    with pytest.raises(ValueError, match="prefetch policy"):
        HitRateConfig(device_tokens=64, host_tokens=128, storage=True,
                      prefetch_policy="eager").validate()  # fmt: skip
    with pytest.raises(ValueError, match="storage tokens"):
        HitRateConfig(device_tokens=64, host_tokens=128, storage=True, storage_tokens=10).validate()
