"""The forward-pass model (`hicache.forward`): which ops a model runs, how they add up, and
that the dense path is exactly the decomposition the leave-one-model-out fit was checked on."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from hicache.compute import (
    AllReduceFit,
    AllReduceModel,
    AttentionModel,
    CustomAllReduce,
    DenseLayer,
    GemmModel,
    linear_time,
)
from hicache.forward import (
    MOE_FIXED_S,
    MOE_ROW_BLOCK,
    Breakdown,
    ForwardModel,
    compute_models_for,
    expected_experts_hit,
    forward_model,
    gemm_time,
    hicache_checks,
    layer_ops,
)
from hicache.hardware import GpuSpec, get_gpu, get_model
from hicache.latency import load_profile
from hicache.models import ModelSpec
from hicache.profile import Profile


@pytest.fixture(scope="module")
def prof() -> Profile:
    return load_profile(None, "h100-sxm", "pcie5-x16")


@pytest.mark.parametrize(
    ("name", "tp"), [("llama-2-7b", 1), ("llama-2-70b", 4), ("codellama-34b", 8)]
)
def test_dense_layers_are_the_fitted_decomposition(name: str, tp: int, prof: Profile) -> None:
    """A dense model's layer costs exactly `hicache.compute.linear_time` of the same shape,
    the function FIDELITY.md's leave-one-model-out errors are measured on."""
    m = get_model(name)
    fm = forward_model(m, "h100-sxm", tp, prof)
    layer = DenseLayer(
        hidden=m.hidden_size,
        heads=m.num_attention_heads,
        kv_heads=m.num_kv_heads,
        mlp_width=m.intermediate_size,
        tp=tp,
        head_dim=m.head_dim,
    )
    for t in (1, 64, 1000, 4096):
        want = m.num_layers * linear_time(fm.gemm, layer, t)
        assert fm.linear_s(t) == pytest.approx(want, rel=1e-12)


def test_llama2_7b_prefill_matches_the_measured_layer(prof: Profile) -> None:
    """HARDWARE.md C6 (Vidur, H100, measured): Llama-2-7B's linear ops take 2.59 ms per layer
    at 4,096 tokens, TP1."""
    fm = forward_model(get_model("llama-2-7b"), "h100-sxm", 1, prof)
    assert fm.linear_s(4096) / 32 == pytest.approx(2.59e-3, rel=0.10)


def test_prefill_parts_add_up(prof: Profile) -> None:
    fm = forward_model(get_model("llama-3-8b"), "h100-sxm", 1, prof)
    b = fm.prefill([(4096, 0)])
    assert b.total_s == pytest.approx(
        b.linear_s + b.attention_s + b.allreduce_s + b.lm_head_s + b.overhead_s
    )
    assert b.allreduce_s == 0.0 and b.layers == 32
    # 4,096 tokens keep the GPU busy far longer than the eager launches take: hidden
    assert b.overhead_s == pytest.approx(prof.request_s + prof.sampling_s)
    two = fm.prefill([(2048, 0), (2048, 0)])
    assert two.linear_s == pytest.approx(b.linear_s)  # one pass over all tokens
    assert two.attention_s < b.attention_s  # two short causal triangles < one long one
    assert two.overhead_s == pytest.approx(b.overhead_s + prof.request_s)
    assert fm.prefill([]).total_s == 0.0 == fm.prefill([(0, 100)]).total_s


def test_a_cached_prefix_saves_compute_but_still_costs_attention(prof: Profile) -> None:
    fm = forward_model(get_model("llama-3-8b"), "h100-sxm", 1, prof)
    cold = fm.prefill([(8192, 0)])
    warm = fm.prefill([(512, 7680)])
    assert warm.total_s < cold.total_s / 5
    assert warm.attention_s > fm.prefill([(512, 0)]).attention_s


def test_decode_is_linear_in_kv_tokens(prof: Profile) -> None:
    """The scheduler's decode segments need `a(batch) + b(batch) * kv_tokens` exactly."""
    fm = forward_model(get_model("qwen3-8b"), "h100-sxm", 2, prof)
    for batch in (1, 8, 64):
        a = fm.decode_time(batch, 0)
        b = fm.decode_time(batch, 1) - a
        assert fm.decode_time(batch, 100_000) == pytest.approx(a + b * 100_000, rel=1e-12)
        assert b > 0
    # a decode step is dominated by reading the weights at small batches: 64 costs little more
    assert fm.decode_time(64, 0) < 1.3 * fm.decode_time(1, 0)


def test_moe_decode_reads_only_the_experts_it_hits(prof: Profile) -> None:
    m = get_model("mixtral-8x7b")
    assert expected_experts_hit(8, 2, 1) == pytest.approx(2.0)
    assert expected_experts_hit(8, 2, 1000) == pytest.approx(8.0)
    assert expected_experts_hit(8, 2, 0) == 0.0
    ops = layer_ops(m, 1, 1, moe=True)
    groups = {o.op.name: o.groups for o in ops}
    assert groups["expert_mlp_up_proj"] == pytest.approx(2.0)
    fm = forward_model(m, "h100-sxm", 2, prof)
    # batch 1 reads 2 of 8 experts, batch 64 nearly all: the step costs far more
    assert fm.decode_time(64, 0) > 2 * fm.decode_time(1, 0)
    # a dense model of the same active size would not grow like that
    dense = forward_model(get_model("llama-3-8b"), "h100-sxm", 2, prof)
    assert dense.decode_time(64, 0) < 1.3 * dense.decode_time(1, 0)


def test_mla_and_moe_models_run(prof: Profile) -> None:
    ds = forward_model(get_model("deepseek-v3"), "h200", 8, prof)
    names = {o.op.name for o in layer_ops(ds.model, 8, 16, moe=True)}
    assert {"attn_a_proj", "attn_kv_b_proj", "moe_router", "shared_mlp_up_proj"} <= names
    assert ds.prefill([(1024, 0)]).allreduce_s > 0
    assert ds.decode_time(1, 1000) > 0


def test_tensor_parallelism_pays_all_reduce(prof: Profile) -> None:
    m = get_model("llama-3-70b")
    tp8 = forward_model(m, "h100-sxm", 8, prof).prefill([(4096, 0)])
    tp4 = forward_model(m, "h100-sxm", 4, prof).prefill([(4096, 0)])
    assert tp8.allreduce_s > 0 and tp8.linear_s < tp4.linear_s
    fm8 = forward_model(m, "h100-sxm", 8, prof)
    # 64 MiB of activations: NCCL, twice per layer and once for the embedding; the logits of
    # one row (128,256 x 2 B = 250 KiB) go through SGLang's custom all-reduce, as half of one
    assert tp8.allreduce_s == pytest.approx(
        (2 * 80 + 1) * fm8.all_reduce.time(4096 * 8192 * 2, 8)
        + 0.5 * fm8.custom_all_reduce.time(128_256 * 2, 8)
    )
    with pytest.raises(ValueError, match=r"no all-reduce fit for 16 workers"):
        forward_model(get_model("qwen3-235b-a22b"), "h100-sxm", 16, prof)


def test_other_gpus_and_gemm_scale(prof: Profile) -> None:
    m = get_model("llama-3-8b")
    h100 = forward_model(m, "h100-sxm", 1, prof)
    h200 = forward_model(m, "h200", 1, prof)
    a100 = forward_model(m, "a100-80gb", 1, prof)
    assert h200.decode_time(1, 0) < h100.decode_time(1, 0)  # more HBM bandwidth
    assert h200.linear_s(8192) == pytest.approx(h100.linear_s(8192), rel=0.05)  # same die
    assert a100.linear_s(8192) > 2.5 * h100.linear_s(8192)  # 312 vs 989 TFLOPS
    slow = forward_model(m, "h100-sxm", 1, dataclasses.replace(prof, gemm_scale=2.0))
    assert slow.linear_s(1024) == pytest.approx(2 * h100.linear_s(1024))


def test_model_command_prints_the_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from cli.main import main

    assert main(["model", "forward", "--model", "llama-3-70b", "--tp", "8",
                 "--tokens", "64,4096", "--prefix", "1024", "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in rows] == [64, 4096]
    for r in rows:
        parts = ("linear_s", "attention_s", "allreduce_s", "lm_head_s", "overhead_s")
        assert r["total_s"] == pytest.approx(sum(r[k] for k in parts))
        assert r["layers"] == 80 and r["allreduce_s"] > 0 and r["prefix"] == 1024
    assert main(["model", "decode", "--batch", "1,64", "--context", "1000"]) == 0
    text = capsys.readouterr().out
    assert "decode step: llama-3-8b on h100-sxm, tp=1" in text and "total_s" in text
    assert main(["model", "forward", "--model", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert main(["model", "forward", "--tokens", "a,b"]) == 2
    capsys.readouterr()
    # --ep: the EP shapes, or SGLang's rule as a one-line error
    assert main(["model", "forward", "--model", "qwen3-30b-a3b", "--tp", "4", "--ep", "4",
                 "--tokens", "4096", "--json"]) == 0  # fmt: skip
    ep = json.loads(capsys.readouterr().out)[0]["linear_s"]
    assert main(["model", "forward", "--model", "qwen3-30b-a3b", "--tp", "4",
                 "--tokens", "4096", "--json"]) == 0  # fmt: skip
    assert ep != json.loads(capsys.readouterr().out)[0]["linear_s"]
    assert main(["model", "forward", "--model", "qwen3-30b-a3b", "--tp", "4", "--ep", "2"]) == 2
    assert "SGLang needs --ep-size equal to --tp-size" in capsys.readouterr().err


def test_hicache_checks_per_version_pass_and_store(prof: Profile) -> None:
    """SGLang's HiCache completion checks, one CPU all-reduce over the TP group each: 0.5.14
    runs writing_check and loading_check every iteration, one more on a decode step
    (flush_write_through_acks) and one more with L3 (the storage queue drain): 2 / 3 per
    prefill pass / decode step, 3 / 4 with L3 (the four of sglang PR #30511); 0.5.23 merges
    them into one per iteration. None at tp 1 or without the host tier."""
    assert hicache_checks("0.5.14", 8, True, False) == (2, 3)
    assert hicache_checks("0.5.14", 2, True, True) == (3, 4)
    assert hicache_checks("0.5.23", 8, True, False) == (1, 1)
    assert hicache_checks("0.5.23", 8, True, True) == (1, 1)
    for version in ("0.5.14", "0.5.23"):
        assert hicache_checks(version, 1, True, True) == (0, 0)
        assert hicache_checks(version, 8, False, True) == (0, 0)
    with pytest.raises(ValueError, match=r"no HiCache check count for SGLang 0\.5\.99"):
        hicache_checks("0.5.99", 8, True, False)
    m = get_model("llama-3-70b")
    plain = forward_model(m, "h100-sxm", 8, prof)
    tiered = forward_model(m, "h100-sxm", 8, prof, (3, 4))
    assert prof.hicache_check_s == pytest.approx(1.5e-4)
    assert tiered.decode_time(4, 0) - plain.decode_time(4, 0) == pytest.approx(4 * 1.5e-4)
    assert tiered.prefill_time([(10, 0)]) - plain.prefill_time([(10, 0)]) == pytest.approx(
        3 * 1.5e-4
    )


@pytest.mark.parametrize(
    ("version", "store", "prefill", "decode"),
    [("0.5.14", False, 2, 3), ("0.5.14", True, 3, 4), ("0.5.23", False, 1, 1),
     ("0.5.23", True, 1, 1)],
)  # fmt: skip
def test_build_costs_charges_the_versions_checks(
    prof: Profile, version: str, store: bool, prefill: int, decode: int
) -> None:
    from hicache.config import load_config
    from sim.costs import build_costs

    base = ["model.name=llama-3-70b", "model.tp=8", f"sglang.version={version}"]
    if store:
        base.append("storage.backend=file")
    on = build_costs(load_config(None, base))
    off = build_costs(load_config(None, [*base, "cache.enable_host=false", "storage.backend=none"]))
    each = prof.hicache_check_s
    assert on.decode_fn(1, 0) - off.decode_fn(1, 0) == pytest.approx(decode * each)
    assert on.prefill_fn([(10, 0)]) - off.prefill_fn([(10, 0)]) == pytest.approx(prefill * each)


# --- hand-computed toy models ------------------------------------------------------------------
# Shapes small enough to list every op by hand, and operator models with round constants:
# a GEMM costs 1 us + k*m*n ps (peak 2e12 FLOP/s, no tile overhead, memory term ~0), a
# memory-bound op 1 us + 1 ps per byte; attention runs at 1e12 FLOP/s from the first key.
# (MoE experts pad their rows to MOE_ROW_BLOCK = 64 each.)

TOY_GEMM = GemmModel(launch_s=1e-6, peak_flops=2e12, tile_overhead=0.0, hbm_Bps=1e30,
                     elem_launch_s=1e-6, elem_Bps=1e12)  # fmt: skip
TOY_ATT = AttentionModel(peak_flops=1e12, max_efficiency=1.0, half_len=0.0, causal_tile=2,
                         floor_s=1e-6)  # fmt: skip
TOY_AR = AllReduceModel({2: AllReduceFit(floor_s=1e-6, latency_s=1e-6, bandwidth_Bps=1e9)})
#: the custom all-reduce (under 8 MiB): 1 us at 10 bytes, 2 us at 110, linear past that
TOY_CAR = CustomAllReduce({2: ((10, 1e-6), (110, 2e-6))})
PS = 1e-12


def _toy(**kw: Any) -> ModelSpec:
    base: dict[str, Any] = dict(
        name="toy", num_layers=3, num_kv_heads=2, head_dim=2, v_head_dim=2, dtype_bytes=2,
        hidden_size=8, num_attention_heads=4, vocab_size=11, tie_word_embeddings=False,
        weight_dtype_bytes=2, intermediate_size=16,
    )  # fmt: skip
    return ModelSpec(**(base | kw))


#: 3 layers, the last one MoE: 4 experts of width 8, 2 per token, a shared expert of width 4
TOY_MOE = dict(num_experts=4, experts_per_token=2, expert_intermediate_size=8,
               shared_expert_intermediate_size=4, moe_layers=1)  # fmt: skip
#: MLA: latent 4 + rope 2, nope 3, value dim 5 (head_dim = nope + rope), query rank 6
TOY_MLA = dict(mla=True, num_kv_heads=1, head_dim=5, v_head_dim=5, kv_lora_rank=4,
               qk_rope_head_dim=2, qk_nope_head_dim=3, q_lora_rank=6)  # fmt: skip


def _ops(model: ModelSpec, tp: int, t: int, moe: bool) -> list[tuple[Any, ...]]:
    ops = layer_ops(model, tp, t, moe)
    for o in ops:  # shapes are whole numbers (a `/` where `//` belongs would make them floats)
        assert type(o.op.n) is int and type(o.op.k) is int, o
    return [(o.op.name, o.op.m, o.op.n, o.op.k, o.op.nbytes, o.groups) for o in ops]


def test_dense_layer_ops_by_hand() -> None:
    # tp 2, 3 tokens, hidden 8, 16-bit: 2 query heads and 1 KV head per rank, head dim 2
    assert _ops(_toy(), 2, 3, moe=False) == [
        ("input_layernorm", 0, 0, 0, 2 * 3 * 8 * 2, 1.0),  # 96
        ("attn_pre_proj", 3, (2 + 2 * 1) * 2, 8, 0, 1.0),  # n = 8
        ("attn_rope", 0, 0, 0, 2 * 3 * (2 + 1) * 2 * 2, 1.0),  # 72
        ("attn_post_proj", 3, 8, 2 * 2, 0, 1.0),
        ("post_attention_layernorm", 0, 0, 0, 96, 1.0),
        ("mlp_up_proj", 3, 2 * 8, 8, 0, 1.0),  # gate + up of width 16 / 2
        ("mlp_act", 0, 0, 0, 3 * (16 + 8) * 2, 1.0),  # 144
        ("mlp_down_proj", 3, 8, 8, 0, 1.0),
        ("add", 0, 0, 0, 3 * 3 * 8 * 2, 1.0),  # 144
    ]
    # tp 4 > 2 KV heads: each rank keeps one (replicated) KV head, 1 query head
    ops = {o[0]: o for o in _ops(_toy(), 4, 3, moe=False)}
    assert ops["attn_pre_proj"][1:4] == (3, (1 + 2 * 1) * 2, 8)
    assert ops["attn_rope"][4] == 2 * 3 * (1 + 1) * 2 * 2
    assert ops["attn_post_proj"][1:4] == (3, 8, 1 * 2)
    assert ops["mlp_up_proj"][1:4] == (3, 2 * 4, 8) and ops["mlp_act"][4] == 3 * (8 + 4) * 2
    # tp 1: all 4 query and 2 KV heads
    assert _ops(_toy(), 1, 3, moe=False)[1] == ("attn_pre_proj", 3, (4 + 2 * 2) * 2, 8, 0, 1.0)


def test_moe_layer_ops_by_hand() -> None:
    # 3 tokens x 2 experts = 6 routed rows over E(1 - (1 - k/E)^T) = 4 * (1 - 0.5^3) = 3.5
    # experts; expert width 8 / tp 2 = 4 (gated: up 8), shared width 4 / 2 = 2 (up 4)
    assert _ops(_toy(**TOY_MOE), 2, 3, moe=True)[4:] == [
        ("post_attention_layernorm", 0, 0, 0, 96, 1.0),
        ("moe_router", 3, 4, 8, 0, 1.0),
        ("expert_mlp_up_proj", 6, 8, 8, 0, 3.5),
        ("expert_mlp_act", 0, 0, 0, 6 * (8 + 4) * 2, 1.0),  # 144, one memory-bound op
        ("expert_mlp_down_proj", 6, 8, 4, 0, 3.5),
        ("shared_mlp_up_proj", 3, 4, 8, 0, 1.0),
        ("shared_mlp_act", 0, 0, 0, 3 * (4 + 2) * 2, 1.0),  # 36
        ("shared_mlp_down_proj", 3, 8, 2, 0, 1.0),
        ("add", 0, 0, 0, 144, 1.0),
    ]
    assert expected_experts_hit(4, 2, 3) == pytest.approx(3.5)
    # no shared expert: the routed experts go straight to the residual add
    names = [o[0] for o in _ops(_toy(**(TOY_MOE | {"shared_expert_intermediate_size": 0})),
                                2, 3, moe=True)]  # fmt: skip
    assert names[-4:] == ["expert_mlp_up_proj", "expert_mlp_act", "expert_mlp_down_proj", "add"]


def test_mla_attention_ops_by_hand() -> None:
    # tp 2: 2 heads per rank; latent = kv_lora 4 + rope 2 = 6
    assert _ops(_toy(**TOY_MLA), 2, 3, moe=False)[:6] == [
        ("input_layernorm", 0, 0, 0, 96, 1.0),
        ("attn_a_proj", 3, 6 + 6, 8, 0, 1.0),  # hidden -> q_lora_rank + latent (replicated)
        ("attn_q_b_proj", 3, 2 * (3 + 2), 6, 0, 1.0),  # q_lora_rank -> heads * (nope + rope)
        ("attn_kv_b_proj", 3, 2 * (3 + 5), 4, 0, 1.0),  # kv_lora_rank -> heads * (nope + v)
        ("attn_rope", 0, 0, 0, 2 * 3 * (2 + 1) * 2 * 2, 1.0),  # 72: queries + one shared key
        ("attn_post_proj", 3, 8, 2 * 5, 0, 1.0),
    ]
    # no query compression: the latent and the queries come straight from the hidden state
    assert _ops(_toy(**(TOY_MLA | {"q_lora_rank": 0})), 2, 3, moe=False)[1:4] == [
        ("attn_kv_a_proj", 3, 6, 8, 0, 1.0),
        ("attn_q_proj", 3, 2 * (3 + 2), 8, 0, 1.0),
        ("attn_kv_b_proj", 3, 16, 4, 0, 1.0),
    ]


def test_gemm_time_by_hand() -> None:
    assert MOE_ROW_BLOCK == 64
    g = GemmModel(launch_s=1e-6, peak_flops=1e6, tile_overhead=3.0, hbm_Bps=1e6,
                  elem_launch_s=0.0, elem_Bps=1.0)  # fmt: skip
    # one group, 6 x 3 @ 3 x 2: flops 2*3*(6*2 + 3) = 90, bytes 2*3*2 + 2*(6*3 + 6*2) = 72
    assert gemm_time(g, 6, 2, 3) == pytest.approx(1e-6 + math.hypot(90e-6, 72e-6), rel=1e-12)
    assert gemm_time(g, 6, 2, 3) == pytest.approx(g.time(6, 2, 3), rel=1e-12)
    # one row: flops 2*3*(1*2 + 3) = 30, bytes 12 + 2*(3 + 2) = 22
    assert gemm_time(g, 1, 2, 3) == pytest.approx(1e-6 + math.hypot(30e-6, 22e-6), rel=1e-12)
    # 8-bit weights at twice the rate: flops 90 / 2 = 45, bytes 1*3*2 + 60 = 66
    assert gemm_time(g, 6, 2, 3, weight_bytes=1, flop_scale=2.0) == pytest.approx(
        1e-6 + math.hypot(45e-6, 66e-6), rel=1e-12
    )
    # 2 groups, 3 rows each, padded to 64: flops 2*3*(128*2 + 3) = 1554; bytes of both
    # groups' weights 2*2*3*2 = 24 plus the real activations 60
    assert gemm_time(g, 6, 2, 3, groups=2) == pytest.approx(
        1e-6 + math.hypot(1554e-6, 84e-6), rel=1e-12
    )
    # 200 rows over 2 groups: 100 each, padded to 128: flops 2*3*(256*2 + 3) = 3090, bytes
    # 24 + 2*(200*3 + 200*2) = 2024
    assert gemm_time(g, 200, 2, 3, groups=2) == pytest.approx(
        1e-6 + math.hypot(3090e-6, 2024e-6), rel=1e-12
    )
    assert gemm_time(g, 0, 2, 3, groups=2) == 0.0 == gemm_time(g, 6, 2, 3, groups=0)


def _toy_fm(model: ModelSpec, tp: int = 2, gpu: GpuSpec | None = None, **kw: Any) -> ForwardModel:
    prof = load_profile(None, "h100-sxm", "pcie5-x16")
    constants: dict[str, Any] = dict(gemm_scale=2.0, decode_hbm_efficiency=0.25,
                                     prefill_forward_s=1e-3, decode_forward_s=2e-3,
                                     request_s=1e-4, sampling_s=1e-5)  # fmt: skip
    p = dataclasses.replace(prof, **(constants | kw))
    gpu = gpu or dataclasses.replace(get_gpu("h100-sxm"), hbm_bw=1e12)
    return ForwardModel(model=model, tp=tp, gpu=gpu, gemm=TOY_GEMM, attention=TOY_ATT,
                        all_reduce=TOY_AR, profile=p, custom_all_reduce=TOY_CAR,
                        prefill_checks_s=3e-7, decode_checks_s=7e-7)  # fmt: skip


def test_toy_forward_passes_by_hand() -> None:
    fm = _toy_fm(_toy(**TOY_MOE))
    # linear, 3 tokens (ps; each GEMM and memory-bound op also 1 us): dense layer: GEMMs
    # 192 + 96 + 384 + 192, bytes 96 + 72 + 96 + 144 + 144 = 9 us + 1,416 ps; MoE layer:
    # 6 routed rows over 3.5 experts, padded to 3.5 x 64 = 224 rows: GEMMs 192 + 96 + router
    # 96 + experts 8*224*8 + 4*224*8 + shared 96 + 48 = 22,032, bytes 96 + 72 + 96 + 144 + 36
    # + 144 = 588: 13 us + 22,620 ps; 2 dense + 1 MoE = 31 us + 25,452 ps, plus the MoE
    # layer's fixed fused-MoE cost, x gemm_scale 2
    assert fm.linear_s(3) == pytest.approx(2 * (31e-6 + MOE_FIXED_S + 25452 * PS), rel=1e-12)
    # 2 tokens: dense 9 us + 576 + 368 ps; MoE: 4 rows over 3 experts, 3 x 64 = 192 rows:
    # GEMMs 128 + 64 + 64 + 12,288 + 6,144 + 64 + 32, bytes 392: 13 us + 19,176 ps
    assert fm.linear_s(2) == pytest.approx(2 * (31e-6 + MOE_FIXED_S + 21064 * PS), rel=1e-12)
    # collectives: 2 per layer + 1 after the embedding, of tokens x 8 x 2 bytes, and half of
    # one of the logits (positions x 11 x 2 bytes); custom all-reduce 1 us + (bytes - 10) x 10 ns
    assert fm.allreduce_s(3, 2) == pytest.approx(7 * 1.38e-6 + 0.5 * 1.34e-6, rel=1e-12)
    assert fm.allreduce_s(1, 1) == pytest.approx(7 * 1.06e-6 + 0.5 * 1.12e-6, rel=1e-12)
    assert fm.allreduce_s(0, 1) == 0.0
    # from 8 MiB, NCCL: 1 us + bytes / 1e9 (8 MiB = 524,288 tokens x 16 bytes); just under,
    # the custom one along its last segment
    big = 1 << 23
    assert fm.allreduce_s(big // 16, 0) == pytest.approx(7 * (1e-6 + big * 1e-9), rel=1e-12)
    assert fm.allreduce_s(big // 16 - 1, 0) == pytest.approx(
        7 * (1e-6 + (big - 16 - 10) * 1e-8), rel=1e-12
    )
    # LM head: gather 2 * 3 * 8 * 2 = 96 bytes, GEMM 2 rows x ceil(11 / 2) = 6 x 8 = 96 ps
    assert fm.lm_head_s(3, 2) == pytest.approx(2 * (2e-6 + 192 * PS), rel=1e-12)
    assert fm.lm_head_s(2, 2) == pytest.approx(2 * (2e-6 + (64 + 96) * PS), rel=1e-12)

    # prefill of 1 new token, an empty request, 2 new on 5 cached: 3 tokens, 2 requests.
    # Attention per layer, the longer of the FLOPs (16 per pair at 1e12/s) and reading the
    # request's KV (8 bytes per token at 1e12 x 0.25 B/s = 32 ps), each + 1 us: 1 new: 1.5
    # pairs = 24 ps < 32 ps read; 2 new on 5: 2 x (6.5 + 1) = 15 pairs = 240 ps > 7 x 32
    b = fm.prefill([(1, 0), (0, 9), (2, 5)])
    assert b.layers == 3
    assert (b.linear_s, b.allreduce_s, b.lm_head_s) == (
        fm.linear_s(3), fm.allreduce_s(3, 2), fm.lm_head_s(3, 2))  # fmt: skip
    assert b.attention_s == pytest.approx(3 * (2e-6 + (32 + 240) * PS), rel=1e-12)
    # the 1 ms of eager launches hides the GPU work; then 2 requests, sampling, per pass
    gpu = b.linear_s + b.attention_s + b.allreduce_s + b.lm_head_s
    assert b.overhead_s == pytest.approx(1e-3 - gpu + 2e-4 + 1e-5 + 3e-7, rel=1e-12)
    assert b.total_s == pytest.approx(1e-3 + 2e-4 + 1e-5 + 3e-7, rel=1e-12)
    assert b.as_dict() == {"layers": 3, "linear_s": b.linear_s, "attention_s": b.attention_s,
                           "allreduce_s": b.allreduce_s, "lm_head_s": b.lm_head_s,
                           "overhead_s": b.overhead_s, "total_s": b.total_s}  # fmt: skip
    assert fm.prefill([(0, 9)]) == Breakdown(3, 0.0, 0.0, 0.0, 0.0, 0.0)
    # 1 new on 5 cached: 6.5 pairs = 104 ps of FLOPs < reading 6 tokens' KV, 6 x 32 = 192 ps
    assert fm.prefill([(1, 5)]).attention_s == pytest.approx(3 * (1e-6 + 192 * PS), rel=1e-12)
    # launches shorter than the GPU work cost nothing
    short = _toy_fm(_toy(**TOY_MOE), prefill_forward_s=1e-6).prefill([(1, 0), (0, 9), (2, 5)])
    assert short.overhead_s == pytest.approx(2e-4 + 1e-5 + 3e-7, rel=1e-12)

    # decode of 2 requests holding 10 KV tokens: 8 KV bytes per token and layer on a rank
    # (2 x 1 head x dim 2 x 2 bytes), read at 2.5e11 B/s: 3 x (1 us + 320 ps)
    d = fm.decode(2, 10)
    assert d.attention_s == pytest.approx(3 * (1e-6 + 320 * PS), rel=1e-12)
    assert (d.linear_s, d.allreduce_s, d.lm_head_s) == (
        fm.linear_s(2), fm.allreduce_s(2, 2), fm.lm_head_s(2, 2))  # fmt: skip
    assert d.overhead_s == pytest.approx(2e-3 + 1e-5 + 7e-7, rel=1e-12)
    assert fm.decode(0, 100) == Breakdown(3, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_fp8_weights_run_at_the_fp8_rate_where_there_is_one() -> None:
    # dense toy, 3 tokens: GEMM FLOPs 864 ps at the 16-bit rate, 432 at twice it (FP8 peak
    # 2e15 over bf16 1e15); the memory-bound 552 ps and the 9 launches stay
    h100 = get_gpu("h100-sxm")
    fp8_gpu = dataclasses.replace(h100, peak_flops_bf16=1e15, peak_flops_fp8=2e15)
    no_fp8 = dataclasses.replace(h100, peak_flops_fp8=0.0)
    fp8 = _toy(weight_dtype_bytes=1)
    assert _toy_fm(fp8, gpu=fp8_gpu).linear_s(3) == pytest.approx(
        2 * 3 * (9e-6 + (432 + 552) * PS), rel=1e-12
    )
    for model, gpu in ((fp8, no_fp8), (_toy(), fp8_gpu), (_toy(weight_dtype_bytes=0.5), fp8_gpu)):
        assert _toy_fm(model, gpu=gpu).linear_s(3) == pytest.approx(
            2 * 3 * (9e-6 + (864 + 552) * PS), rel=1e-12
        )


def test_linear_times_are_memoized(monkeypatch: pytest.MonkeyPatch) -> None:
    fm = _toy_fm(_toy())
    first = fm.linear_s(3)

    def boom(ops: Any) -> float:
        raise AssertionError("recomputed")

    monkeypatch.setattr(fm, "_ops_time", boom)
    assert fm.linear_s(3) == first


def test_forward_model_checks_tp_and_the_all_reduce_figures_up_front() -> None:
    with pytest.raises(ValueError, match=r"^tp=3 does not split toy's 4 attention heads$"):
        _toy_fm(_toy(), tp=3)
    prof = load_profile(None, "h100-sxm", "pcie5-x16")
    only4 = AllReduceModel({4: AllReduceFit(floor_s=1e-6, latency_s=0.0, bandwidth_Bps=1.0)})
    gpu = get_gpu("h100-sxm")
    with pytest.raises(ValueError, match=r"no all-reduce fit for 2 workers \(have 4\)"):
        ForwardModel(_toy(), 2, gpu, TOY_GEMM, TOY_ATT, only4, prof)
    with pytest.raises(ValueError, match=r"no custom all-reduce figures for 2 workers \(have 4\)"):
        ForwardModel(_toy(), 2, gpu, TOY_GEMM, TOY_ATT, TOY_AR, prof,
                     custom_all_reduce=CustomAllReduce({4: ((1, 1.0), (2, 2.0))}))  # fmt: skip


def test_forward_model_takes_the_fitted_gemm_and_the_checks_at_tp2(prof: Profile) -> None:
    base, _, _ = compute_models_for(get_gpu("h100-sxm"))
    assert forward_model(_toy(weight_dtype_bytes=1), "h100-sxm", 1, prof).gemm == base
    # at tp 2: the completion checks asked for (150 us each in the shipped profile)
    fm = forward_model(_toy(), "h100-sxm", 2, prof, (2, 3))
    assert (fm.prefill_checks_s, fm.decode_checks_s) == (pytest.approx(3e-4), pytest.approx(4.5e-4))


def test_expert_parallelism_holds_whole_experts(prof: Profile) -> None:
    """``--ep-size`` = ``tp`` (SGLang's rule): each of Qwen3-235B's 8 ranks holds 16 whole
    experts (1,536 columns) instead of all 128 cut to 192 columns, and gets ``t x 8 / 8`` of
    the routed rows; the attention, the router and the all-reduce are as under TP."""
    m = get_model("qwen3-235b-a22b")
    e, k, width, h = m.num_experts, m.experts_per_token, m.expert_intermediate_size, m.hidden_size
    t = 4096
    tp_ops = {o.op.name: o for o in layer_ops(m, 8, t, moe=True)}
    ep_ops = {o.op.name: o for o in layer_ops(m, 8, t, moe=True, ep=8)}
    assert tp_ops.keys() == ep_ops.keys()
    up_tp, up_ep = tp_ops["expert_mlp_up_proj"], ep_ops["expert_mlp_up_proj"]
    assert up_tp.op.n == 2 * width // 8 and up_ep.op.n == 2 * width  # gate + up
    assert up_tp.op.m == t * k and up_ep.op.m == t * k / 8
    assert up_tp.groups == pytest.approx(expected_experts_hit(e, k, t))
    assert up_ep.groups == pytest.approx(e / 8 * (1 - (1 - k / e) ** t))
    # the same work per rank: routed rows x columns
    assert up_ep.op.m * up_ep.op.n == pytest.approx(up_tp.op.m * up_tp.op.n)
    for name in ("moe_router", "attn_pre_proj", "post_attention_layernorm"):
        assert tp_ops[name] == ep_ops[name]
    assert ep_ops["moe_router"].op.n == e and ep_ops["moe_router"].op.k == h
    # one decode token: the k experts it picks are 1 local expert per rank on average
    assert {o.op.name: o for o in layer_ops(m, 8, 1, moe=True, ep=8)}[
        "expert_mlp_up_proj"
    ].groups == pytest.approx(1.0)
    # the forward model charges the EP shapes, and the all-reduce is the same
    fm_tp = forward_model(m, "h200", 8, prof)
    fm_ep = forward_model(m, "h200", 8, prof, ep=8)
    assert fm_ep.linear_s(t) != fm_tp.linear_s(t)
    assert fm_ep.allreduce_s(t, 1) == fm_tp.allreduce_s(t, 1)
    dense = forward_model(get_model("llama-3-8b"), "h100-sxm", 1, prof, ep=1)
    assert dense.linear_s(t) == forward_model(get_model("llama-3-8b"), "h100-sxm", 1,
                                              prof).linear_s(t)  # fmt: skip
