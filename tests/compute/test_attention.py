"""Attention: the FA3 curve reproduces its six points, and the causal prefill cost."""

from __future__ import annotations

import pytest

from hicache.compute.attention import (
    FA3_H100_POINTS,
    AttentionModel,
    prefill_attention_flops,
    prefill_attention_time,
)
from hicache.compute.fit import causal_ratio_errors, fit_attention
from hicache.compute.profile import ComputeProfile


@pytest.mark.parametrize(("seq", "flops"), FA3_H100_POINTS)
def test_curve_reproduces_each_fa3_point_within_10pct(
    shipped: ComputeProfile, seq: int, flops: float
) -> None:
    assert shipped.attention.flops_per_s(seq) == pytest.approx(flops, rel=0.10)


def test_causal_over_noncausal_matches_the_fa3_paper_within_10pct(
    shipped: ComputeProfile,
) -> None:
    """Not fitted: the diagonal-tile and mean-key-length choices predict it."""
    assert all(abs(e) <= 10 for e in causal_ratio_errors(shipped.attention).values())


def test_fit_recovers_a_known_curve() -> None:
    truth = AttentionModel(peak_flops=1e15, max_efficiency=0.7, half_len=300.0)
    pts = [(n, truth.flops_per_s(n)) for n in (256, 1024, 4096, 16384)]
    got = fit_attention(pts, peak_flops=1e15)
    assert got.max_efficiency == pytest.approx(0.7, rel=1e-6)
    assert got.half_len == pytest.approx(300.0, rel=1e-6)


def test_prefill_flops_counts_prefix_and_causal_pairs() -> None:
    # 4 new on 10 cached: 40 + 10 pairs; 2 heads, QK 192 + V 128 (MLA-like)
    assert prefill_attention_flops(4, 10, 2, 192, 128) == 2 * 2 * 320 * 50


def test_prefill_time(shipped: ComputeProfile) -> None:
    att = shipped.attention
    assert prefill_attention_time(0, 1000, 32, 128, 128, att) == 0.0
    t = prefill_attention_time(4096, 0, 32, 128, 128, att)
    useful = prefill_attention_flops(4096, 0, 32, 128, 128)
    # mean key length 2048.5: the rate at 2048 less the masked diagonal half-tiles
    assert useful / (t - att.floor_s) == pytest.approx(att.flops_per_s(2048.5) / 1.031, rel=0.01)
    # a cached prefix makes each new token dearer and the kernel more efficient
    assert prefill_attention_time(512, 8192, 32, 128, 128, att) > 5 * prefill_attention_time(
        512, 0, 32, 128, 128, att
    )


def test_scaled_and_validation(shipped: ComputeProfile) -> None:
    att = shipped.attention
    assert att.scaled(2.0).flops_per_s(1000) == pytest.approx(2 * att.flops_per_s(1000))
    assert att.efficiency(0) == 0.0
    with pytest.raises(ValueError, match="peak_ratio must be > 0"):
        att.scaled(0)
    with pytest.raises(ValueError, match="max_efficiency in"):
        AttentionModel(peak_flops=1e15, max_efficiency=1.5, half_len=1.0)
