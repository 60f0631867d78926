"""Transfer-time and compute-time models: the one cost rule of a copy op, prefill and decode.

Transfers (ENGINEERING.md "PCIe model"): one copy op moving ``nbytes`` in ``runs`` contiguous
pieces takes ``alpha + runs * gamma + nbytes / (beta * eta_if_coupled)``; the constants per IO
backend and direction live in a :class:`~hicache.profile.Profile` (:mod:`hicache.profile`,
re-exported here). What a HiCache op is charged is the one cost rule, :func:`op_charges`.

Compute (HARDWARE.md C6, **[model]**): a roofline. Prefill is FLOP-bound for any sizeable
extend, with a floor set by reading the weights once; decode is HBM-bound (weights + KV of the
batch) with a FLOP ceiling for large batches. Both add a fixed per-batch overhead (scheduling,
kernel launches, sampling) from the profile.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from hicache.hardware import GpuSpec, ModelSpec, kv_bytes_per_token, weight_bytes_per_rank
from hicache.profile import (
    BACKENDS,
    DIRECTIONS,
    PROFILE_DIR,
    PROFILE_VERSION,
    LinkParams,
    Profile,
    default_profile_path,
    load_profile,
    measured_profile_path,
    profile_from_dict,
    profile_to_dict,
    profile_to_json,
    save_profile,
    shipped_profile_path,
    shipped_profiles,
)

__all__ = [  # the profile names are re-exported from hicache.profile
    "BACKENDS",
    "DIRECTIONS",
    "OP_DIRECTION",
    "OP_KINDS",
    "PROFILE_DIR",
    "PROFILE_VERSION",
    "LinkParams",
    "OpCharges",
    "Profile",
    "charged_time",
    "count_runs",
    "decode_step_time",
    "default_profile_path",
    "layer_pipeline_end",
    "layer_time",
    "load_profile",
    "measured_profile_path",
    "op_charges",
    "op_time",
    "prefill_flops",
    "prefill_flops_split",
    "prefill_time",
    "profile_from_dict",
    "profile_to_dict",
    "profile_to_json",
    "save_profile",
    "shipped_profile_path",
    "shipped_profiles",
    "transfer_time",
]

# ---------------------------------------------------------------------------------------------
# Transfers
# ---------------------------------------------------------------------------------------------


def transfer_time(p: LinkParams, nbytes: int, runs: int = 1, coupled: bool = False) -> float:
    """Seconds one copy op takes: ``alpha + runs * gamma + nbytes / (beta * e)``, where ``e`` is
    ``eta`` when ``coupled`` (the opposite direction is busy for the whole op) and 1 otherwise.

    A caller whose op is coupled for only part of its life (the SimPy link) should integrate the
    rate itself; this is the closed form for the two constant cases. ``nbytes`` and ``runs``
    must be >= 0.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if runs < 0:
        raise ValueError(f"runs must be >= 0, got {runs}")
    bw = p.beta_Bps * (p.eta if coupled else 1.0)
    return p.alpha_s + runs * p.gamma_s + nbytes / bw


# ---------------------------------------------------------------------------------------------
# Compute
# ---------------------------------------------------------------------------------------------


def _attn_flops_per_pair(model: ModelSpec) -> int:
    # QK^T costs 2 * head_dim and PV 2 * v_head_dim FLOPs per (query, key) pair and head, per
    # layer: 4 * heads * head_dim when the two dims are equal
    return 2 * model.num_layers * model.num_attention_heads * (model.head_dim + model.v_head_dim)


def prefill_flops_split(
    model: ModelSpec, new_tokens: int, cached_tokens: int, tp: int = 1
) -> tuple[float, float]:
    """(linear, attention) FLOPs on one rank to extend one request by ``new_tokens`` on top of
    ``cached_tokens`` already in the KV cache. **[model]**, after HARDWARE.md C6 (Mooncake eq. 1):

    * linear: ``2 * body_active_params * new_tokens`` plus the LM head for one position,
      ``2 * vocab * hidden`` (SGLang computes logits only for the last position of an extend;
      the embedding lookup is a gather). Counting the embeddings per token, as ``2 *
      active_params * n`` would, overstates Llama-3-8B by 15 %.
    * attention (causal, QK^T and PV): ``2 * layers * heads * (head_dim + v_head_dim) *
      (new * cached + new * (new + 1) / 2)``, i.e. ``4 * layers * heads * head_dim * ...`` for
      the usual equal dims. Mooncake's ``a = 4`` counts the full square; a causal kernel skips
      the upper triangle.

    Both are divided by ``tp`` (all-reduce time is not modelled). For a batch, sum per request.
    """
    if new_tokens < 0 or cached_tokens < 0:
        raise ValueError(f"token counts must be >= 0, got new={new_tokens} cached={cached_tokens}")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if new_tokens == 0:
        return 0.0, 0.0
    n, p = float(new_tokens), float(cached_tokens)
    linear = 2.0 * model.body_active_params * n + 2.0 * model.vocab_size * model.hidden_size
    attention = _attn_flops_per_pair(model) * (n * p + n * (n + 1) / 2)
    return linear / tp, attention / tp


def prefill_flops(model: ModelSpec, new_tokens: int, cached_tokens: int, tp: int = 1) -> float:
    """Total FLOPs of :func:`prefill_flops_split` (linear + causal attention), per rank."""
    linear, attention = prefill_flops_split(model, new_tokens, cached_tokens, tp)
    return linear + attention


def prefill_time(
    model: ModelSpec,
    gpu: GpuSpec,
    profile: Profile,
    reqs: Sequence[tuple[int, int]],
    tp: int = 1,
) -> float:
    """Seconds for one prefill batch; ``reqs`` holds ``(new_tokens, cached_tokens)`` per request.

    **[model]** roofline: ``max(compute, memory) + prefill_overhead_s`` where
    ``compute = sum(linear) / (peak * mfu) + sum(attention) / (peak * mfu * attn_efficiency)``
    (FLOPs from :func:`prefill_flops_split`) and ``memory`` is reading the weights once plus the
    KV of every request's cached and new tokens, at ``hbm_bw * decode_hbm_efficiency``. The
    memory floor only matters for small extends (a request that is almost all cache hit costs
    at least one pass over the weights, ~6 ms for Llama-3-8B on an H100). An empty batch takes 0.
    """
    if not reqs:
        return 0.0
    linear = attention = 0.0
    kv_tokens = 0
    for new, cached in reqs:
        lin, att = prefill_flops_split(model, new, cached, tp)
        linear += lin
        attention += att
        kv_tokens += new + cached
    peak = gpu.peak_flops_bf16 * profile.mfu
    compute = linear / peak + attention / (peak * profile.attn_efficiency)
    nbytes = weight_bytes_per_rank(model, tp) + kv_bytes_per_token(model, tp) * kv_tokens
    memory = nbytes / (gpu.hbm_bw * profile.decode_hbm_efficiency)
    return max(compute, memory) + profile.prefill_overhead_s


def layer_time(
    model: ModelSpec,
    gpu: GpuSpec,
    profile: Profile,
    reqs: Sequence[tuple[int, int]],
    tp: int = 1,
) -> float:
    """``prefill_time / num_layers``: one layer's share, for the layer-wise load pipeline."""
    return prefill_time(model, gpu, profile, reqs, tp) / model.num_layers


def decode_step_time(
    model: ModelSpec,
    gpu: GpuSpec,
    profile: Profile,
    batch_size: int,
    kv_tokens_total: int,
    tp: int = 1,
) -> float:
    """Seconds for one decode step of ``batch_size`` requests holding ``kv_tokens_total`` KV
    tokens between them (the KV every request reads this step).

    **[model]** roofline: ``max(memory, compute) + decode_overhead_s`` with
    ``memory = (weight_bytes_per_rank + kv_bytes_per_token(model, tp) * kv_tokens_total) /
    (hbm_bw * decode_hbm_efficiency)`` and ``compute`` the FLOPs of one new token per request
    (:func:`prefill_flops_split` with ``new = 1``) at ``peak * mfu``. Decode is memory-bound
    until batches of a few hundred; the compute ceiling keeps very large batches honest. For MoE
    models all weights are read every step (true once the batch touches every expert; an upper
    bound for small batches). ``batch_size == 0`` takes 0.
    """
    if batch_size < 0 or kv_tokens_total < 0:
        raise ValueError(
            f"batch_size and kv_tokens_total must be >= 0, got {batch_size}, {kv_tokens_total}"
        )
    if batch_size == 0:
        return 0.0
    nbytes = weight_bytes_per_rank(model, tp) + kv_bytes_per_token(model, tp) * kv_tokens_total
    memory = nbytes / (gpu.hbm_bw * profile.decode_hbm_efficiency)
    lin_one, _ = prefill_flops_split(model, 1, 0, tp)
    attention = _attn_flops_per_pair(model) * kv_tokens_total / tp
    peak = gpu.peak_flops_bf16 * profile.mfu
    compute = batch_size * lin_one / peak + attention / (peak * profile.attn_efficiency)
    return max(memory, compute) + profile.decode_overhead_s


def layer_pipeline_end(
    batch_start: float,
    compute_total: float,
    num_layers: int,
    load_start: float,
    load_end: float,
) -> float:
    """When a prefill batch whose KV is loaded layer by layer from host finishes.

    The load delivers layer ``i`` (1..L) at ``ld_i = load_start + i * (load_end - load_start) /
    L``; layer ``i`` computes for ``c = compute_total / L`` once its KV has arrived and layer
    ``i - 1`` has finished (layer 0 "finishes" at ``batch_start``). So ``f_i = max(f_{i-1},
    ld_i) + c`` and, unrolled, ``f_L = max(batch_start + L*c, max_i(ld_i + (L - i + 1) * c))``.
    The inner term is linear in ``i``, so its maximum is at ``i = 1`` or ``i = L``: the batch
    ends at ``max(batch_start + compute_total, load_start + (load_end - load_start) / L +
    compute_total, load_end + c)``. Needs ``num_layers >= 1``, ``compute_total >= 0`` and
    ``load_end >= load_start``; the load may start before the batch.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if compute_total < 0:
        raise ValueError(f"compute_total must be >= 0, got {compute_total}")
    if load_end < load_start:
        raise ValueError(f"load_end ({load_end}) is before load_start ({load_start})")
    c = compute_total / num_layers
    first_layer_loaded = load_start + (load_end - load_start) / num_layers
    return max(batch_start + compute_total, first_layer_loaded + compute_total, load_end + c)


# ---------------------------------------------------------------------------------------------
# HiCache copy ops (what the simulator charges and what replay predicts)
# ---------------------------------------------------------------------------------------------


#: the two kinds of HiCache copy op: a node's device->host backup, a batch's merged load
OP_KINDS = ("write", "load")
OP_DIRECTION = {"write": "d2h", "load": "h2d"}


def count_runs(device_pages: Sequence[int], host_pages: Sequence[int]) -> int:
    """Contiguous runs of a paired page copy: a new run starts wherever either side is not the
    previous page + 1 (one ``cudaMemcpyAsync`` per run and layer for ``direct`` IO). This is
    the ``runs`` that :func:`op_charges` charges ``gamma`` for."""
    n = len(device_pages)
    if n != len(host_pages):
        raise ValueError(f"page lists differ in length: {n} device vs {len(host_pages)} host")
    if not n:
        return 0
    runs = 1
    for i in range(1, n):
        if device_pages[i] != device_pages[i - 1] + 1 or host_pages[i] != host_pages[i - 1] + 1:
            runs += 1
    return runs


class OpCharges(NamedTuple):
    """What one copy op is charged: ``n_alpha`` fixed costs, ``n_gamma`` per-run costs and
    ``nbytes`` at the link's bandwidth."""

    n_alpha: int
    n_gamma: int
    nbytes: int


def op_charges(kind: str, nbytes: int, runs: int, layers: int) -> OpCharges:
    """THE cost rule of a HiCache copy op (the simulator, the bench rows, the calibration fit
    and the replay's predictions all use it).

    * ``"write"``: one device->host backup of a node is a single op for all layers (``alpha``
      once); the KV of each contiguous run of pages is copied per layer (``gamma`` per run per
      layer, ~0 for the kernel backend);
    * ``"load"``: a batch's merged host->device load is issued layer by layer (``alpha`` per
      layer), ``gamma`` per run per layer.
    """
    if kind == "write":
        return OpCharges(1, runs * layers, nbytes)
    if kind == "load":
        return OpCharges(layers, runs * layers, nbytes)
    raise ValueError(f"unknown op kind {kind!r}; expected one of {', '.join(OP_KINDS)}")


def charged_time(alpha_s: Any, gamma_s: Any, beta_Bps: Any, c: OpCharges) -> Any:
    """Seconds for charges ``c``: ``n_alpha * alpha + n_gamma * gamma + nbytes / beta``
    (element-wise when the arguments are arrays, as in a least-squares fit)."""
    return c.n_alpha * alpha_s + c.n_gamma * gamma_s + c.nbytes / beta_Bps


def op_time(link: LinkParams, c: OpCharges) -> float:
    """Uncoupled seconds of an op with charges ``c`` on ``link`` (one backend, one direction)."""
    return float(charged_time(link.alpha_s, link.gamma_s, link.beta_Bps, c))
