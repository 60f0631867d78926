"""The forward-pass model (`hicache.forward`): which ops a model runs, how they add up, and
that the dense path is exactly the decomposition the leave-one-model-out fit was checked on."""

from __future__ import annotations

import dataclasses

import pytest

from hicache.compute import DenseLayer, linear_time
from hicache.forward import (
    expected_experts_hit,
    forward_model,
    layer_ops,
)
from hicache.hardware import get_model
from hicache.latency import load_profile
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
    assert b.overhead_s == pytest.approx(prof.prefill_forward_s + prof.request_s + prof.sampling_s)
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
    assert tp8.allreduce_s == pytest.approx(
        2 * 80 * forward_model(m, "h100-sxm", 8, prof).all_reduce.time(4096 * 8192 * 2, 8)
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


def test_hicache_checks_cost_only_under_tp_with_a_host_tier(prof: Profile) -> None:
    """SGLang's writing/loading checks each run a CPU all-reduce over the TP group every
    scheduler iteration: two per pass, and none at tp 1 or without the host tier."""
    from hicache.config import load_config
    from sim.costs import build_costs

    m = get_model("llama-3-70b")
    plain = forward_model(m, "h100-sxm", 8, prof)
    tiered = forward_model(m, "h100-sxm", 8, prof, host_tier=True)
    one = forward_model(get_model("llama-3-8b"), "h100-sxm", 1, prof, host_tier=True)
    assert tiered.per_pass_s == 2 * prof.hicache_check_s == pytest.approx(3e-4)
    assert plain.per_pass_s == 0.0 == one.per_pass_s
    assert tiered.decode_time(4, 0) - plain.decode_time(4, 0) == pytest.approx(3e-4)
    assert tiered.prefill_time([(10, 0)]) - plain.prefill_time([(10, 0)]) == pytest.approx(3e-4)
    base = ["model.name=llama-3-70b", "model.tp=8"]
    on = build_costs(load_config(None, base))
    off = build_costs(load_config(None, [*base, "cache.enable_host=false"]))
    assert on.decode_fn(1, 0) - off.decode_fn(1, 0) == pytest.approx(3e-4)
