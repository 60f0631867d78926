"""Model shapes from Hugging Face config.json (`hicache.models`, `hicache.model_config`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hicache.hardware import MODELS, get_model, kv_bytes_per_token, load_model_config
from hicache.model_config import MODEL_CONFIG_DIR
from hicache.models import ModelSpec

PRESET_FILES = sorted(MODEL_CONFIG_DIR.glob("*.json"))

# HARDWARE.md C4, bf16 bytes per token (TP1, all layers)
C4_TABLE = {
    "llama-3-8b": 131_072,
    "llama-3-70b": 327_680,
    "qwen3-8b": 147_456,
    "qwen3-32b": 262_144,
    "qwen3-235b-a22b": 192_512,
    "deepseek-v3": 70_272,
}

# (total, active) parameters as the model cards quote them; active None = dense
CARDS: dict[str, tuple[float, float | None]] = {
    "llama-3-8b": (8.03e9, None),
    "llama-3-70b": (70.6e9, None),
    "qwen3-8b": (8.2e9, None),
    "qwen3-32b": (32.8e9, None),
    "qwen3-235b-a22b": (235e9, 22e9),
    "deepseek-v3": (671e9, 37e9),  # main model; the 11.5B MTP module is not counted
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "llama-2-7b": (6.74e9, None),
    "llama-2-70b": (69e9, None),
    # the card says "2.7 billion"; the checkpoint holds 2,779,683,840: the card rounds down
    "phi-2": (2.78e9, None),
    "codellama-34b": (33.7e9, None),  # "34B"; the checkpoint holds 33.74B
    "qwen2.5-7b": (7.61e9, None),
    "qwen2.5-72b": (72.7e9, None),
    "qwen3-0.6b": (0.6e9, None),  # card: 0.6B (0.44B without the tied embedding)
}

# The hand-typed presets this module replaced: every field but the parameter counts
LEGACY = {
    "llama-3-8b": (32, 8, 128, 128, 2, False, 0, 0, 4096, 32, 128_256, False, 2),
    "llama-3-70b": (80, 8, 128, 128, 2, False, 0, 0, 8192, 64, 128_256, False, 2),
    "qwen3-8b": (36, 8, 128, 128, 2, False, 0, 0, 4096, 32, 151_936, False, 2),
    "qwen3-32b": (64, 8, 128, 128, 2, False, 0, 0, 5120, 64, 151_936, False, 2),
    "qwen3-235b-a22b": (94, 4, 128, 128, 2, False, 0, 0, 4096, 64, 151_936, False, 2),
    "deepseek-v3": (61, 1, 192, 128, 2, True, 512, 64, 7168, 128, 129_280, False, 1),
}
LEGACY_FIELDS = (
    *("num_layers", "num_kv_heads", "head_dim", "v_head_dim", "dtype_bytes", "mla"),
    *("kv_lora_rank", "qk_rope_head_dim", "hidden_size", "num_attention_heads", "vocab_size"),
    *("tie_word_embeddings", "weight_dtype_bytes"),
)


def _raw(name: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((MODEL_CONFIG_DIR / f"{name}.json").read_text())
    return raw


def _write(path: Path, cfg: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


# --- presets -----------------------------------------------------------------------------------


def test_presets_are_the_config_files() -> None:
    assert [p.stem for p in PRESET_FILES] == sorted(MODELS)
    assert set(CARDS) == set(MODELS)
    for name, m in MODELS.items():
        assert m.name == name
        block = _raw(name)["hicache"]
        assert block["name"] == name and block["source"]


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_every_preset_parses_from_its_json(path: Path) -> None:
    assert load_model_config(path) == MODELS[path.stem]
    assert get_model(str(path)) == MODELS[path.stem]  # a path, not the preset name


@pytest.mark.parametrize("name", sorted(CARDS))
def test_kv_bytes_follow_the_hf_fields(name: str) -> None:
    cfg = _raw(name)
    layers = cfg["num_hidden_layers"]
    if "kv_lora_rank" in cfg:
        expected = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2 * layers
    else:
        head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        expected = 2 * layers * cfg["num_key_value_heads"] * head_dim * 2
    assert kv_bytes_per_token(MODELS[name]) == expected
    if name in C4_TABLE:
        assert expected == C4_TABLE[name]


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_the_c4_presets_keep_their_shapes(name: str) -> None:
    m = MODELS[name]
    assert tuple(getattr(m, f) for f in LEGACY_FIELDS) == LEGACY[name]


@pytest.mark.parametrize("name", sorted(CARDS))
def test_parameter_counts_match_the_model_cards(name: str) -> None:
    total, active = CARDS[name]
    m = MODELS[name]
    assert m.params == pytest.approx(total, rel=0.02)
    assert m.active_params == pytest.approx(active or total, rel=0.02)
    assert (m.active_params < m.params) == m.is_moe


def test_exact_counts_of_two_checkpoints() -> None:
    # Llama-3-8B and Mixtral-8x7B safetensors totals (RMSNorm weights included)
    assert MODELS["llama-3-8b"].params == 8_030_261_248
    assert MODELS["mixtral-8x7b"].params == 46_702_792_704


def test_moe_presets() -> None:
    ds = MODELS["deepseek-v3"]
    assert (ds.num_experts, ds.experts_per_token, ds.moe_layers, ds.dense_layers) == (256, 8, 58, 3)
    assert (ds.expert_intermediate_size, ds.shared_expert_intermediate_size) == (2048, 2048)
    assert (ds.q_lora_rank, ds.qk_nope_head_dim, ds.intermediate_size) == (1536, 128, 18432)
    q = MODELS["qwen3-235b-a22b"]
    assert (q.num_experts, q.experts_per_token, q.moe_layers, q.expert_intermediate_size) == (
        128,
        8,
        94,
        1536,
    )
    assert q.shared_expert_intermediate_size == 0
    mx = MODELS["mixtral-8x7b"]
    assert (mx.num_experts, mx.experts_per_token, mx.moe_layers) == (8, 2, 32)
    assert mx.expert_intermediate_size == 14336
    assert not MODELS["llama-3-8b"].is_moe


def test_phi2_is_a_gelu_mha_model_with_qkv_bias() -> None:
    phi = MODELS["phi-2"]
    assert not phi.gated_mlp and phi.attention_bias
    assert (phi.head_dim, phi.num_kv_heads, phi.intermediate_size) == (80, 32, 10240)
    assert kv_bytes_per_token(phi) == 2 * 32 * 32 * 80 * 2
    assert phi.dense_mlp_params == 2 * 2560 * 10240
    assert MODELS["qwen2.5-7b"].attention_bias and not MODELS["llama-3-8b"].attention_bias


# --- hand-written configs ------------------------------------------------------------------------


def test_mixtral_style_config() -> None:
    cfg = {**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
    m = load_model_config(cfg, "mx")
    assert (m.num_experts, m.experts_per_token, m.moe_layers) == (8, 2, 32)
    assert m.expert_intermediate_size == m.intermediate_size == 14336
    per_expert = 3 * 4096 * 14336
    assert m.params - m.active_params == 32 * 6 * per_expert


def test_qwen_moe_config_with_sparse_step_and_dense_layers() -> None:
    cfg = {
        **LLAMA,
        "model_type": "qwen2_moe",
        "num_hidden_layers": 8,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 2,  # layers 1, 3, 5, 7
        "mlp_only_layers": [3],
    }
    m = load_model_config(cfg, "qmoe")
    assert (m.num_experts, m.experts_per_token, m.moe_layers, m.dense_layers) == (60, 4, 3, 5)
    assert m.shared_expert_intermediate_size == 5632
    assert m.attention_bias  # qwen2 family: Q/K/V biases
    h = 4096
    moe_block = 60 * 3 * h * 1408 + h * 60 + 3 * h * 5632
    assert m.moe_params == moe_block
    assert m.moe_active_params == moe_block - 56 * 3 * h * 1408


def test_deepseek_style_config() -> None:
    cfg = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 102400,
        "q_lora_rank": None,  # V2-Lite: no query compression
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 2,  # layers 2, 4, ..., 26
        "torch_dtype": "bfloat16",
    }
    m = load_model_config(cfg, "ds")
    assert m.mla and (m.num_kv_heads, m.head_dim, m.v_head_dim, m.q_lora_rank) == (1, 192, 128, 0)
    assert (m.num_experts, m.experts_per_token, m.moe_layers) == (64, 6, 13)
    assert m.shared_expert_intermediate_size == 2 * 1408
    assert kv_bytes_per_token(m, 4) == (512 + 64) * 2 * 27
    attn = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    assert m.attention_params == attn


def test_per_layer_moe_pattern_list() -> None:
    cfg = {**LLAMA, "num_hidden_layers": 4, "n_routed_experts": 4, "num_experts_per_tok": 1}
    cfg |= {"moe_intermediate_size": 512, "moe_layer_freq": [0, 1, 1, 1]}
    assert load_model_config(cfg).moe_layers == 3


def test_computed_counts_by_hand() -> None:
    # 2 layers, hidden 8, 2 heads of 4, 1 KV head, gated MLP 16, vocab 10, tied
    m = ModelSpec(
        name="tiny", num_layers=2, num_kv_heads=1, head_dim=4, v_head_dim=4, dtype_bytes=2,
        hidden_size=8, num_attention_heads=2, vocab_size=10, tie_word_embeddings=True,
        weight_dtype_bytes=2, intermediate_size=16,
    )  # fmt: skip
    attn = 8 * 8 + 2 * 8 * 4 + 8 * 8  # q, k + v, o
    mlp = 3 * 8 * 16
    assert m.params == m.active_params == 10 * 8 + 2 * (attn + mlp + 2 * 8) + 8
    explicit = ModelSpec(
        name="toy", num_layers=2, num_kv_heads=2, head_dim=4, v_head_dim=4, dtype_bytes=2,
        params=1000, hidden_size=4, num_attention_heads=2, vocab_size=10,
        tie_word_embeddings=True, weight_dtype_bytes=2,
    )  # fmt: skip
    assert explicit.params == explicit.active_params == 1000


# --- dtypes ----------------------------------------------------------------------------------


def test_dtypes_and_overrides() -> None:
    assert load_model_config(LLAMA).weight_dtype_bytes == 2
    fp8 = {**LLAMA, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
    m = load_model_config(fp8)
    assert (m.weight_dtype_bytes, m.dtype_bytes) == (1, 2)
    awq = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4}}
    assert load_model_config(awq).weight_dtype_bytes == 0.5
    fp32 = {**LLAMA, "torch_dtype": "float32"}  # served in half precision
    assert load_model_config(fp32).weight_dtype_bytes == 2
    m = load_model_config(LLAMA, kv_dtype_bytes=1, weight_dtype_bytes=1)
    assert (m.dtype_bytes, m.weight_dtype_bytes) == (1, 1)
    m = load_model_config({**LLAMA, "hicache": {"kv_dtype_bytes": 1}})
    assert kv_bytes_per_token(m) == 131_072 // 2


# --- get_model and errors ------------------------------------------------------------------------


def test_get_model_reads_a_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "Meta-Llama-3-8B" / "config.json", LLAMA)
    m = get_model(str(path))
    assert m.name == "Meta-Llama-3-8B"  # the model directory
    assert kv_bytes_per_token(m) == 131_072
    assert m.params == MODELS["llama-3-8b"].params
    assert get_model(str(path.parent)) == m  # a model directory
    monkeypatch.chdir(tmp_path)
    assert get_model("Meta-Llama-3-8B/config.json") == m  # relative
    monkeypatch.setenv("HOME", str(tmp_path))
    assert get_model("~/Meta-Llama-3-8B/config.json") == m
    named = _write(tmp_path / "mine.json", {**LLAMA, "hicache": {"name": "my-llama"}})
    assert get_model(str(named)).name == "my-llama"


def test_get_model_unknown_name_lists_the_presets() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'nope'; choices: codellama-34b, "):
        get_model("nope")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model config .*missing\.json: no such file"):
        get_model(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 4096,\n oops}')
    with pytest.raises(ValueError, match=r"bad\.json:2: invalid JSON"):
        get_model(str(bad))
    listed = _write(tmp_path / "list.json", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expected a JSON object, got list"):
        load_model_config(listed)


def _without(key: str, **extra: Any) -> dict[str, Any]:
    return {k: v for k, v in {**LLAMA, **extra}.items() if k != key}


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            _without("num_hidden_layers", architectures=["FooForCausalLM"]),
            r"\(FooForCausalLM\): missing required field 'num_hidden_layers'",
        ),
        (_without("vocab_size"), r"\(LlamaForCausalLM\): missing required field 'vocab_size'"),
        (_without("intermediate_size"), r"missing required field 'intermediate_size'"),
        (
            {**LLAMA, "hidden_size": 4097},
            r"hidden_size 4097 is not divisible by num_attention_heads 32 .* no head_dim",
        ),
        ({**LLAMA, "num_key_value_heads": 5}, r"num_key_value_heads 5 does not divide .* 32"),
        ({**LLAMA, "num_local_experts": 8}, r"missing required field 'num_experts_per_tok'"),
        (
            {**LLAMA, "num_experts": 4, "num_experts_per_tok": 6},
            r"experts_per_token must be in \[1, num_experts=4\], got 6",
        ),
        (
            {**LLAMA, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
            r"missing required field 'qk_nope_head_dim'",
        ),
        ({**LLAMA, "num_hidden_layers": "32"}, r"'num_hidden_layers' must be an integer"),
        ({**LLAMA, "torch_dtype": "int8"}, r"torch_dtype 'int8' is not bf16/fp16/fp32"),
        (
            {**LLAMA, "quantization_config": {"quant_method": "bitsandbytes"}},
            r"quant_method 'bitsandbytes': weight bytes unknown",
        ),
        ({**LLAMA, "hicache": {"nmae": "x"}}, r"unknown key hicache\.nmae"),
    ],
)
def test_config_errors_name_the_field(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_model_config(cfg, "bad")


def test_error_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "config.json", _without("vocab_size"))
    with pytest.raises(ValueError, match=rf"model config {tmp_path}/config\.json \(Llama"):
        get_model(str(path))


def test_multimodal_wrapper_reads_its_text_config() -> None:
    wrapped = {"architectures": ["FooVLForConditionalGeneration"], "text_config": LLAMA}
    assert kv_bytes_per_token(load_model_config(wrapped, "vl")) == 131_072
