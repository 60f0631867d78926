"""Time of one GEMM and of one memory-bound op on one GPU, fitted to measured H100 op times.

The GEMM model (fitted in :mod:`hicache.compute.fit` to the Vidur per-op tables,
``hicache/data/vidur/``) for ``[m x k] @ [k x n]`` in 16-bit floats::

    t = launch_s + hypot(t_flop, t_mem)
    t_flop = 2 * k * (m * n + tile_overhead) / peak_flops
    t_mem  = 2 * (k * n + m * k + m * n) / hbm_Bps

``t_flop`` is the FLOP time at an efficiency ``m*n / (m*n + tile_overhead)`` that rises with
the output size towards the fitted ``peak_flops``: a GEMM is computed tile by tile, one wave of
output tiles per pass over the SMs, and a small output leaves SMs idle and pays the pipeline
fill of each tile over the whole K loop. ``tile_overhead`` (output elements) is the fitted size
of that fixed cost. ``t_mem`` is the time to read the weights and the activations and write the
output once at the fitted HBM bandwidth. Their quadrature sum is a smooth maximum: the two
overlap, but not perfectly, near the ridge (a free exponent fitted to 1.2-1.6 and moved between
folds; 2 keeps the bandwidth physical, under the 3.35 TB/s nominal). Below ~64 tokens the time
is flat, set by reading the weights, as measured.

Memory-bound ops (norms, RoPE, activation, residual add) take
``elem_launch_s + nbytes / elem_Bps`` for the bytes they read plus write.

Hot path: plain floats and ``math`` only (called per layer per batch in a simulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

#: Bytes per GEMM element: Vidur profiled fp16 (dense tensor peak equal to bf16 on Hopper).
GEMM_DTYPE_BYTES = 2


@dataclass(frozen=True)
class GemmModel:
    """Fitted coefficients of one GPU's GEMM and memory-bound op times (SI units).

    ``launch_s``: fixed cost of one GEMM (launch, prologue). ``peak_flops``: the FLOP/s a large
    GEMM reaches. ``tile_overhead``: output elements' worth of fixed per-GEMM work (see the
    module docstring). ``hbm_Bps``: the bandwidth a weight-streaming GEMM reaches.
    ``elem_launch_s`` and ``elem_Bps``: fixed cost and bandwidth of a memory-bound op.
    """

    launch_s: float
    peak_flops: float
    tile_overhead: float
    hbm_Bps: float
    elem_launch_s: float
    elem_Bps: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{f.name} must be finite and >= 0, got {v}")
        for name in ("peak_flops", "hbm_Bps", "elem_Bps"):
            if getattr(self, name) == 0:
                raise ValueError(f"{name} must be > 0")

    def time(self, m: float, n: float, k: float) -> float:
        """Seconds for one ``[m x k] @ [k x n]`` 16-bit GEMM (``m`` = tokens, may be a mean);
        0 if empty."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        t_flop = 2.0 * k * (m * n + self.tile_overhead) / self.peak_flops
        t_mem = GEMM_DTYPE_BYTES * (k * n + m * k + m * n) / self.hbm_Bps
        return self.launch_s + math.hypot(t_flop, t_mem)

    def elementwise_time(self, nbytes: float) -> float:
        """Seconds for a memory-bound op that reads plus writes ``nbytes``; 0 if none."""
        if nbytes <= 0:
            return 0.0
        return self.elem_launch_s + nbytes / self.elem_Bps

    def scaled(self, peak_ratio: float, bw_ratio: float) -> GemmModel:
        """This model for another GPU: FLOP rate times ``peak_ratio`` (dense 16-bit peak of
        the other GPU over this one's), bandwidths times ``bw_ratio`` (HBM bandwidth ratio).

        An estimate: launch costs and the tile overhead are kept (same software stack, similar
        SM count), and the achieved fractions of peak are assumed to carry over.
        """
        if not (peak_ratio > 0 and bw_ratio > 0):
            raise ValueError(f"ratios must be > 0, got {peak_ratio} and {bw_ratio}")
        return replace(
            self,
            peak_flops=self.peak_flops * peak_ratio,
            hbm_Bps=self.hbm_Bps * bw_ratio,
            elem_Bps=self.elem_Bps * bw_ratio,
        )


__all__ = ["GEMM_DTYPE_BYTES", "GemmModel"]
