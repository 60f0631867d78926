"""Presets, KV bytes per token and device pool sizing (`hicache.hardware`) against HARDWARE.md."""

from __future__ import annotations

import math

import pytest

from hicache.hardware import (
    GPUS,
    LINKS,
    MODELS,
    device_pool_tokens,
    get_gpu,
    get_link,
    get_model,
    kv_bytes_per_token,
    weight_bytes_per_rank,
)

# HARDWARE.md C4, bf16 bytes per token (TP1, all layers)
C4_TABLE = {
    "llama-3-8b": 131_072,
    "llama-3-70b": 327_680,
    "qwen3-8b": 147_456,
    "qwen3-32b": 262_144,
    "qwen3-235b-a22b": 192_512,
    "deepseek-v3": 70_272,
}


@pytest.mark.parametrize(("name", "expected"), sorted(C4_TABLE.items()))
def test_kv_bytes_per_token_reproduces_the_c4_table(name: str, expected: int) -> None:
    assert kv_bytes_per_token(get_model(name)) == expected


def test_every_c4_model_is_a_preset() -> None:
    # more presets exist (tests/test_models.py); the C4 six keep their names and sizes
    assert set(C4_TABLE) <= set(MODELS)


def test_c4_derived_columns() -> None:
    m = get_model("llama-3-8b")
    assert kv_bytes_per_token(m) // m.num_layers == 4096  # per layer per token
    assert kv_bytes_per_token(m) * 64 == 8 * 2**20  # a 64-token page is 8 MiB
    # Mooncake Table 1: LLaMA3-70B = 320 KB/token
    assert kv_bytes_per_token(get_model("llama-3-70b")) == 320 * 1024
    ds = get_model("deepseek-v3")
    assert kv_bytes_per_token(ds) // ds.num_layers == 1152  # 576 x bf16


def test_gqa_kv_heads_split_across_tp_until_one_head_per_rank() -> None:
    m = get_model("llama-3-8b")  # 8 KV heads
    assert [kv_bytes_per_token(m, tp) for tp in (1, 2, 4, 8)] == [
        131_072,
        65_536,
        32_768,
        16_384,
    ]
    # beyond 8 ranks each holds a replica of one head: the size stops shrinking
    assert kv_bytes_per_token(m, 16) == 16_384
    # HARDWARE.md C6: Llama-3-70B at TP8 holds 40 KiB/token per GPU
    assert kv_bytes_per_token(get_model("llama-3-70b"), 8) == 40 * 1024
    q = get_model("qwen3-235b-a22b")  # 4 KV heads
    assert kv_bytes_per_token(q, 4) == kv_bytes_per_token(q, 8) == 192_512 // 4


def test_mla_is_replicated_on_every_rank() -> None:
    ds = get_model("deepseek-v3")
    assert {kv_bytes_per_token(ds, tp) for tp in (1, 2, 8, 16)} == {70_272}


@pytest.mark.parametrize("tp", [0, 3, 6, 12])
def test_tp_that_does_not_split_kv_heads_is_rejected(tp: int) -> None:
    with pytest.raises(ValueError, match=r"tp"):
        kv_bytes_per_token(get_model("llama-3-8b"), tp)


def test_moe_and_dense_parameter_counts() -> None:
    for m in MODELS.values():
        assert 0 < m.body_active_params < m.active_params <= m.params
    # computed from the shape (tests/test_models.py compares every preset to its model card)
    assert get_model("qwen3-235b-a22b").active_params == pytest.approx(22e9, rel=0.02)
    assert get_model("deepseek-v3").active_params == pytest.approx(37e9, rel=0.02)
    assert get_model("llama-3-8b").active_params == get_model("llama-3-8b").params
    # Llama-3-8B: two untied 128,256 x 4,096 matrices, ~1.05 B of the 8.03 B
    assert get_model("llama-3-8b").embedding_params == 2 * 128_256 * 4096


def test_weight_bytes() -> None:
    # Llama-3-8B: 8,030,261,248 parameters (the checkpoint's count) in bf16
    assert weight_bytes_per_rank(get_model("llama-3-8b")) == 2 * 8_030_261_248
    assert weight_bytes_per_rank(get_model("llama-3-70b"), 8) == pytest.approx(
        70.6e9 * 2 / 8, rel=0.002
    )
    # DeepSeek-V3 is served with its FP8 checkpoint, but every rank holds the replicated MLA
    # down-projections (61 x 7,168 x (1,536 + 512 + 64) = 923.5 M) and the routers (58 MoE
    # layers x 7,168 x 256 = 106.4 M) whole, and the embedding + LM head (2 x 129,280 x 7,168
    # = 1,853.4 M) in bf16, split by tp
    ds = get_model("deepseek-v3")
    rep = 61 * 7168 * (1536 + 512 + 64) + 58 * 7168 * 256
    emb = 2 * 129_280 * 7168
    want = (ds.params - rep - emb) / 8 + rep + emb * 2 / 8
    assert weight_bytes_per_rank(ds, 8) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(85.01e9, rel=1e-3)  # ~1.5 GB over params / 8


@pytest.mark.parametrize(
    ("getter", "table", "kind"),
    [(get_model, MODELS, "model"), (get_gpu, GPUS, "gpu"), (get_link, LINKS, "link")],
)
def test_unknown_preset_names_the_choices(
    getter: object, table: dict[str, object], kind: str
) -> None:
    assert callable(getter)
    with pytest.raises(ValueError, match=f"unknown {kind} 'nope'") as e:
        getter("nope")
    for name in table:
        assert name in str(e.value)


def test_gpu_figures_and_links() -> None:
    h100, h200 = get_gpu("h100-sxm"), get_gpu("h200")
    # HBM: what the cards report (nvidia-smi 81,559 and 143,771 MiB), not the datasheets' GB
    assert (h100.hbm_bytes, h100.hbm_bw, h100.peak_flops_bf16) == (81559 * 2**20, 3.35e12, 989e12)
    assert h100.hbm_bytes == 85_520_809_984  # the 85.52 GB nvidia-smi's MiB figure is
    assert (h200.hbm_bytes, h200.hbm_bw) == (143771 * 2**20, 4.8e12)
    assert get_gpu("a100-80gb").hbm_bytes == 81920 * 2**20
    assert get_gpu("a100-80gb").peak_flops_bf16 == 312e12
    assert get_gpu("gh200").default_link == "nvlink-c2c"
    for g in GPUS.values():
        assert g.default_link in LINKS
    for lk in LINKS.values():
        assert 0 < lk.h2d_Bps <= lk.spec_Bps and 0 < lk.d2h_Bps <= lk.spec_Bps
    c2c = get_link("nvlink-c2c")
    assert (c2c.h2d_Bps, c2c.d2h_Bps) == (375e9, 297e9)


def test_device_pool_for_llama_8b_on_h100() -> None:
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    tokens = device_pool_tokens(m, g, 1, 0.9, 1e9)
    hbm = 81559 * 2**20
    assert tokens == math.floor((hbm * 0.9 - 2 * 8_030_261_248 - 1e9) / 131_072) == 457_063


def test_device_pool_matches_the_c4_capacity_example() -> None:
    # HARDWARE.md C4: H200, Llama-3-8B, mem_fraction 0.9 -> ~110 GB of KV, ~0.85 M tokens,
    # from the datasheet's 141 GB; the card reports 143,771 MiB (150.76e9 B), so the same
    # arithmetic gives 119.6 GB of KV and ~0.91 M tokens
    tokens = device_pool_tokens(get_model("llama-3-8b"), get_gpu("h200"), 1, 0.9, 0)
    assert tokens == math.floor((143771 * 2**20 * 0.9 - 2 * 8_030_261_248) / 131_072)
    assert tokens == pytest.approx(0.85e6 * 143771 * 2**20 / 141e9, rel=0.02)
    assert tokens * 131_072 == pytest.approx(119.6e9, rel=0.001)


def test_device_pool_shrinks_with_reserve_and_grows_with_tp() -> None:
    m, g = get_model("llama-3-70b"), get_gpu("h100-sxm")
    assert device_pool_tokens(m, g, 8, 0.9, 0) > device_pool_tokens(m, g, 8, 0.9, 2e9)
    assert device_pool_tokens(m, g, 8, 0.9, 0) > device_pool_tokens(m, g, 4, 0.9, 0)
    # DeepSeek-V3 (FP8 weights) fits on 8 x H200
    assert device_pool_tokens(get_model("deepseek-v3"), get_gpu("h200"), 8, 0.9, 1e9) > 100_000


def test_device_pool_without_room_for_kv_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"leaves no KV cache.*weights 141.11 GB"):
        device_pool_tokens(get_model("llama-3-70b"), get_gpu("h100-sxm"), 1, 0.9, 1e9)
    with pytest.raises(ValueError, match=r"mem_fraction"):
        device_pool_tokens(get_model("llama-3-8b"), get_gpu("h100-sxm"), 1, 1.5, 0)
    with pytest.raises(ValueError, match=r"reserve"):
        device_pool_tokens(get_model("llama-3-8b"), get_gpu("h100-sxm"), 1, 0.9, -1)
