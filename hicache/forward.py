"""One forward pass of any model on one tensor-parallel rank: prefill and decode, op by op.

The operator times come from :mod:`hicache.compute` (GEMMs and memory-bound ops fitted to
measured H100 tables, FA3 attention efficiency, NCCL all-reduce); this module says which ops a
model runs (from its :class:`~hicache.models.ModelSpec`, i.e. its HF ``config.json``) and adds
the host-side overheads of the latency :class:`~hicache.profile.Profile`.

Per layer and rank, for ``T`` tokens in the pass:

* **attention projections**: GQA/MHA: norm, fused QKV GEMM, RoPE, output GEMM (KV heads are
  split by ``tp`` and replicated once ``tp`` exceeds them, as SGLang does). MLA (DeepSeek):
  the latent down-projections (replicated, ``hidden -> q_lora_rank + kv_lora_rank + rope``),
  the query and KV up-projections (column-parallel) and the output GEMM; **[model]** the KV
  up-projection is charged for the new tokens only (SGLang's prefill also expands the cached
  prefix's latents, which this ignores).
* **MLP**: dense: up (gate+up when gated), activation, down, width split by ``tp``. MoE: the
  router GEMM, then the experts as separate GEMM pairs: **[model]** with uniform routing,
  ``T`` tokens x ``k`` experts each hit ``E * (1 - (1 - k/E)^T)`` distinct experts on
  average, each with ``T k / hit`` tokens; expert width split by ``tp`` (SGLang's default
  tensor-parallel MoE) or, with ``--ep-size`` = ``tp``, ``E / ep`` whole experts per rank on
  ``T k / ep`` rows (:func:`mlp_block_ops`); plus the shared experts as a dense MLP. At
  decode batch 1 this reads only the ``k`` active experts' weights; at large batches all of
  them. Fitted to published fused-MoE kernel timings (``hicache/data/moe_kernels/``,
  ``bench/moe_kernels.py``): each MoE layer also pays :data:`MOE_FIXED_S` for the fused-MoE
  path's other kernels, and the expert GEMMs run at the 16-bit FLOP rate even with FP8
  weights (:data:`MOE_FP8_FLOP_SCALE`).
* **attention kernel**: prefill: causal FA3 per request over its cached prefix
  (:func:`hicache.compute.prefill_attention_time`); decode: reading every request's KV at
  ``hbm_bw * decode_hbm_efficiency`` plus the kernel's fixed cost.
* **all-reduce**: two per layer under TP (after attention and after the MLP), of ``T x
  hidden`` 16-bit activations.

Outside the layers: the embedding gather and the LM head for one position per request
(SGLang computes logits only for the last token of an extend). Overheads: ``prefill_forward_s``
or ``decode_forward_s`` per pass, ``request_s`` per request of a prefill batch, ``sampling_s``
per pass, and under TP with a host tier SGLang's HiCache completion checks, ``hicache_check_s``
each, as many per prefill pass and per decode step as the version runs (:func:`hicache_checks`).
``gemm_scale`` scales the GEMM and memory-bound ops.

Standard library only (the fitted models are plain floats).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hicache.compute import (
    CUSTOM_AR_MAX_BYTES,
    SGLANG_CUSTOM_AR_H100,
    AllReduceModel,
    AttentionModel,
    CustomAllReduce,
    GemmModel,
    LayerOp,
    load_compute,
    prefill_attention_time,
)
from hicache.compute.gemm import GEMM_DTYPE_BYTES
from hicache.compute.layer import mlp_ops
from hicache.hardware import GpuSpec, get_gpu
from hicache.models import ModelSpec, kv_bytes_per_token
from hicache.profile import Profile

#: the GPU whose measured tables the compute models were fitted to
TABLE_GPU = "h100-sxm"
#: bytes per activation element (16-bit) for norms, all-reduce and the embedding gather
ACT_BYTES = 2


@dataclass(frozen=True)
class Breakdown:
    """Seconds of one forward pass on one rank, by part. ``linear_s``: all layers' non-attention
    ops (norms, projections, RoPE, MLP or experts, activation, residual adds); ``attention_s``:
    the attention kernels; ``allreduce_s``: the tensor-parallel all-reduces; ``lm_head_s``: the
    embedding gather and the LM head; ``overhead_s``: the host-side fixed costs."""

    layers: int
    linear_s: float
    attention_s: float
    allreduce_s: float
    lm_head_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return (
            self.linear_s + self.attention_s + self.allreduce_s + self.lm_head_s + self.overhead_s
        )

    def as_dict(self) -> dict[str, float]:
        """The parts and ``total_s``, JSON-ready."""
        return {
            "layers": self.layers,
            "linear_s": self.linear_s,
            "attention_s": self.attention_s,
            "allreduce_s": self.allreduce_s,
            "lm_head_s": self.lm_head_s,
            "overhead_s": self.overhead_s,
            "total_s": self.total_s,
        }


class Op(NamedTuple):
    """One op of a layer on a rank. ``groups`` > 1: a grouped GEMM (SGLang's fused MoE kernel)
    multiplying ``m`` rows in all through ``groups`` different ``k x n`` weight matrices (the
    experts hit), in one launch."""

    op: LayerOp
    groups: float = 1.0


def _g(name: str, m: float, n: int, k: int, groups: float = 1.0) -> Op:
    return Op(LayerOp(name, m, n, k, 0), groups)


#: **[model]** rows a fused-MoE kernel tile covers per expert: each expert's rows are padded
#: to a multiple of it (SGLang's Triton fused_moe configs use BLOCK_SIZE_M 16-64 on H100)
MOE_ROW_BLOCK = 64
#: Seconds each MoE layer pays on top of its expert GEMMs and activation: the fused-MoE path's
#: other kernels (top-k selection, ``moe_align_block_size``'s sort by expert, the top-k sum of
#: the outputs; FP8's activation quantization). **[model]** fitted, the one free parameter, to
#: the published kernel timings of ``hicache/data/moe_kernels/moe_kernels.json`` (the series
#: timed under CUDA-graph replay: vLLM PR #24700 on H100, sglang PR #11730 on H200; 40 points,
#: E 8-128, N 192-7,168): the value on a 0.5 us grid that minimises the median absolute log
#: error of :func:`fused_moe_time` (``bench/moe_kernels.py --fit`` recomputes it). At M <= 4
#: tokens the weight reads are 4-15 us on those shapes, so the measured 30-45 us floors fix it.
MOE_FIXED_S = 14e-6
#: FLOP rate of the expert GEMMs relative to the 16-bit rate when the weights are FP8.
#: **[model]** 1: the Triton fused-MoE kernel with FP8 weights is not measured faster per FLOP
#: than with 16-bit ones: Qwen3-30B-A3B FP8 on H100 (vLLM PR #24700) takes 1,648 us at 4,096
#: tokens where the 16-bit rate alone would allow ~740 us, and vLLM PR #35457 (H200, E=128,
#: N=96) measures FP8 only 10-17 % faster than BF16, both tuned. FP8 still halves the bytes.
MOE_FP8_FLOP_SCALE = 1.0


def gemm_time(
    gemm: GemmModel,
    m: float,
    n: int,
    k: int,
    groups: float = 1.0,
    weight_bytes: float = GEMM_DTYPE_BYTES,
    flop_scale: float = 1.0,
) -> float:
    """Seconds of ``[m x k] @ [k x n]``, or of a grouped GEMM: ``m`` rows in all over
    ``groups`` weight matrices (the experts hit), in one launch.

    :meth:`GemmModel.time`'s form (one group of 16-bit weights is exactly it): one launch, the
    FLOPs of every row at ``flop_scale`` times the fitted rate (2 for FP8 on a GPU with FP8
    tensor cores), one tile overhead, and the bytes of every group's weights at
    ``weight_bytes`` each plus the 16-bit activations. **[model]** For groups, each expert's
    rows are padded to :data:`MOE_ROW_BLOCK` (uniform routing: ``m / groups`` rows each).
    """
    if m <= 0 or groups <= 0:
        return 0.0
    rows = m if groups == 1.0 else groups * math.ceil(m / groups / MOE_ROW_BLOCK) * MOE_ROW_BLOCK
    t_flop = 2.0 * k * (rows * n + gemm.tile_overhead) / (gemm.peak_flops * flop_scale)
    t_mem = (weight_bytes * groups * k * n + GEMM_DTYPE_BYTES * (m * k + m * n)) / gemm.hbm_Bps
    return gemm.launch_s + math.hypot(t_flop, t_mem)


def _e(name: str, nbytes: float) -> Op:
    return Op(LayerOp(name, 0, 0, 0, nbytes))


def attention_projection_ops(model: ModelSpec, tp: int, t: int) -> list[Op]:
    """The input norm and the attention projections of one layer for ``t`` tokens on a rank."""
    h, b = model.hidden_size, ACT_BYTES
    heads = model.num_attention_heads // tp
    ops = [_e("input_layernorm", 2 * t * h * b)]
    if model.mla:
        rope, nope, v = model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim
        latent = model.kv_lora_rank + rope
        if model.q_lora_rank:
            ops.append(_g("attn_a_proj", t, model.q_lora_rank + latent, h))
            ops.append(_g("attn_q_b_proj", t, heads * (nope + rope), model.q_lora_rank))
        else:
            ops.append(_g("attn_kv_a_proj", t, latent, h))
            ops.append(_g("attn_q_proj", t, heads * (nope + rope), h))
        ops.append(_g("attn_kv_b_proj", t, heads * (nope + v), model.kv_lora_rank))
        ops.append(_e("attn_rope", 2 * t * (heads + 1) * rope * b))
        ops.append(_g("attn_post_proj", t, h, heads * v))
        return ops
    kv = max(1, model.num_kv_heads // tp)  # replicated once tp exceeds the KV heads
    hd = model.head_dim
    ops.append(_g("attn_pre_proj", t, (heads + 2 * kv) * hd, h))
    ops.append(_e("attn_rope", 2 * t * (heads + kv) * hd * b))
    ops.append(_g("attn_post_proj", t, h, heads * model.v_head_dim))
    return ops


def expected_experts_hit(experts: int, top_k: float, tokens: float) -> float:
    """Expected number of distinct experts ``tokens`` tokens route to, ``top_k`` each, when
    every expert is equally likely: ``E * (1 - (1 - k/E)^T)`` (**[model]**: real routers are
    skewed, which hits fewer experts)."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - float((1.0 - top_k / experts) ** tokens))


def routed_expert_ops(
    hidden: int, width: int, gated: bool, experts: int, top_k: float, t: int
) -> list[Op]:
    """The routed experts of one MoE layer for ``t`` tokens on a rank, ``width`` columns
    each: the grouped up GEMM over the experts hit, the activation, the grouped down GEMM.
    Under expert parallelism ``experts`` is the rank's local experts and ``top_k`` the routed
    rows per token that land on them (``k / ep`` on average: :func:`mlp_block_ops`)."""
    hit = expected_experts_hit(experts, top_k, t)
    return [  # t*k routed rows over `hit` experts
        Op(o._replace(name=f"expert_{o.name}"), 1.0 if o.nbytes else hit)
        for o in mlp_ops(hidden, width, gated, t * top_k, ACT_BYTES)
    ]


def op_time(gemm: GemmModel, o: Op, weight_bytes: float, flop_scale: float) -> float:
    """Seconds of one op of a layer (:func:`gemm_time` or a memory-bound op); the routed
    experts' GEMMs at :data:`MOE_FP8_FLOP_SCALE` where ``flop_scale`` is FP8's."""
    op = o.op
    if op.nbytes:
        return gemm.elementwise_time(op.nbytes)
    if op.name.startswith("expert_") and flop_scale != 1.0:
        flop_scale = MOE_FP8_FLOP_SCALE
    return gemm_time(gemm, op.m, op.n, op.k, o.groups, weight_bytes, flop_scale)


def fused_moe_time(
    gemm: GemmModel,
    hidden: int,
    width: int,
    experts: int,
    top_k: int,
    tokens: int,
    weight_bytes: float = GEMM_DTYPE_BYTES,
    flop_scale: float = 1.0,
    gated: bool = True,
) -> float:
    """Seconds of one fused-MoE call as the kernel benchmarks time it (no router GEMM, no
    shared experts): :data:`MOE_FIXED_S` plus :func:`routed_expert_ops`. The forward model
    charges exactly this per MoE layer (:meth:`ForwardModel.linear_s`)."""
    if tokens <= 0:
        return 0.0
    ops = routed_expert_ops(hidden, width, gated, experts, top_k, tokens)
    return MOE_FIXED_S + sum(op_time(gemm, o, weight_bytes, flop_scale) for o in ops)


def mlp_block_ops(model: ModelSpec, tp: int, t: int, moe: bool, ep: int = 1) -> list[Op]:
    """The post-attention norm, the MLP (dense or MoE) and the residual add for ``t`` tokens.

    ``ep`` > 1 (SGLang's ``--ep-size``, equal to ``tp``): each rank holds ``E / ep`` whole
    experts (``intermediate_size / (tp / ep)`` columns, fused_moe_triton/layer.py:390-428) and
    runs them on the tokens routed to them, ``t k / ep`` rows on average under uniform routing
    (**[model]**, as for TP), every rank having every token (the standard dispatcher; the
    all-reduce after the MLP is the same as under TP). The router and the shared experts stay
    as under TP (**[model]**)."""
    h, b, gated = model.hidden_size, ACT_BYTES, model.gated_mlp
    ops = [_e("post_attention_layernorm", 2 * t * h * b)]
    if not moe:
        ops += [Op(o) for o in mlp_ops(h, model.intermediate_size // tp, gated, t, b)]
    else:
        e, k = model.num_experts, model.experts_per_token
        ops.append(_g("moe_router", t, e, h))
        width = model.expert_intermediate_size // (tp // ep)
        ops += routed_expert_ops(h, width, gated, e // ep, k / ep, t)
        if model.shared_expert_intermediate_size:
            shared = model.shared_expert_intermediate_size // tp
            for o in mlp_ops(h, shared, gated, t, b):
                ops.append(Op(o._replace(name=f"shared_{o.name}")))
    ops.append(_e("add", 3 * t * h * b))
    return ops


def layer_ops(model: ModelSpec, tp: int, t: int, moe: bool, ep: int = 1) -> list[Op]:
    """Every linear op of one (dense or MoE) layer for ``t`` tokens on one rank."""
    return attention_projection_ops(model, tp, t) + mlp_block_ops(model, tp, t, moe, ep)


@dataclass
class ForwardModel:
    """Prefill and decode passes of ``model`` at tensor parallelism ``tp`` on ``gpu``.

    Built by :func:`forward_model`. The per-token-count linear times are memoized (a simulation
    asks for the same batch sizes again and again).
    """

    model: ModelSpec
    tp: int
    gpu: GpuSpec
    gemm: GemmModel
    attention: AttentionModel
    all_reduce: AllReduceModel
    profile: Profile
    custom_all_reduce: CustomAllReduce = field(
        default_factory=lambda: CustomAllReduce(SGLANG_CUSTOM_AR_H100)
    )
    #: host-side seconds added to every prefill pass and every decode step (the HiCache
    #: completion checks, :func:`hicache_checks`)
    prefill_checks_s: float = 0.0
    decode_checks_s: float = 0.0
    #: SGLang's ``--ep-size`` (1, or ``tp``): the MoE layers' expert parallelism
    ep: int = 1
    _linear_memo: dict[int, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        m, tp = self.model, self.tp
        if m.num_attention_heads % tp:
            raise ValueError(
                f"tp={tp} does not split {m.name}'s {m.num_attention_heads} attention heads"
            )
        self._kv_layer_bytes = kv_bytes_per_token(m, tp) / m.num_layers
        self._heads = m.num_attention_heads // tp
        self._qk_dim = m.head_dim
        self._kv_bw = self.gpu.hbm_bw * self.profile.decode_hbm_efficiency
        # **[model]** 8-bit weights are FP8 (W8A8): twice the FLOP rate where the GPU has FP8
        # tensor cores; other widths (4-bit AWQ/GPTQ) compute in 16 bits and only read less
        w = m.weight_dtype_bytes
        fp8 = w == 1 and self.gpu.peak_flops_fp8 > 0
        self._weight_bytes = float(w)
        self._flop_scale = self.gpu.peak_flops_fp8 / self.gpu.peak_flops_bf16 if fp8 else 1.0
        if tp > 1:  # an unmeasured worker count fails here, not mid-run
            self.all_reduce.time(1.0, tp)
            self.custom_all_reduce.time(1.0, tp)

    # --- parts ------------------------------------------------------------------------------
    def _ops_time(self, ops: Sequence[Op]) -> float:
        return sum(op_time(self.gemm, o, self._weight_bytes, self._flop_scale) for o in ops)

    def _all_reduce(self, nbytes: float) -> float:
        """One all-reduce of ``nbytes`` per rank as SGLang runs it: its custom all-reduce
        below :data:`~hicache.compute.CUSTOM_AR_MAX_BYTES`, NCCL above."""
        if nbytes < CUSTOM_AR_MAX_BYTES:
            return self.custom_all_reduce.time(nbytes, self.tp)
        return self.all_reduce.time(nbytes, self.tp)

    def linear_s(self, tokens: int) -> float:
        """All layers' non-attention ops for a pass of ``tokens`` tokens (``gemm_scale``d)."""
        got = self._linear_memo.get(tokens)
        if got is None:
            m = self.model
            dense = (
                self._ops_time(layer_ops(m, self.tp, tokens, moe=False)) if m.dense_layers else 0.0
            )
            moe = (
                self._ops_time(layer_ops(m, self.tp, tokens, moe=True, ep=self.ep)) + MOE_FIXED_S
                if m.moe_layers and tokens > 0
                else 0.0
            )
            got = (m.dense_layers * dense + m.moe_layers * moe) * self.profile.gemm_scale
            self._linear_memo[tokens] = got
        return got

    def allreduce_s(self, tokens: int, positions: int) -> float:
        """Tensor-parallel collectives of a pass of ``tokens`` tokens with logits for
        ``positions`` rows (0 at ``tp`` 1): two all-reduces per layer (after attention and
        after the MLP) and one after the vocab-parallel embedding, of the 16-bit activations;
        and the all-gather of the logits, **[model]** charged as half an all-reduce of the
        gathered bytes (an all-gather moves half the data)."""
        if self.tp == 1 or tokens <= 0:
            return 0.0
        act = tokens * self.model.hidden_size * ACT_BYTES
        logits = positions * self.model.vocab_size * ACT_BYTES
        layers = 2 * self.model.num_layers + 1
        return layers * self._all_reduce(act) + 0.5 * self._all_reduce(logits)

    def lm_head_s(self, tokens: int, positions: int) -> float:
        """The embedding gather of ``tokens`` tokens and the LM head for ``positions`` rows
        (16-bit weights in every checkpoint)."""
        m = self.model
        gather = self.gemm.elementwise_time(2 * tokens * m.hidden_size * ACT_BYTES)
        head = self.gemm.time(positions, math.ceil(m.vocab_size / self.tp), m.hidden_size)
        return (gather + head) * self.profile.gemm_scale

    def _attention_one(self, new: int, cached: int) -> float:
        """One layer's prefill attention for one request: the causal FLOPs at the FA3 curve,
        or reading its whole KV (prefix and new) once, whichever is longer (a short extend on
        a long prefix is bound by the read, as decode is)."""
        att = self.attention
        flops = prefill_attention_time(new, cached, self._heads, self._qk_dim,
                                       self.model.v_head_dim, att)  # fmt: skip
        read = att.floor_s + (new + cached) * self._kv_layer_bytes / self._kv_bw
        return max(flops, read)

    # --- passes -----------------------------------------------------------------------------
    def prefill(self, reqs: Sequence[tuple[int, int]]) -> Breakdown:
        """One prefill pass; ``reqs`` holds ``(new_tokens, cached_tokens)`` per request."""
        live = [(n, c) for n, c in reqs if n > 0]
        if not live:
            return Breakdown(self.model.num_layers, 0.0, 0.0, 0.0, 0.0, 0.0)
        t = sum(n for n, _ in live)
        layers = self.model.num_layers
        attention = layers * sum(self._attention_one(n, c) for n, c in live)
        linear, allreduce = self.linear_s(t), self.allreduce_s(t, len(live))
        head = self.lm_head_s(t, len(live))
        p = self.profile
        # the eager launches overlap the GPU work: only what the GPU does not cover shows
        gpu = linear + attention + allreduce + head
        launch = max(0.0, p.prefill_forward_s - gpu)
        overhead = launch + p.request_s * len(live) + p.sampling_s + self.prefill_checks_s
        return Breakdown(layers, linear, attention, allreduce, head, overhead)

    def decode(self, batch: int, kv_tokens: int) -> Breakdown:
        """One decode step of ``batch`` requests holding ``kv_tokens`` KV tokens between them
        (each reads its whole KV once). Linear in ``kv_tokens`` for a given ``batch``."""
        if batch <= 0:
            return Breakdown(self.model.num_layers, 0.0, 0.0, 0.0, 0.0, 0.0)
        layers = self.model.num_layers
        attention = layers * (
            self.attention.floor_s + kv_tokens * self._kv_layer_bytes / self._kv_bw
        )
        p = self.profile
        return Breakdown(
            layers,
            self.linear_s(batch),
            attention,
            self.allreduce_s(batch, batch),
            self.lm_head_s(batch, batch),
            p.decode_forward_s + p.sampling_s + self.decode_checks_s,
        )

    def prefill_time(self, reqs: Sequence[tuple[int, int]]) -> float:
        return self.prefill(reqs).total_s

    def decode_time(self, batch: int, kv_tokens: int) -> float:
        return self.decode(batch, kv_tokens).total_s


def compute_models_for(gpu: GpuSpec) -> tuple[GemmModel, AttentionModel, AllReduceModel]:
    """The operator models of ``gpu``: those fitted to the H100 SXM tables (:data:`TABLE_GPU`),
    scaled for another GPU **[model]**: FLOP rates by its dense 16-bit peak over the H100's,
    bandwidths by its HBM bandwidth over the H100's; the all-reduce keeps the DGX H100
    (NVSwitch) figures."""
    ref = get_gpu(TABLE_GPU)
    comp = load_compute(TABLE_GPU)
    gemm, attention = comp.gemm, comp.attention
    if gpu.name != TABLE_GPU:
        peak, bw = gpu.peak_flops_bf16 / ref.peak_flops_bf16, gpu.hbm_bw / ref.hbm_bw
        gemm, attention = gemm.scaled(peak, bw), attention.scaled(peak)
    return gemm, attention, comp.all_reduce


#: SGLang's HiCache completion checks per scheduler iteration under TP: each a blocking CPU
#: all-reduce over the TP group (none at tp 1, where ``_all_reduce_attn_groups`` skips it).
#: version -> (per prefill pass, per decode step, added to each with an L3 store).
#:
#: * 0.5.14: ``check_hicache_events`` (scheduler.py:2731-2732, every iteration) runs
#:   ``writing_check`` and ``loading_check``, one all-reduce each (hiradix_cache.py:907-960,
#:   1281-1285), and with L3 ``drain_storage_control_queues`` one more (1292-1306); a decode
#:   iteration adds ``flush_write_through_acks``' ``writing_check`` (scheduler.py:3005-3007).
#:   sglang PR #30511 counts the four of a decode step with storage.
#: * 0.5.23: one merged all-reduce of the write/load ack counts and the storage queue sizes
#:   (``_sync_hicache_ready_counts``, unified_radix_cache.py:3412-3460, from
#:   ``check_hicache_events`` 3651-3682); the decode path checks nothing (scheduler.py
#:   4459-4552).
#:
#: Not here (per request, not per pass; charged by the scheduler as they happen, one
#: ``sim.costs.Costs.tp_sync_s`` each, counted in the cache's ``prefetch_tp_votes``): the
#: prefetch checks of the requests the admission loop reaches (0.5.14 ``can_terminate_prefetch``
#: under wait_complete/timeout, hiradix_cache.py:1324-1357, and the completed-token MIN at
#: termination, 1388-1393; 0.5.23 ``_can_terminate_prefetch`` under timeout,
#: unified_radix_cache.py:2295-2311) and a PD decode server's L3 hit-count query (2072-2076).
HICACHE_CHECKS: dict[str, tuple[int, int, int]] = {"0.5.14": (2, 3, 1), "0.5.23": (1, 1, 0)}


def hicache_checks(version: str, tp: int, host_tier: bool, storage: bool) -> tuple[int, int]:
    """The HiCache completion checks (``hicache_check_s`` each) of one prefill pass and of one
    decode step under SGLang ``version`` (:data:`HICACHE_CHECKS`); ``(0, 0)`` at tp 1 or
    without a host tier."""
    if version not in HICACHE_CHECKS:
        raise ValueError(f"no HiCache check count for SGLang {version}: {sorted(HICACHE_CHECKS)}")
    if tp <= 1 or not host_tier:
        return 0, 0
    prefill, decode, l3 = HICACHE_CHECKS[version]
    extra = l3 if storage else 0
    return prefill + extra, decode + extra


def forward_model(
    model: ModelSpec,
    gpu: GpuSpec | str,
    tp: int,
    profile: Profile,
    checks: tuple[int, int] = (0, 0),
    ep: int = 1,
) -> ForwardModel:
    """The forward model of ``model`` on ``gpu`` at ``tp``, with ``profile``'s overheads and
    ``gemm_scale`` (:func:`compute_models_for` says where the operator times come from).
    ``checks``: the HiCache completion checks per prefill pass and per decode step
    (:func:`hicache_checks`), ``hicache_check_s`` each. ``ep``: SGLang's ``--ep-size``
    (:func:`mlp_block_ops`).

    Quantized weights (``weight_dtype_bytes`` < 2) are read at their width; 8-bit ones run
    at the GPU's FP8 rate where it has FP8 tensor cores (:class:`ForwardModel`).
    """
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    gemm, attention, all_reduce = compute_models_for(g)
    each = profile.hicache_check_s
    return ForwardModel(model, tp, g, gemm, attention, all_reduce, profile,
                        prefill_checks_s=checks[0] * each,
                        decode_checks_s=checks[1] * each, ep=ep)  # fmt: skip
