"""Hugging Face ``config.json`` -> :class:`~hicache.models.ModelSpec`, and the model presets.

``load_model_config(path_or_dict)`` reads any decoder-only HF config: dense MHA/GQA (Llama,
Mistral, Qwen2/Qwen3, phi-2), MoE (Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3) and MLA
attention (DeepSeek-V2/V3). ``get_model(name_or_path)`` returns a preset or loads a config file.
Presets are config files under ``hicache/model_configs/`` (``<preset>.json``): the HF fields,
verbatim, plus a ``"hicache"`` block for what the HF file does not say (name, source, dtypes).

Parsing rules (first field present wins; ``None`` counts as absent):

* layers ``num_hidden_layers`` | ``n_layer``; hidden ``hidden_size`` | ``n_embd``; heads
  ``num_attention_heads`` | ``n_head``; KV heads ``num_key_value_heads`` (default: the
  attention heads, as HF does); ``head_dim`` explicit, else ``hidden / heads`` (must divide).
* MLA when ``kv_lora_rank`` is set: needs ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim``; ``q_lora_rank`` null = 0 (no query compression).
* MoE when ``num_local_experts`` (Mixtral) | ``n_routed_experts`` (DeepSeek) | ``num_experts``
  (Qwen-MoE) is > 0: needs ``num_experts_per_tok``; expert width ``moe_intermediate_size``, else
  ``intermediate_size`` (Mixtral); shared width ``shared_expert_intermediate_size`` (Qwen2-MoE)
  or ``n_shared_experts * moe_intermediate_size`` (DeepSeek). MoE layers: DeepSeek's ``i >=
  first_k_dense_replace and i % moe_layer_freq == 0``; Qwen's ``i not in mlp_only_layers and
  (i + 1) % decoder_sparse_step == 0``; every layer otherwise. Dense layers use
  ``intermediate_size`` | ``n_inner``.
* MLP gated (SwiGLU) unless ``model_type`` is a GPT-style family (phi, gpt2, gpt_neox, ...).
* Q/K/V biases when ``attention_bias`` | ``qkv_bias`` is true, or for qwen2/qwen2_moe/phi.
* Dtypes: ``torch_dtype`` | ``dtype`` bf16/fp16 -> 2 bytes (fp32 checkpoints too: SGLang's
  ``--dtype auto`` serves them in half precision); an FP8 ``quantization_config`` -> 1 byte
  weights, one with ``bits`` -> ``bits / 8``; the KV cache stays 2 bytes. The ``"hicache"``
  block's ``kv_dtype_bytes``/``weight_dtype_bytes``, or the arguments of the same names,
  override both.
* A config with no layer count but a ``text_config`` (multimodal wrappers) is read from it.

Standard library only. Errors a user can cause raise ``ValueError`` naming the file and field.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hicache.models import ModelSpec

#: Where the shipped presets live: one ``<preset>.json`` per model.
MODEL_CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"

# GPT-style families whose MLP is up -> activation -> down (no gate projection)
_NON_GATED = frozenset(
    {"phi", "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "mpt"}
    | {"codegen", "starcoder2"}
)
# families whose Q/K/V projections always carry a bias (no config field says so)
_QKV_BIAS = frozenset(("qwen2", "qwen2_moe", "phi"))
# families that tie input and output embeddings when the config does not say
_TIED_BY_DEFAULT = frozenset(("gpt2", "gpt_bigcode", "opt", "bloom", "gemma", "gemma2"))
# half-precision dtypes; float32 checkpoints are served in half precision by --dtype auto
_HALF = frozenset(("bfloat16", "float16", "bf16", "fp16", "half", "float32", "float"))
_FP8_METHODS = frozenset(("fp8", "fbgemm_fp8", "w8a8_fp8"))
# keys of a config's "hicache" block (what the HF file does not say)
_HICACHE_KEYS = frozenset(
    ("name", "source", "kv_dtype_bytes", "weight_dtype_bytes", "gated_mlp", "notes")
)


class _Config:
    """A config dict with field lookup that names the source and the architecture on error."""

    def __init__(self, raw: Mapping[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where
        arch = raw.get("architectures")
        self.model_type = str(raw.get("model_type") or "")
        label = arch[0] if isinstance(arch, list) and arch else self.model_type or "unknown"
        self.arch = str(label)

    def error(self, what: str) -> ValueError:
        return ValueError(f"{self.where} ({self.arch}): {what}")

    def get(self, *keys: str) -> Any:
        for k in keys:
            v = self.raw.get(k)
            if v is not None:
                return v
        return None

    def int(self, *keys: str, default: int | None = None) -> int:
        v = self.get(*keys)
        if v is None:
            if default is None:
                raise self.error(f"missing required field {keys[0]!r}")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"field {keys[0]!r} must be an integer, got {v!r}")
        return v


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"model config {p}: no such file") from None
    except OSError as e:
        raise ValueError(f"model config {p}: cannot read: {e.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {p}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"model config {p}: expected a JSON object, got {type(raw).__name__}")
    return raw, p


def _head_dim(c: _Config, hidden: int, heads: int) -> int:
    explicit = c.get("head_dim")
    if explicit is not None:
        return c.int("head_dim")
    if hidden % heads:
        raise c.error(
            f"hidden_size {hidden} is not divisible by num_attention_heads {heads} and the "
            "config has no head_dim"
        )
    return hidden // heads


def _moe_layer_count(c: _Config, layers: int) -> int:
    if c.get("first_k_dense_replace", "moe_layer_freq") is not None:  # DeepSeek
        first = c.int("first_k_dense_replace", default=0)
        freq = c.get("moe_layer_freq")
        if isinstance(freq, list):  # a per-layer 0/1 pattern
            if len(freq) != layers:
                raise c.error(f"moe_layer_freq lists {len(freq)} layers, not {layers}")
            return sum(1 for i, f in enumerate(freq) if f and i >= first)
        step = c.int("moe_layer_freq", default=1)
        if step < 1:
            raise c.error(f"moe_layer_freq must be >= 1, got {step}")
        return sum(1 for i in range(first, layers) if i % step == 0)
    step = c.int("decoder_sparse_step", default=1)  # Qwen-MoE
    if step < 1:
        raise c.error(f"decoder_sparse_step must be >= 1, got {step}")
    dense_only = set(c.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)


def _moe_fields(c: _Config, layers: int) -> dict[str, int]:
    experts = c.int("num_local_experts", "n_routed_experts", "num_experts", default=0)
    if experts < 1:
        return {}
    width = c.int("moe_intermediate_size", "intermediate_size")
    if c.get("shared_expert_intermediate_size") is not None:
        shared = c.int("shared_expert_intermediate_size")
    else:
        shared = c.int("n_shared_experts", default=0) * width
    return {
        "num_experts": experts,
        "experts_per_token": c.int("num_experts_per_tok"),
        "expert_intermediate_size": width,
        "shared_expert_intermediate_size": shared,
        "moe_layers": _moe_layer_count(c, layers),
    }


def _attention_fields(c: _Config, hidden: int, heads: int) -> dict[str, Any]:
    if c.get("kv_lora_rank") is not None:  # MLA (DeepSeek-V2/V3)
        nope = c.int("qk_nope_head_dim")
        rope = c.int("qk_rope_head_dim")
        return {
            "mla": True,
            "kv_lora_rank": c.int("kv_lora_rank"),
            "qk_rope_head_dim": rope,
            "qk_nope_head_dim": nope,
            "q_lora_rank": c.int("q_lora_rank", default=0),
            "head_dim": nope + rope,
            "v_head_dim": c.int("v_head_dim"),
            "num_kv_heads": 1,  # one shared latent per token and layer
        }
    kv_heads = c.int("num_key_value_heads", "n_head_kv", default=heads)
    if kv_heads < 1 or heads % kv_heads:
        raise c.error(f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    head_dim = _head_dim(c, hidden, heads)
    bias = bool(c.get("attention_bias", "qkv_bias")) or c.model_type in _QKV_BIAS
    return {
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "v_head_dim": head_dim,
        "attention_bias": bias,
    }


def _weight_dtype_bytes(c: _Config) -> float:
    q = c.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        if method in _FP8_METHODS or str(q.get("fmt", "")).startswith("e4m3"):
            return 1.0
        bits = q.get("bits", q.get("weight_bits"))
        if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
            return bits / 8
        raise c.error(
            f"quantization_config quant_method {method or '?'!r}: weight bytes unknown; set "
            '"hicache": {"weight_dtype_bytes": ...} or pass weight_dtype_bytes'
        )
    return 2.0


def _check_dtype(c: _Config) -> None:
    dtype = c.get("torch_dtype", "dtype")
    if dtype is not None and str(dtype).removeprefix("torch.") not in _HALF:
        raise c.error(
            f"torch_dtype {dtype!r} is not bf16/fp16/fp32; set "
            '"hicache": {"weight_dtype_bytes": ..., "kv_dtype_bytes": ...}'
        )


def _hicache_block(c: _Config) -> dict[str, Any]:
    block = c.raw.get("hicache", {})
    if not isinstance(block, dict):
        raise c.error('"hicache" must be a JSON object')
    unknown = sorted(set(block) - _HICACHE_KEYS)
    if unknown:
        raise c.error(
            f"unknown key hicache.{unknown[0]} (known: {', '.join(sorted(_HICACHE_KEYS))})"
        )
    return block


def _default_name(c: _Config, path: Path | None) -> str:
    if path is not None:
        return path.parent.name if path.name == "config.json" else path.stem
    named = c.get("_name_or_path")
    return str(named).rstrip("/").rsplit("/", 1)[-1] if named else c.model_type or "model"


def load_model_config(
    path_or_dict: str | os.PathLike[str] | Mapping[str, Any],
    name: str | None = None,
    *,
    kv_dtype_bytes: int | None = None,
    weight_dtype_bytes: float | None = None,
) -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face ``config.json`` (a path, a model directory
    holding one, or the parsed dict). ``name`` defaults to the ``"hicache"`` block's name, then
    the model directory (or file stem), then ``_name_or_path``. ``kv_dtype_bytes`` and
    ``weight_dtype_bytes`` override the dtypes read from the config. ``ValueError`` names the
    file and the field for a missing file, invalid JSON, a missing or inconsistent field."""
    if isinstance(path_or_dict, Mapping):
        raw: Mapping[str, Any] = path_or_dict
        path = None
        where = f"model config {name or '<dict>'}"
    else:
        raw, path = _read(path_or_dict)
        where = f"model config {path}"
    if raw.get("num_hidden_layers") is None and isinstance(raw.get("text_config"), dict):
        raw = {**raw["text_config"], "hicache": raw.get("hicache", {})}
    c = _Config(raw, where)
    block = _hicache_block(c)
    layers = c.int("num_hidden_layers", "n_layer")
    hidden = c.int("hidden_size", "n_embd")
    heads = c.int("num_attention_heads", "n_head")
    if min(layers, hidden, heads) < 1:
        raise c.error("num_hidden_layers, hidden_size and num_attention_heads must be >= 1")
    moe = _moe_fields(c, layers)
    dense_layers = layers - moe.get("moe_layers", 0)
    intermediate = c.int("intermediate_size", "n_inner", default=0 if not dense_layers else None)
    if block.get("weight_dtype_bytes") is None and weight_dtype_bytes is None:
        _check_dtype(c)
    w_bytes = weight_dtype_bytes or block.get("weight_dtype_bytes") or _weight_dtype_bytes(c)
    tied = c.get("tie_word_embeddings")
    shape: dict[str, Any] = {**_attention_fields(c, hidden, heads), **moe}
    try:
        return ModelSpec(
            name=name or str(block.get("name") or _default_name(c, path)),
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            vocab_size=c.int("vocab_size"),
            tie_word_embeddings=c.model_type in _TIED_BY_DEFAULT if tied is None else bool(tied),
            intermediate_size=intermediate,
            gated_mlp=bool(block.get("gated_mlp", c.model_type not in _NON_GATED)),
            dtype_bytes=kv_dtype_bytes or int(block.get("kv_dtype_bytes", 2)),
            weight_dtype_bytes=float(w_bytes),
            **shape,
        )
    except ValueError as e:
        raise c.error(str(e)) from None


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------


def load_presets(directory: Path = MODEL_CONFIG_DIR) -> dict[str, ModelSpec]:
    """Every ``<preset>.json`` in ``directory``, by preset name (the file stem)."""
    return {p.stem: load_model_config(p, p.stem) for p in sorted(directory.glob("*.json"))}


#: The shipped presets, by name.
MODELS: dict[str, ModelSpec] = load_presets()


def _looks_like_path(name: str) -> bool:
    return (
        name.endswith(".json")
        or name.startswith(("~", "."))
        or "/" in name
        or os.sep in name
        or Path(name).exists()
    )


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def find_name(name: str, names: Iterable[str], *, prefix: bool = False) -> str | None:
    """The preset name ``name`` stands for among ``names``: itself, the one it equals ignoring
    case (and ``_``/space for ``-``: ``H200`` -> ``h200``), or with ``prefix`` the only one it
    begins (``H100`` -> ``h100-sxm``); None when there is none or several."""
    names = list(names)
    if name in names:
        return name
    key = _normal(name)
    same = [n for n in names if _normal(n) == key]
    if len(same) == 1:
        return same[0]
    if prefix and key:
        starts = [n for n in names if _normal(n).startswith(key)]
        if len(starts) == 1:
            return starts[0]
    return None


def or_list(names: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else list(names))


def unknown_name(kind: str, name: str, names: Iterable[str], extra: str = "") -> ValueError:
    """``ValueError``: ``unknown KIND 'NAME'; did you mean ...? choices: ...`` (the closest
    names by :func:`difflib.get_close_matches`, ignoring case), ``extra`` appended."""
    names = sorted(names)
    by_key = {_normal(n): n for n in names}
    close = [by_key[k] for k in difflib.get_close_matches(_normal(name), by_key, n=3, cutoff=0.6)]
    hint = f"did you mean {or_list(close)}? " if close else ""
    return ValueError(f"unknown {kind} {name!r}; {hint}choices: {', '.join(names)}{extra}")


def preset_name(name: str) -> str | None:
    """The model preset ``name`` stands for, case aside (``Qwen3-32B`` -> ``qwen3-32b``), or
    None."""
    return find_name(name, MODELS)


def get_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """The preset called ``name_or_path`` (case aside), or the model of a HF ``config.json`` at
    that path (a file or a directory holding one; relative, absolute or ``~``). ``ValueError``
    with the closest presets for an unknown name, or from :func:`load_model_config` for a bad
    file."""
    name = os.fspath(name_or_path)
    if name in MODELS:
        return MODELS[name]
    if _looks_like_path(name):
        return load_model_config(name)
    preset = preset_name(name)
    if preset is not None:
        return MODELS[preset]
    raise unknown_name("model", name, MODELS, " (or the path of a Hugging Face config.json)")


__all__ = [
    "MODELS",
    "MODEL_CONFIG_DIR",
    "find_name",
    "get_model",
    "load_model_config",
    "load_presets",
    "or_list",
    "preset_name",
    "unknown_name",
]
