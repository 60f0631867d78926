"""Attention time of a prefill on one rank: FLOPs at a FlashAttention-3 efficiency curve.

The curve is fitted (:mod:`hicache.compute.fit`) to FlashAttention-3 forward throughput on H100
SXM, bf16, head dim 128, non-causal, measured in pytorch/benchmark PR #2391 with inputs sized
as in the FA3 paper (Shah et al., 2024, arXiv 2407.08608: batch x seq = 16 k, heads x head dim
= 2,048); HARDWARE.md C7: seq 512 -> 430 TFLOPS, 1,024 -> 517, 2,048 -> 566, 4,096 -> 590,
8,192 -> 614, 16,384 -> 621. The form is

    efficiency(L) = max_efficiency * L / (L + half_len)      (a fraction of ``peak_flops``)

where ``L`` is the number of keys each query row visits. Each thread block of the kernel loads
one tile of queries, loops over the keys and writes one output tile; the fixed part of that
work (Q load, pipeline fill, softmax epilogue, O store) is amortised over the key loop, and
``half_len`` is its fitted size in keys. The batch x seq product was fixed in the benchmark, so
the curve does not model a GPU left idle by too few query tiles (FA3 splits the key loop then).

Being a fraction of ``peak_flops``, the curve moves to another GPU with :meth:`scaled`.

Hot path: plain floats only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

#: FA3 forward, H100 SXM, bf16, head dim 128, non-causal (pytorch/benchmark PR #2391, via
#: HARDWARE.md C7): (sequence length, FLOP/s).
FA3_H100_POINTS: tuple[tuple[int, float], ...] = (
    (512, 430e12),
    (1024, 517e12),
    (2048, 566e12),
    (4096, 590e12),
    (8192, 614e12),
    (16384, 621e12),
)
#: Causal over non-causal FLOP rate of FA3 forward, head dim 128, H100 SXM5, by sequence length:
#: the bar labels of the FA3 paper's Fig. 5 (arXiv 2407.08608), with causal mask / without.
#: A check of :func:`prefill_attention_time`, not fitted.
FA3_PAPER_CAUSAL_RATIO: tuple[tuple[int, float], ...] = (
    (512, 292 / 467),
    (1024, 423 / 565),
    (2048, 521 / 625),
    (4096, 579 / 638),
    (8192, 602 / 646),
    (16384, 616 / 648),
)
#: Key-tile width of FA3's causal kernel for head dim 128: a query row on the diagonal tile
#: computes the whole tile and masks about half of it. [estimate: FA3 uses 128-wide tiles for
#: head dim 128 (arXiv 2407.08608 section 4); the exact choice varies by build]
CAUSAL_TILE = 128
#: Fixed cost of one attention kernel call: launch and tail of the last wave. [estimate,
#: similar to the ~5 us launch floor fitted for cuBLAS GEMMs on the same GPU]
ATTENTION_FLOOR_S = 5e-6


@dataclass(frozen=True)
class AttentionModel:
    """FA3-like attention throughput: ``peak_flops * efficiency(L)``, plus ``floor_s`` a call.

    ``peak_flops``: the GPU's dense 16-bit peak (FLOP/s). ``max_efficiency``: the fraction of it
    reached with very long key loops (fitted). ``half_len``: the key-loop length at which half
    of that is reached (fitted). ``causal_tile``: keys computed and masked per query on the
    diagonal. ``floor_s``: fixed cost per call.
    """

    peak_flops: float
    max_efficiency: float
    half_len: float
    causal_tile: int = CAUSAL_TILE
    floor_s: float = ATTENTION_FLOOR_S

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{f.name} must be finite and >= 0, got {v}")
        if not (self.peak_flops > 0 and 0 < self.max_efficiency <= 1):
            raise ValueError("need peak_flops > 0 and max_efficiency in (0, 1]")

    def efficiency(self, seq_len: float) -> float:
        """Fraction of ``peak_flops`` a kernel whose query rows visit ``seq_len`` keys reaches."""
        if seq_len <= 0:
            return 0.0
        return self.max_efficiency * seq_len / (seq_len + self.half_len)

    def flops_per_s(self, seq_len: float) -> float:
        return self.peak_flops * self.efficiency(seq_len)

    def scaled(self, peak_ratio: float) -> AttentionModel:
        """This curve on a GPU with ``peak_ratio`` times the dense peak (an estimate: the same
        fraction of peak at each length)."""
        if not peak_ratio > 0:
            raise ValueError(f"peak_ratio must be > 0, got {peak_ratio}")
        return replace(self, peak_flops=self.peak_flops * peak_ratio)


def prefill_attention_flops(
    new_tokens: int, cached_tokens: int, heads: int, head_dim: int, v_head_dim: int
) -> float:
    """Useful FLOPs of one layer's causal prefill attention over ``heads`` heads.

    Each of the ``new`` queries attends to the ``cached`` prefix and to the new tokens up to
    itself: ``new*cached + new*(new+1)/2`` query-key pairs, each costing ``2*head_dim`` FLOPs
    for QK^T and ``2*v_head_dim`` for PV.
    """
    pairs = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2
    return 2.0 * heads * (head_dim + v_head_dim) * pairs


def prefill_attention_time(
    new_tokens: int,
    cached_tokens: int,
    heads_per_rank: int,
    head_dim: int,
    v_head_dim: int,
    eff_model: AttentionModel,
) -> float:
    """Seconds of one layer's causal prefill attention on one rank.

    The efficiency is taken at the mean key-loop length of a query row,
    ``cached + (new + 1) / 2`` (= pairs / new): that is what amortises a thread block's fixed
    work, as the sequence length does in the non-causal benchmark. A causal kernel also
    computes the masked half of each diagonal tile, ``min(new, causal_tile) / 2`` keys per
    query (+25 % work at 512 new tokens, +3 % at 4,096). Together these make a causal prefill
    of ``L`` tokens reach 0.60, 0.74, 0.85, 0.92, 0.96 of the non-causal FLOP rate at ``L`` =
    512 ... 8,192; the FA3 paper's head-dim-128 forward figures (arXiv 2407.08608, Fig. 5,
    without and with causal mask: bar labels 467/565/625/638/646 and 292/423/521/579/602
    TFLOPS) give 0.63, 0.75, 0.83, 0.91, 0.93 (:data:`FA3_PAPER_CAUSAL_RATIO`), which were not
    used in the fit. No new tokens: 0.
    """
    if new_tokens <= 0:
        return 0.0
    mean_keys = cached_tokens + (new_tokens + 1) / 2
    masked_keys = min(new_tokens, eff_model.causal_tile) / 2
    pairs = new_tokens * (mean_keys + masked_keys)
    flops = 2.0 * heads_per_rank * (head_dim + v_head_dim) * pairs
    return eff_model.floor_s + flops / eff_model.flops_per_s(mean_keys)


__all__ = [
    "ATTENTION_FLOOR_S",
    "CAUSAL_TILE",
    "FA3_H100_POINTS",
    "FA3_PAPER_CAUSAL_RATIO",
    "AttentionModel",
    "prefill_attention_flops",
    "prefill_attention_time",
]
