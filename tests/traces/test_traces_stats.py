"""Trace statistics, the infinite-capacity hit ratio and reuse distances."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.bundled import MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC
from traces.io import read_trace
from traces.keys import token_ids_of
from traces.schema import Request, Trace, TraceHeader
from traces.stats import (
    _symbol_walk,
    format_stats,
    infinite_capacity_hit_rate,
    percentile,
    reuse_distances,
    trace_stats,
)


def tiny() -> Trace:
    """block_size 4; see test_hit_rate_by_hand for the expected figures."""
    reqs = [
        Request(0, 8, 1, hash_ids=[0, 1]),
        Request(1, 10, 1, hash_ids=[0, 1, 2]),  # block 2 partial (2 tokens)
        Request(2, 8, 1, hash_ids=[0, 1]),
        Request(3, 6, 1, hash_ids=[0, 5]),
        Request(4, 12, 1, hash_ids=[0, 1, 2]),  # block 2 full now
    ]
    return Trace(reqs, TraceHeader(block_size=4))


def test_hit_rate_by_hand() -> None:
    # page 1: cached = 0, min(8, 9)=8, min(8, 7)=7, min(4, 5)=4, min(10, 11)=10 -> 29 of 44
    assert infinite_capacity_hit_rate(tiny(), 1) == pytest.approx(29 / 44)
    # page 2: 0, min(4, 4)*2=8, min(4, 3)*2=6, min(2, 2)*2=4, min(5, 5)*2=10 -> 28
    assert infinite_capacity_hit_rate(tiny(), 2) == pytest.approx(28 / 44)
    # page 4: the partial block of request 2 has no full page, so request 5 matches 2 pages:
    # 0, min(2, 2)*4=8, min(2, 1)*4=4, min(1, 1)*4=4, min(2, 2)*4=8 -> 24
    assert infinite_capacity_hit_rate(tiny(), 4) == pytest.approx(24 / 44)
    with pytest.raises(ValueError, match="does not divide"):
        infinite_capacity_hit_rate(tiny(), 3)


def test_hit_rate_same_for_token_trace() -> None:
    tokens = [Request(r.timestamp, r.input_length, 1, token_ids=token_ids_of(r, 4)) for r in tiny()]
    for page_size, cached in ((1, 29), (2, 28), (4, 24)):
        assert infinite_capacity_hit_rate(tokens, page_size) == pytest.approx(cached / 44)


def test_hit_rate_of_a_plain_list_uses_block_size_argument() -> None:
    reqs = tiny().requests
    assert infinite_capacity_hit_rate(reqs, 2, block_size=4) == pytest.approx(28 / 44)
    assert infinite_capacity_hit_rate([], 1) == 0.0


@st.composite
def hash_trace(draw: st.DrawFn) -> tuple[list[Request], int, int]:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    page_size = draw(st.sampled_from([p for p in (1, 2, 4, 8) if block_size % p == 0]))
    reqs = []
    for _ in range(draw(st.integers(1, 8))):
        ids = draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
        last = draw(st.integers(1, block_size))
        reqs.append(Request(0, (len(ids) - 1) * block_size + last, 1, hash_ids=ids))
    return reqs, page_size, block_size


@settings(max_examples=300, deadline=None)
@given(hash_trace())
def test_block_walk_equals_definition(case: tuple[list[Request], int, int]) -> None:
    reqs, page_size, block_size = case
    cached, total = _symbol_walk(reqs, page_size, block_size)
    assert infinite_capacity_hit_rate(reqs, page_size, block_size) == cached / total


def brute_reuse(a: list[int]) -> tuple[list[int], int]:
    out: list[int] = []
    cold = 0
    last: dict[int, int] = {}
    for t, x in enumerate(a):
        if x in last:
            out.append(len(set(a[last[x] + 1 : t])))
        else:
            cold += 1
        last[x] = t
    return out, cold


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=80))
def test_reuse_distances_match_brute_force(a: list[int]) -> None:
    assert reuse_distances(a) == brute_reuse(a)


def test_reuse_distance_example() -> None:
    # a b c a b b: a -> {b, c} = 2, b -> {c, a} = 2, b -> {} = 0
    assert reuse_distances([0, 1, 2, 0, 1, 1]) == ([2, 2, 0], 3)


def test_percentile_nearest_rank() -> None:
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert [percentile(values, p) for p in (0, 10, 50, 90, 99, 100)] == [1, 1, 5, 9, 10, 10]
    with pytest.raises(ValueError):
        percentile([], 50)


def test_stats_sessions_and_reuse() -> None:
    reqs = [
        Request(0, 4, 2, hash_ids=[0], session_id="a", turn=0),
        Request(1000, 8, 2, hash_ids=[0, 1], session_id="a", turn=1, think_time_ms=10),
        Request(2000, 4, 2, hash_ids=[7], session_id="b", turn=0),
    ]
    s = trace_stats(Trace(reqs, TraceHeader(block_size=4)))
    assert s["sessions"] == {
        "sessions": 2,
        "requests_in_sessions": 3,
        "turns_mean": 1.5,
        "turns_max": 2,
        "think_time_ms_mean": 10.0,
    }
    assert s["time"]["rate_per_s"] == 1.5
    assert s["blocks"] == {
        "total": 4,
        "unique": 3,
        "unique_footprint_tokens": 12,
        "block_reuse_ratio": 0.25,
    }
    assert s["reuse_distance"]["cold"] == 3
    assert s["reuse_distance"]["histogram"] == [{"lo": 0, "hi": 0, "count": 1}]
    assert "2 sessions" in format_stats(s)


MOONCAKE: dict[str, dict[str, Any]] = {
    # figures from traces/data/mooncake/README.md
    "conversation": {
        "path": MOONCAKE_CONVERSATION,
        "requests": 12_031,
        "last_ms": 3_536_999,
        "rate": "3.40",
        "distinct": 1_180,
        "input": {"mean": 12_035, "p50": 6_909, "p90": 27_367, "p99": 85_401, "max": 126_195},
        "output": {"mean": 343, "p50": 350, "p90": 597, "max": 2_000},
        "blocks": (288_500, 182_790),
        "footprint_m": "93.6",
    },
    "synthetic": {
        "path": MOONCAKE_SYNTHETIC,
        "requests": 3_993,
        "last_ms": 1_022_025,
        "rate": "3.91",
        "distinct": 3_982,
        "input": {"mean": 15_325, "p50": 11_587, "p90": 38_615, "p99": 66_458, "max": 191_378},
        "output": {"mean": 149, "p50": 69, "p90": 389, "max": 893},
        "blocks": (121_877, 43_924),
        "footprint_m": "22.5",
    },
}


@pytest.mark.parametrize("name", list(MOONCAKE))
def test_mooncake_figures(name: str) -> None:
    want = MOONCAKE[name]
    s = trace_stats(read_trace(want["path"]))
    assert s["requests"] == want["requests"]
    assert (s["time"]["first_ms"], s["time"]["last_ms"]) == (0, want["last_ms"])
    assert f"{s['time']['rate_per_s']:.2f}" == want["rate"]
    assert s["time"]["distinct_timestamps"] == want["distinct"]
    for key, section in (("input", "input_length"), ("output", "output_length")):
        for stat, value in want[key].items():
            got = s[section][stat]
            assert (round(got) if stat == "mean" else got) == value, (key, stat)
    assert (s["blocks"]["total"], s["blocks"]["unique"]) == want["blocks"]
    assert f"{s['blocks']['unique_footprint_tokens'] / 1e6:.1f}" == want["footprint_m"]

    text = format_stats(s)
    for figure in (
        f"{want['requests']:,}",
        f"{want['last_ms']:,} ms",
        f"{want['rate']} req/s",
        f"{want['blocks'][0]:,} total / {want['blocks'][1]:,} unique",
        f"{want['footprint_m']} M tokens",
        *(f"p{p} {want['input'][f'p{p}']:,}" for p in (50, 90, 99)),
        f"max {want['input']['max']:,}",
        f"mean {want['input']['mean']:,}",
    ):
        assert figure in text, figure
