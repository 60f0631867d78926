"""A served model's shape (:class:`ModelSpec`), its parameter counts, KV bytes and weight bytes.

A ``ModelSpec`` holds what a KV-cache size, a weight size and a per-operator forward model need:
the attention kind (MHA/GQA or DeepSeek's MLA), the MLP (dense, gated or not, and MoE experts),
the embeddings and the dtypes. ``params`` and ``active_params`` are computed from that shape
(embeddings, attention projections, MLPs, experts, routers, shared experts, norms), not typed in.
Specs come from Hugging Face ``config.json`` files (``hicache.model_config``); the presets are
such files under ``hicache/model_configs/``.

Standard library only. Sizes are bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------
# ModelSpec
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as KV bytes, weight bytes and FLOPs need it.

    Attention. ``head_dim`` is the query/key head dimension and ``v_head_dim`` the value head
    dimension (equal except for MLA). For MHA/GQA the KV cache holds ``num_kv_heads`` keys and
    values of ``head_dim`` per layer. For MLA (``mla``, DeepSeek-V2/V3) it holds one latent of
    ``kv_lora_rank + qk_rope_head_dim`` per layer, ``num_kv_heads`` is 1 (one shared latent) and
    ``head_dim = qk_nope_head_dim + qk_rope_head_dim`` is the non-absorbed prefill's QK dim;
    queries go through a ``q_lora_rank`` bottleneck when it is > 0. ``attention_bias``: the Q, K
    and V projections carry biases (Qwen2, phi-2).

    MLP. Dense layers have an MLP of width ``intermediate_size``: gate + up + down projections
    when ``gated_mlp`` (SwiGLU/GeGLU), up + down otherwise (phi-2's GELU MLP). ``moe_layers`` of
    the ``num_layers`` layers are mixture-of-experts instead: ``num_experts`` experts of width
    ``expert_intermediate_size``, ``experts_per_token`` of them active per token, a router
    (``hidden x num_experts``) and, when ``shared_expert_intermediate_size`` > 0, shared
    expert(s) of that total width that every token passes through.

    Counts. ``params`` counts every weight (for weight bytes); ``active_params`` the weights one
    token passes through (``params`` for dense models, the activated experts for MoE), embeddings
    included, as model cards quote them. Both are computed from the shape; passing them
    explicitly overrides that, for toy models in tests whose shape is not a real transformer.
    **[model]** Norm weights are counted as two ``hidden``-vectors per layer plus the final norm
    (plus MLA's two latent norms); Qwen3's per-head q/k norms, LayerNorm biases, output/MLP
    biases and DeepSeek-V3's router bias are left out (< 0.01 % of any model here).
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype_bytes: int
    """Bytes per KV element (2 = bf16), the KV-cache dtype."""
    mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    q_lora_rank: int = 0
    """MLA query compression rank; 0 = queries projected straight from the hidden state."""
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    weight_dtype_bytes: float
    """Bytes per weight as served (2 = bf16; DeepSeek-V3 ships FP8 weights, 1)."""
    attention_bias: bool = False
    intermediate_size: int = 0
    """Width of a dense layer's MLP (0 when every layer is MoE and no width is given)."""
    gated_mlp: bool = True
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    """Total width of the shared expert(s) of an MoE layer; 0 if none."""
    moe_layers: int = 0
    """How many of the layers are MoE; the other ``num_layers - moe_layers`` are dense."""
    params: float = 0.0
    """Every weight; computed from the shape when left at 0."""
    active_params: float = 0.0
    """Weights one token passes through; computed from the shape when left at 0."""

    def __post_init__(self) -> None:
        positive = (
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "v_head_dim",
            "dtype_bytes",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
        )
        for f in positive:
            if getattr(self, f) < 1:
                raise ValueError(f"model {self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.weight_dtype_bytes <= 0:
            raise ValueError(f"model {self.name}: weight_dtype_bytes must be > 0")
        if self.mla and (self.kv_lora_rank < 1 or self.qk_rope_head_dim < 0):
            raise ValueError(f"model {self.name}: MLA needs kv_lora_rank >= 1")
        self._check_mlp()
        if self.params == 0:
            if self.active_params != 0:
                raise ValueError(f"model {self.name}: active_params given without params")
            object.__setattr__(self, "params", float(self.computed_params))
            object.__setattr__(self, "active_params", float(self.computed_active_params))
        elif self.active_params == 0:
            object.__setattr__(self, "active_params", float(self.params))
        if not (self.params > 0 and 0 < self.active_params <= self.params):
            raise ValueError(
                f"model {self.name}: need 0 < active_params <= params, got "
                f"{self.active_params} and {self.params}"
            )
        if self.body_active_params <= 0:
            raise ValueError(f"model {self.name}: embeddings exceed active_params")

    def _check_mlp(self) -> None:
        for f in (
            "intermediate_size",
            "num_experts",
            "experts_per_token",
            "expert_intermediate_size",
            "shared_expert_intermediate_size",
            "moe_layers",
            "q_lora_rank",
            "qk_nope_head_dim",
        ):
            if getattr(self, f) < 0:
                raise ValueError(f"model {self.name}: {f} must be >= 0, got {getattr(self, f)}")
        if not 0 <= self.moe_layers <= self.num_layers:
            raise ValueError(
                f"model {self.name}: moe_layers must be in [0, num_layers={self.num_layers}], "
                f"got {self.moe_layers}"
            )
        if self.moe_layers:
            if self.num_experts < 1 or self.expert_intermediate_size < 1:
                raise ValueError(
                    f"model {self.name}: MoE layers need num_experts >= 1 and "
                    "expert_intermediate_size >= 1"
                )
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ValueError(
                    f"model {self.name}: experts_per_token must be in [1, num_experts="
                    f"{self.num_experts}], got {self.experts_per_token}"
                )
        if self.params == 0 and self.dense_layers and self.intermediate_size < 1:
            raise ValueError(
                f"model {self.name}: {self.dense_layers} dense layers need intermediate_size "
                ">= 1 (or give params explicitly)"
            )

    # --- shape-derived counts --------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        """Whether any layer is mixture-of-experts."""
        return self.moe_layers > 0

    @property
    def dense_layers(self) -> int:
        """Layers with a dense MLP of width ``intermediate_size``."""
        return self.num_layers - self.moe_layers

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head weights (one matrix when they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def attention_params(self) -> int:
        """Attention weights of one layer (projections, plus MLA's latent norms)."""
        h = self.hidden_size
        heads = self.num_attention_heads
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk
            else:
                q = h * heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + heads * self.v_head_dim * h
        q_out = heads * self.head_dim
        kv_out = 2 * self.num_kv_heads * self.head_dim
        bias = q_out + kv_out if self.attention_bias else 0
        return h * (q_out + kv_out) + heads * self.v_head_dim * h + bias

    def mlp_params(self, width: int) -> int:
        """Weights of one MLP (or expert) of intermediate width ``width``."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    @property
    def dense_mlp_params(self) -> int:
        """Weights of a dense layer's MLP."""
        return self.mlp_params(self.intermediate_size)

    @property
    def moe_shared_params(self) -> int:
        """Weights of an MoE layer that every token uses: router and shared expert(s)."""
        router = self.hidden_size * self.num_experts
        return router + self.mlp_params(self.shared_expert_intermediate_size)

    @property
    def moe_params(self) -> int:
        """Weights of an MoE layer's MLP block: all experts, router and shared expert(s)."""
        experts = self.num_experts * self.mlp_params(self.expert_intermediate_size)
        return experts + self.moe_shared_params

    @property
    def moe_active_params(self) -> int:
        """Weights of an MoE layer's MLP block that one token passes through."""
        experts = self.experts_per_token * self.mlp_params(self.expert_intermediate_size)
        return experts + self.moe_shared_params

    def _total(self, moe_block: int) -> int:
        norms = 2 * self.hidden_size * self.num_layers + self.hidden_size
        return (
            self.embedding_params
            + norms
            + self.num_layers * self.attention_params
            + self.dense_layers * self.dense_mlp_params
            + self.moe_layers * moe_block
        )

    @property
    def computed_params(self) -> int:
        """Every weight, from the shape (what ``params`` is unless given explicitly)."""
        return self._total(self.moe_params)

    @property
    def computed_active_params(self) -> int:
        """Weights one token passes through, from the shape."""
        return self._total(self.moe_active_params)

    @property
    def body_active_params(self) -> float:
        """Active parameters that every token multiplies through: ``active_params`` less the
        embeddings. The embedding lookup is a gather (no FLOPs), and SGLang computes logits only
        for the last position of each extend, so the LM head is charged per request, not per
        token (see ``hicache.latency.prefill_flops``)."""
        return self.active_params - self.embedding_params


# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------


def kv_bytes_per_token(model: ModelSpec, tp: int = 1) -> int:
    """KV-cache bytes one token occupies on one tensor-parallel rank, all layers together.

    MHA/GQA: ``2 (K and V) * layers * kv_heads_per_rank * head_dim * dtype_bytes``, where the
    KV heads are split across ranks: ``kv_heads // tp`` while ``tp <= kv_heads``; beyond that
    every rank holds (a replica of) one head, as SGLang's ``get_num_kv_heads`` does, so the size
    stops shrinking. ``tp`` must divide ``kv_heads`` or be a multiple of it.
    MLA: ``(kv_lora_rank + qk_rope_head_dim) * dtype_bytes * layers``, replicated on every rank
    (``tp`` does not divide it). This is SGLang's host ``size_per_token`` (POLICY_CORE.md §4.2)
    and reproduces the HARDWARE.md C4 table. Raises ``ValueError`` for an invalid ``tp``.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if model.mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * model.dtype_bytes * model.num_layers
    h = model.num_kv_heads
    if h % tp and tp % h:
        raise ValueError(
            f"tp={tp} does not split {model.name}'s {h} KV heads evenly "
            f"(tp must divide {h} or be a multiple of it)"
        )
    heads_per_rank = max(1, h // tp)
    return 2 * model.num_layers * heads_per_rank * model.head_dim * model.dtype_bytes


def replicated_params(model: ModelSpec) -> int:
    """Weights every tensor-parallel rank holds whole: MLA's latent down-projections (SGLang's
    replicated ``fused_qkv_a_proj_with_mqa``: ``hidden -> q_lora_rank + kv_lora_rank + rope``)
    and the MoE routers (``hidden -> experts``). Norms are ignored (< 0.01 %)."""
    h = model.hidden_size
    per_layer = 0
    if model.mla:
        per_layer = h * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
    router = h * model.num_experts * model.moe_layers
    return per_layer * model.num_layers + router


def weight_bytes_per_rank(model: ModelSpec, tp: int = 1) -> float:
    """Weight bytes on one rank.

    The layers' weights at ``weight_dtype_bytes``, sharded by ``tp`` except the
    :func:`replicated_params`; the embedding and LM head at 16 bits (quantized checkpoints,
    FP8 DeepSeek-V3 and 4-bit AWQ/GPTQ alike, keep them in bf16/fp16), vocab-parallel so split
    by ``tp``. For a 16-bit dense model this is ``params * 2 / tp``. **[model]** Experts are
    taken as evenly sharded (no expert parallelism).
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    emb, rep = model.embedding_params, replicated_params(model)
    body = model.params - emb - rep
    w = model.weight_dtype_bytes
    return body * w / tp + rep * w + emb * 2 / tp


# ---------------------------------------------------------------------------------------------
# Served dtypes (model.kv_dtype, model.weight_dtype)
# ---------------------------------------------------------------------------------------------

#: ``model.kv_dtype`` -> bytes per KV element. The names are SGLang's ``--kv-cache-dtype``
#: values (``bfloat16`` is its alias of ``bf16``); an FP8 element is one byte
#: (``torch.float8_e4m3fn`` / ``float8_e5m2``, 0.5.14 ``model_runner.py:2357-2366``). SGLang's FP4
#: and MX recipes carry per-block scales and are not modelled.
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}

#: ``model.weight_dtype`` -> bytes per weight as served: 16-bit, FP8 (a ``-FP8`` checkpoint or
#: ``--quantization fp8``), 8-bit integer (GPTQ-Int8, W8A8-INT8) and 4-bit (AWQ, GPTQ-Int4).
#: **[model]** Quantization scales and zero points (about 0.1-0.3 bit per weight at group size
#: 128) are left out.
WEIGHT_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
                                        "int4": 0.5}  # fmt: skip

#: The value of either key that keeps the model's own dtype (SGLang's ``auto``: the checkpoint's
#: ``torch_dtype`` for the KV cache, bf16 for every preset; its quantization for the weights).
AUTO_DTYPE = "auto"


def with_dtypes(model: ModelSpec, kv_dtype: str = AUTO_DTYPE,
                weight_dtype: str = AUTO_DTYPE) -> ModelSpec:  # fmt: skip
    """``model`` served with KV elements of ``kv_dtype`` and weights of ``weight_dtype`` (keys
    of :data:`KV_DTYPE_BYTES` / :data:`WEIGHT_DTYPE_BYTES`, or ``auto`` to keep the model's).
    The shape and parameter counts are unchanged; ``ValueError`` names an unknown dtype."""
    kv, w = model.dtype_bytes, model.weight_dtype_bytes
    if kv_dtype != AUTO_DTYPE:
        if kv_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}; choose one of auto, "
                             f"{', '.join(KV_DTYPE_BYTES)}")  # fmt: skip
        kv = KV_DTYPE_BYTES[kv_dtype]
    if weight_dtype != AUTO_DTYPE:
        if weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise ValueError(f"unknown weight dtype {weight_dtype!r}; choose one of auto, "
                             f"{', '.join(WEIGHT_DTYPE_BYTES)}")  # fmt: skip
        w = WEIGHT_DTYPE_BYTES[weight_dtype]
    if (kv, w) == (model.dtype_bytes, model.weight_dtype_bytes):
        return model
    return dataclasses.replace(model, dtype_bytes=kv, weight_dtype_bytes=w)


__all__ = [
    "AUTO_DTYPE",
    "KV_DTYPE_BYTES",
    "WEIGHT_DTYPE_BYTES",
    "ModelSpec",
    "kv_bytes_per_token",
    "replicated_params",
    "weight_bytes_per_rank",
    "with_dtypes",
]
