"""The operator models' closed forms at their edges, on round hand-made coefficients: the
boundaries of "empty" (0 vs 1 of something), argument validation and its messages, and every
field of the ops a layer is decomposed into."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.compute.allreduce import (
    CUSTOM_AR_MAX_BYTES,
    SGLANG_CUSTOM_AR_H100,
    AllReduceFit,
    CustomAllReduce,
)
from hicache.compute.attention import AttentionModel, prefill_attention_time
from hicache.compute.gemm import GemmModel
from hicache.compute.layer import DenseLayer, LayerOp, dense_layer_ops, mlp_ops

#: t_flop = 2k(mn + 2) / 2e6, t_mem = 2(kn + mk + mn) / 1.5e6; memory-bound: 1 us + 1 us/byte
GEMM: dict[str, float] = dict(launch_s=1e-6, peak_flops=2e6, tile_overhead=2.0, hbm_Bps=1.5e6,
                              elem_launch_s=1e-6, elem_Bps=1e6)  # fmt: skip


def test_gemm_of_one_row_column_and_depth() -> None:
    g = GemmModel(**GEMM)
    # 1 x 1 x 1: t_flop = 2 * 1 * (1 + 2) / 2e6 = 3 us, t_mem = 2 * 3 / 1.5e6 = 4 us,
    # hypot 5 us, plus the 1 us launch
    assert g.time(1, 1, 1) == pytest.approx(6e-6, rel=1e-12)
    # any empty dimension: nothing to do
    assert g.time(0, 1, 1) == g.time(1, 0, 1) == g.time(1, 1, 0) == g.time(5, 0, 7) == 0.0
    assert g.time(1, 1, -1) == 0.0
    # one byte: 1 us + 1 byte / 1e6 B/s
    assert g.elementwise_time(1) == pytest.approx(2e-6, rel=1e-12)
    assert g.elementwise_time(0) == 0.0


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("launch_s", -1.0, r"^launch_s must be finite and >= 0, got -1.0$"),
        ("tile_overhead", float("inf"), r"^tile_overhead must be finite and >= 0, got inf$"),
        ("hbm_Bps", 0.0, r"^hbm_Bps must be > 0$"),
    ],
)
def test_gemm_coefficients_are_checked(field: str, value: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GemmModel(**(GEMM | {field: value}))


def test_gemm_scaling_ratios_must_be_positive() -> None:
    g = GemmModel(**GEMM)
    with pytest.raises(ValueError, match=r"^ratios must be > 0, got 1 and 0$"):
        g.scaled(1, 0)
    assert g.scaled(1, 2).hbm_Bps == 3e6


ATT: dict[str, Any] = dict(peak_flops=1e12, max_efficiency=0.5, half_len=3.0, causal_tile=4,
                           floor_s=1e-6)  # fmt: skip


def test_attention_of_one_key_and_one_token() -> None:
    a = AttentionModel(**ATT)
    assert a.efficiency(1) == 0.5 * 1 / (1 + 3)  # 0.125
    assert a.efficiency(0) == 0.0
    # half_len 0: full efficiency from the first key, still 0 for no keys (not 0 / 0)
    flat = AttentionModel(**(ATT | {"half_len": 0.0}))
    assert flat.efficiency(0) == 0.0 and flat.efficiency(1) == 0.5
    # 1 new token, no cache: mean keys 1, masked min(1, 4) / 2 = 0.5, 1.5 pairs;
    # 2 heads x 2 x (3 + 1) FLOPs per pair = 24 FLOPs at 1e12 x 0.125 = 0.192 ns, + 1 us
    assert prefill_attention_time(1, 0, 2, 3, 1, a) == pytest.approx(1e-6 + 1.92e-10, rel=1e-12)
    assert prefill_attention_time(0, 9, 2, 3, 1, a) == 0.0


def test_attention_model_bounds() -> None:
    # zero floor and half_len, peak under 1 FLOP/s and max_efficiency 1 are all allowed
    AttentionModel(peak_flops=0.5, max_efficiency=1.0, half_len=0.0, floor_s=0.0)
    with pytest.raises(ValueError, match=r"^half_len must be finite and >= 0, got -1.0$"):
        AttentionModel(**(ATT | {"half_len": -1.0}))
    for bad in ({"peak_flops": 0.0}, {"max_efficiency": 0.0}):
        with pytest.raises(
            ValueError, match=r"^need peak_flops > 0 and max_efficiency in \(0, 1\]$"
        ):
            AttentionModel(**(ATT | bad))


def test_all_reduce_fit_bounds() -> None:
    with pytest.raises(ValueError, match=r"^floor_s must be finite and >= 0, got -1.0$"):
        AllReduceFit(floor_s=-1.0, latency_s=0.0, bandwidth_Bps=1.0)
    with pytest.raises(ValueError, match=r"^bandwidth_Bps must be > 0$"):
        AllReduceFit(floor_s=0.0, latency_s=0.0, bandwidth_Bps=0.0)


def test_custom_all_reduce_interpolates_the_measured_points() -> None:
    car = CustomAllReduce({2: ((10, 1e-6), (110, 2e-6), (210, 4e-6))})
    assert car.time(5, 2) == car.time(10, 2) == 1e-6  # flat below the first point
    assert car.time(60, 2) == pytest.approx(1.5e-6, rel=1e-12)  # 1 us + 50 x 10 ns
    assert car.time(110, 2) == pytest.approx(2e-6, rel=1e-12)
    assert car.time(160, 2) == pytest.approx(3e-6, rel=1e-12)  # 2 us + 50 x 20 ns
    assert car.time(310, 2) == pytest.approx(6e-6, rel=1e-12)  # last segment: 4 us + 100 x 20
    assert car.time(0, 2) == 0.0 == car.time(100, 1)
    with pytest.raises(
        ValueError, match=r"^no custom all-reduce figures for 4 workers \(have 2\)$"
    ):
        car.time(1, 4)
    with pytest.raises(ValueError, match=r"\(have 2, 8\)$"):
        CustomAllReduce({8: ((1, 1.0), (2, 2.0)), 2: ((1, 1.0), (2, 2.0))}).time(1, 4)
    # SGLang PR #2904's H100 figures, up to its 8 MiB buffer
    assert CUSTOM_AR_MAX_BYTES == 8 << 20
    shipped = CustomAllReduce(SGLANG_CUSTOM_AR_H100)
    assert shipped.time(2048, 8) == 5.9e-6 and shipped.time(1 << 20, 2) == 7.9e-6


def test_dense_layer_ops_every_field() -> None:
    # hidden 8, 4 heads of dim 8 // 4 = 2, 2 KV heads, MLP 12 gated, tp 2, 8-bit, 3 tokens
    layer = DenseLayer(hidden=8, heads=4, kv_heads=2, mlp_width=12, tp=2, dtype_bytes=1)
    ops = dense_layer_ops(layer, 3)
    assert ops == [
        LayerOp("input_layernorm", 0, 0, 0, 2 * 3 * 8 * 1),  # 48
        LayerOp("attn_pre_proj", 3, (4 + 2 * 2) * 2 // 2, 8, 0),  # n = 8
        LayerOp("attn_rope", 0, 0, 0, 2 * 3 * (4 + 2) * 2 // 2 * 1),  # 36
        LayerOp("attn_post_proj", 3, 8, 4 * 2 // 2, 0),  # k = 4
        LayerOp("post_attention_layernorm", 0, 0, 0, 48),
        LayerOp("mlp_up_proj", 3, 2 * 6, 8, 0),  # gate + up of 12 / 2
        LayerOp("mlp_act", 0, 0, 0, 3 * (12 + 6) * 1),  # 54
        LayerOp("mlp_down_proj", 3, 8, 6, 0),
        LayerOp("add", 0, 0, 0, 3 * 3 * 8 * 1),  # 72
    ]
    for op in ops:  # exact zeros (not None) and whole-number shapes
        assert all(type(v) is int for v in op[1:]), op
    # MLP ops default to 16-bit: un-gated width 3, 2 tokens: act reads + writes 2 x 3 each
    assert mlp_ops(4, 3, False, 2) == [
        LayerOp("mlp_up_proj", 2, 3, 4, 0),
        LayerOp("mlp_act", 0, 0, 0, 2 * (3 + 3) * 2),
        LayerOp("mlp_down_proj", 2, 4, 3, 0),
    ]


def test_dense_layer_head_dim() -> None:
    assert DenseLayer(hidden=10, heads=4, kv_heads=4, mlp_width=8).head_dim == 2  # 10 // 4
    with pytest.raises(ValueError, match=r"^head_dim must be >= 0, got -1$"):
        DenseLayer(hidden=8, heads=4, kv_heads=4, mlp_width=8, head_dim=-1)
