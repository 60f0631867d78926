"""Model, GPU and host-link presets, KV-cache bytes per token, and device pool sizing.

Every figure carries its source: a section of ``shared/design/HARDWARE.md`` (C1 GPU memory, C2
links, C4 KV bytes per token, C6 prefill), a published model config (HF ``config.json``), or a
vendor datasheet. **[model]** marks something we derived or assumed rather than looked up.

Standard library only. Sizes are bytes, bandwidths bytes per second, GB = 1e9 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The shape of a transformer, as far as KV bytes, weight bytes and FLOPs need it.

    ``head_dim`` is the query/key head dimension and ``v_head_dim`` the value head dimension
    (equal for every model here except DeepSeek-V3's MLA, whose non-absorbed prefill uses QK 192
    = 128 nope + 64 rope, V 128). For MLA models the KV cache holds one latent of
    ``kv_lora_rank + qk_rope_head_dim`` per layer and ``num_kv_heads``/``head_dim`` do not
    enter the KV size. ``params`` counts every weight (for weight bytes); ``active_params`` the
    weights one token passes through (``params`` for dense models, the activated experts for
    MoE), embeddings included, as model cards quote them.
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
    params: float
    active_params: float
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    weight_dtype_bytes: float
    """Bytes per weight as served (2 = bf16; DeepSeek-V3 ships FP8 weights, 1)."""

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
        if not (self.params > 0 and 0 < self.active_params <= self.params):
            raise ValueError(
                f"model {self.name}: need 0 < active_params <= params, got "
                f"{self.active_params} and {self.params}"
            )
        if self.weight_dtype_bytes <= 0:
            raise ValueError(f"model {self.name}: weight_dtype_bytes must be > 0")
        if self.mla and (self.kv_lora_rank < 1 or self.qk_rope_head_dim < 0):
            raise ValueError(f"model {self.name}: MLA needs kv_lora_rank >= 1")
        if self.body_active_params <= 0:
            raise ValueError(f"model {self.name}: embeddings exceed active_params")

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head weights (one matrix when they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def body_active_params(self) -> float:
        """Active parameters that every token multiplies through: ``active_params`` less the
        embeddings. The embedding lookup is a gather (no FLOPs), and SGLang computes logits only
        for the last position of each extend, so the LM head is charged per request, not per
        token (see ``hicache.latency.prefill_flops``)."""
        return self.active_params - self.embedding_params


# Shapes from the published HF config.json files (HARDWARE.md C4 lists layers / KV heads /
# head dim); parameter counts from the model cards.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="llama-3-8b",
            num_layers=32,  # HF config (HARDWARE.md C4)
            num_kv_heads=8,  # GQA-8 (C4)
            head_dim=128,  # 4096 / 32 (C4)
            v_head_dim=128,
            dtype_bytes=2,  # bf16 KV, SGLang's default kv dtype = model dtype
            params=8.03e9,  # model card
            active_params=8.03e9,  # dense
            hidden_size=4096,  # HF config
            num_attention_heads=32,  # HF config
            vocab_size=128_256,  # HF config
            tie_word_embeddings=False,  # HF config
            weight_dtype_bytes=2,  # bf16 checkpoint
        ),
        ModelSpec(
            name="llama-3-70b",
            num_layers=80,  # HF config (C4; Mooncake Table 1: 320 KB/token)
            num_kv_heads=8,  # C4
            head_dim=128,  # C4
            v_head_dim=128,
            dtype_bytes=2,  # bf16
            params=70.6e9,  # model card
            active_params=70.6e9,  # dense
            hidden_size=8192,  # HF config
            num_attention_heads=64,  # HF config
            vocab_size=128_256,  # HF config
            tie_word_embeddings=False,  # HF config
            weight_dtype_bytes=2,  # bf16 checkpoint
        ),
        ModelSpec(
            name="qwen3-8b",
            num_layers=36,  # HF config (C4)
            num_kv_heads=8,  # C4
            head_dim=128,  # C4
            v_head_dim=128,
            dtype_bytes=2,  # bf16
            params=8.2e9,  # model card
            active_params=8.2e9,  # dense
            hidden_size=4096,  # HF config
            num_attention_heads=32,  # HF config
            vocab_size=151_936,  # HF config
            tie_word_embeddings=False,  # HF config (only the <= 4B Qwen3 models tie)
            weight_dtype_bytes=2,  # bf16 checkpoint
        ),
        ModelSpec(
            name="qwen3-32b",
            num_layers=64,  # HF config (C4)
            num_kv_heads=8,  # C4
            head_dim=128,  # C4
            v_head_dim=128,
            dtype_bytes=2,  # bf16
            params=32.8e9,  # model card
            active_params=32.8e9,  # dense
            hidden_size=5120,  # HF config
            num_attention_heads=64,  # HF config
            vocab_size=151_936,  # HF config
            tie_word_embeddings=False,  # HF config
            weight_dtype_bytes=2,  # bf16 checkpoint
        ),
        ModelSpec(
            name="qwen3-235b-a22b",
            num_layers=94,  # HF config (C4)
            num_kv_heads=4,  # C4
            head_dim=128,  # C4
            v_head_dim=128,
            dtype_bytes=2,  # bf16
            params=235e9,  # model card: 235B total
            active_params=22e9,  # model card: 22B activated (8 of 128 experts)
            hidden_size=4096,  # HF config
            num_attention_heads=64,  # HF config
            vocab_size=151_936,  # HF config
            tie_word_embeddings=False,  # HF config
            weight_dtype_bytes=2,  # bf16 checkpoint
        ),
        ModelSpec(
            name="deepseek-v3",
            num_layers=61,  # HF config (C4)
            num_kv_heads=1,  # MLA: one shared latent per token and layer (C4 "1 head")
            head_dim=192,  # qk_nope_head_dim 128 + qk_rope_head_dim 64 (HF config)
            v_head_dim=128,  # HF config
            dtype_bytes=2,  # bf16 KV: C4's 70,272 B/token (FP8 FlashMLA would be 656 B/layer)
            mla=True,
            kv_lora_rank=512,  # HF config (C4: latent 512)
            qk_rope_head_dim=64,  # HF config (C4: rope 64)
            params=671e9,  # DeepSeek-V3 report: 671B total (MTP module excluded)
            active_params=37e9,  # DeepSeek-V3 report: 37B activated per token
            hidden_size=7168,  # HF config
            num_attention_heads=128,  # HF config
            vocab_size=129_280,  # HF config
            tie_word_embeddings=False,  # HF config
            # the released checkpoint is FP8 (block-scaled); bf16 would not fit on 8xH200
            weight_dtype_bytes=1,
        ),
    )
}


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


def weight_bytes_per_rank(model: ModelSpec, tp: int = 1) -> float:
    """Weight bytes on one rank: ``params * weight_dtype_bytes / tp``.

    **[model]** All weights are taken as evenly sharded by ``tp`` (replicated norms and, for MoE
    without expert parallelism, uneven expert placement are ignored: < 1 % of the bytes).
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    return model.params * model.weight_dtype_bytes / tp


# ---------------------------------------------------------------------------------------------
# GPUs and links
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: HBM capacity (bytes) and bandwidth (bytes/s), dense bf16 peak (FLOP/s), and the
    host link it normally comes with (a key of ``LINKS``)."""

    name: str
    hbm_bytes: float
    hbm_bw: float
    peak_flops_bf16: float
    default_link: str


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="h100-sxm",
            hbm_bytes=80e9,  # C1: 80 GB HBM3 (as the datasheet quotes it)
            hbm_bw=3.35e12,  # C1: 3.35 TB/s
            peak_flops_bf16=989e12,  # C6: 989 TFLOPS dense bf16
            default_link="pcie5-x16",  # H100 SXM hosts attach over PCIe Gen5 x16 (C2)
        ),
        GpuSpec(
            name="h200",
            hbm_bytes=141e9,  # C1: 141 GB HBM3e
            hbm_bw=4.8e12,  # C1: 4.8 TB/s
            peak_flops_bf16=989e12,  # same Hopper die as H100 SXM (C6 figure)
            default_link="pcie5-x16",  # C2: H200 spec sheets quote PCIe Gen5 128 GB/s bidir.
        ),
        GpuSpec(
            name="a100-80gb",
            hbm_bytes=80e9,  # NVIDIA A100 datasheet (not in HARDWARE.md): 80 GB HBM2e
            hbm_bw=2.039e12,  # A100 datasheet: 2,039 GB/s (SXM)
            peak_flops_bf16=312e12,  # A100 datasheet: 312 TFLOPS dense bf16
            default_link="pcie4-x16",  # A100 is a PCIe Gen4 part
        ),
        GpuSpec(
            name="gh200",
            hbm_bytes=96e9,  # C1: 96 GB HBM3 (the 144 GB HBM3e variant is not modelled)
            hbm_bw=4.0e12,  # C1: 4.0 TB/s
            peak_flops_bf16=989e12,  # Hopper die, as H100 SXM
            default_link="nvlink-c2c",  # C2: Grace-Hopper coherent NVLink-C2C
        ),
    )
}


@dataclass(frozen=True)
class LinkSpec:
    """A host<->device link: theoretical per-direction bandwidth and the usable figures for
    large pinned copies in each direction (bytes/s). The usable figures seed the shipped
    latency profiles (``hicache/profiles``); a calibrated profile supersedes them."""

    name: str
    spec_Bps: float
    h2d_Bps: float
    d2h_Bps: float


LINKS: dict[str, LinkSpec] = {
    lk.name: lk
    for lk in (
        LinkSpec(
            name="pcie4-x16",
            spec_Bps=31.5e9,  # [model] 16 GT/s x 16 lanes x 128b/130b / 8
            h2d_Bps=23e9,  # C2: Gen4 pinned H2D 22.5-23.9 GB/s (RTX 4090, cuda-oxide #976)
            d2h_Bps=25e9,  # C2: Gen4 pinned D2H 25.4-26.6 GB/s (same source)
        ),
        LinkSpec(
            name="pcie5-x16",
            spec_Bps=63e9,  # C2: 32 GT/s x 16 x 128b/130b ~ 63 GB/s per direction
            # C2 planning value 50-55 GB/s; measured H2D spans 35.2 (nvbandwidth SM copy) to
            # 54.1 (vLLM coalesced), so 50 sits inside the large-copy range
            h2d_Bps=50e9,
            d2h_Bps=53e9,  # C2: nvbandwidth device_to_host 52.8 GB/s on H100
        ),
        LinkSpec(
            name="nvlink-c2c",
            spec_Bps=450e9,  # C2: 900 GB/s total, 450 per direction
            h2d_Bps=375e9,  # C2: KTH Grace-Hopper study, measured H2D
            d2h_Bps=297e9,  # C2: same study, measured D2H
        ),
    )
}


def _lookup(table: dict[str, _T], kind: str, name: str) -> _T:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choices: {', '.join(sorted(table))}") from None


def get_model(name: str) -> ModelSpec:
    """The preset called ``name``; ``ValueError`` listing the choices otherwise."""
    return _lookup(MODELS, "model", name)


def get_gpu(name: str) -> GpuSpec:
    """The preset called ``name``; ``ValueError`` listing the choices otherwise."""
    return _lookup(GPUS, "gpu", name)


def get_link(name: str) -> LinkSpec:
    """The preset called ``name``; ``ValueError`` listing the choices otherwise."""
    return _lookup(LINKS, "link", name)


# ---------------------------------------------------------------------------------------------
# Pool sizing
# ---------------------------------------------------------------------------------------------


def device_pool_tokens(
    model: ModelSpec, gpu: GpuSpec, tp: int, mem_fraction: float, reserve_bytes: float
) -> int:
    """Device KV pool size in tokens, the way SGLang derives ``max_total_num_tokens``.

    ``floor((hbm_bytes * mem_fraction - weight_bytes_per_rank - reserve_bytes) /
    kv_bytes_per_token(model, tp))``. SGLang keeps ``1 - mem_fraction`` of HBM for activations
    and CUDA graphs and gives the rest, less the weights and whatever else is already allocated
    (``reserve_bytes``: CUDA context, workspaces), to the KV pool. **[model]** It is an estimate:
    the real figure depends on the driver's view of total memory and the runtime's own buffers,
    so the recommended input is ``gpu.device_tokens`` set to the ``max_total_num_tokens`` that
    SGLang logs at start-up. Not rounded to a page (the caller does). Raises ``ValueError`` when
    nothing is left for the KV cache.
    """
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if reserve_bytes < 0:
        raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
    weights = weight_bytes_per_rank(model, tp)
    per_token = kv_bytes_per_token(model, tp)
    free = gpu.hbm_bytes * mem_fraction - weights - reserve_bytes
    tokens = math.floor(free / per_token) if free > 0 else 0
    if tokens <= 0:
        raise ValueError(
            f"{model.name} at tp={tp} leaves no KV cache on {gpu.name}: "
            f"{gpu.hbm_bytes / 1e9:g} GB x mem_fraction {mem_fraction:g} = "
            f"{gpu.hbm_bytes * mem_fraction / 1e9:.2f} GB, weights {weights / 1e9:.2f} GB per "
            f"rank, reserve {reserve_bytes / 1e9:.2f} GB; raise tp or mem_fraction, or set "
            "gpu.device_tokens"
        )
    return tokens
