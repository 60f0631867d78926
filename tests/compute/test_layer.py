"""Layer decomposition: Vidur's ops map to the per-rank GEMMs and bytes documented."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.compute.fit import layer_of, measured_linear_s
from hicache.compute.layer import DenseLayer, dense_layer_ops, layer_op_times, linear_time
from hicache.compute.profile import ComputeProfile
from hicache.compute.tables import MLP_OPS, read_layer_rows


def test_every_measured_op_but_emb_is_modelled() -> None:
    rows = read_layer_rows()
    for row in (rows[0], next(r for r in rows if r.model == "microsoft/phi-2")):
        names = {op.name for op in dense_layer_ops(layer_of(row), row.tokens)}
        assert names == set(row.op_ms) - {"emb"}
        assert set(row.op_ms) <= set(MLP_OPS)


def test_llama70b_tp8_shapes() -> None:
    """64 query heads, 8 KV heads, head dim 128, MLP 28,672 gated, split 8 ways."""
    layer = DenseLayer(hidden=8192, heads=64, kv_heads=8, mlp_width=28672, tp=8)
    ops = {op.name: op for op in dense_layer_ops(layer, 100)}
    assert ops["attn_pre_proj"][1:4] == (100, (8 + 2) * 128, 8192)
    assert ops["attn_post_proj"][1:4] == (100, 8192, 8 * 128)
    assert ops["mlp_up_proj"][1:4] == (100, 2 * 3584, 8192)
    assert ops["mlp_down_proj"][1:4] == (100, 8192, 3584)
    assert ops["attn_rope"].nbytes == 2 * 100 * (8 + 1) * 128 * 2
    assert ops["mlp_act"].nbytes == 100 * 3 * 3584 * 2
    assert ops["input_layernorm"].nbytes == 2 * 100 * 8192 * 2  # not split by TP
    assert ops["add"].nbytes == 3 * 100 * 8192 * 2


def test_parallel_block_has_one_norm_and_a_three_way_add() -> None:
    layer = DenseLayer(hidden=2560, heads=32, kv_heads=32, mlp_width=10240, gated=False,
                       parallel_block=True)  # fmt: skip
    ops = {op.name: op for op in dense_layer_ops(layer, 10)}
    assert "post_attention_layernorm" not in ops
    assert ops["attn_pre_proj"][2] == 3 * 2560  # head dim 80, Q K V
    assert ops["mlp_up_proj"][2] == 10240 and ops["mlp_act"].nbytes == 10 * 2 * 10240 * 2
    assert ops["add"].nbytes == 4 * 10 * 2560 * 2


def test_linear_time_is_the_sum_of_the_ops(shipped: ComputeProfile) -> None:
    layer = DenseLayer(hidden=4096, heads=32, kv_heads=8, mlp_width=14336, tp=2)
    per_op = layer_op_times(shipped.gemm, layer, 777)
    assert linear_time(shipped.gemm, layer, 777) == pytest.approx(sum(per_op.values()))


def test_measured_linear_s_excludes_emb() -> None:
    row = read_layer_rows()[0]
    assert measured_linear_s(row) == pytest.approx(
        sum(v for k, v in row.op_ms.items() if k != "emb") * 1e-3
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(hidden=4096, heads=32, kv_heads=8, mlp_width=14336, tp=16), "kv_heads = 8 is not"),
        (dict(hidden=4096, heads=32, kv_heads=8, mlp_width=14336, tp=0), "tp must be >= 1"),
    ],
)
def test_bad_layer_is_rejected(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DenseLayer(**kwargs)
