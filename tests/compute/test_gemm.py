"""GemmModel: the shape of the fitted curve, the other-GPU scaling, and argument checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hicache.compute.fit import _gemm_predict
from hicache.compute.gemm import GemmModel
from hicache.compute.profile import ComputeProfile

# Llama-2-7B MLP up projection (gate + up) on one GPU
N, K = 2 * 11008, 4096


def test_time_grows_with_m_at_large_m(shipped: ComputeProfile) -> None:
    g = shipped.gemm
    times = [g.time(m, N, K) for m in (256, 512, 1024, 2048, 4096, 8192)]
    assert all(a < b for a, b in itertools.pairwise(times))
    # compute-bound: doubling the tokens nearly doubles the time
    assert 1.8 < times[-1] / times[-2] <= 2.0


def test_time_is_flat_below_64_tokens(shipped: ComputeProfile) -> None:
    """Measured: 0.064 ms at 1 token and 0.066 ms at 64 (Vidur, Llama-2-7B TP1)."""
    g = shipped.gemm
    assert g.time(64, N, K) / g.time(1, N, K) < 1.15
    assert g.time(1, N, K) == pytest.approx(0.064e-3, rel=0.15)


def test_fitted_constants_are_physical(shipped: ComputeProfile) -> None:
    """Peak under H100's 989 TFLOPS dense, bandwidth under its 3.35 TB/s (HARDWARE.md C1, C6)."""
    g = shipped.gemm
    assert 500e12 < g.peak_flops < 989e12
    assert 2e12 < g.hbm_Bps < 3.35e12
    assert 0 < g.elem_Bps < 3.35e12
    assert 1e-6 < g.launch_s < 20e-6


def test_vectorised_fit_model_equals_runtime_model(shipped: ComputeProfile) -> None:
    g = shipped.gemm
    x = np.log([g.launch_s, g.peak_flops, g.tile_overhead, g.hbm_Bps])
    m, n, k = (np.array(v, dtype=float) for v in ([1, 64, 4096], [1280, 8192, 57344], [8192] * 3))
    got = _gemm_predict(x, m, n, k)
    want = [g.time(*s) for s in zip(m, n, k, strict=True)]
    assert got.tolist() == pytest.approx(want, rel=1e-12)


def test_scaled_moves_each_term_by_its_ratio(shipped: ComputeProfile) -> None:
    g = shipped.gemm
    s = g.scaled(2.0, 1.5)
    assert s.peak_flops == 2 * g.peak_flops and s.hbm_Bps == 1.5 * g.hbm_Bps
    assert s.elem_Bps == 1.5 * g.elem_Bps and s.launch_s == g.launch_s
    # a weight-read-bound GEMV speeds up by about the bandwidth ratio, a big GEMM by the peak's
    assert g.time(1, N, K) / s.time(1, N, K) == pytest.approx(1.5, rel=0.15)
    assert g.time(8192, N, K) / s.time(8192, N, K) == pytest.approx(2.0, rel=0.05)
    with pytest.raises(ValueError, match="ratios must be > 0"):
        g.scaled(0, 1)


def test_empty_ops_take_no_time(shipped: ComputeProfile) -> None:
    assert shipped.gemm.time(0, N, K) == 0.0
    assert shipped.gemm.elementwise_time(0) == 0.0
    assert shipped.gemm.elementwise_time(1e9) > 1e9 / 3.35e12


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("peak_flops", 0.0, "peak_flops must be > 0"), ("launch_s", math.nan, "launch_s must be")],
)
def test_invalid_coefficients_are_rejected(field: str, value: float, match: str) -> None:
    ok = dict(
        launch_s=5e-6,
        peak_flops=7e14,
        tile_overhead=3e5,
        hbm_Bps=3e12,
        elem_launch_s=2e-6,
        elem_Bps=2e12,
    )
    with pytest.raises(ValueError, match=match):
        GemmModel(**(ok | {field: value}))
