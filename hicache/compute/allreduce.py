"""NCCL all-reduce time across the GPUs of one server, fitted to a DGX H100 table.

Source: Vidur's ``network/h100_dgx/all_reduce.csv`` (median of repeated NCCL all-reduces of
2 KiB to 64 MiB over 2, 4 and 8 GPUs of one DGX H100 joined by NVSwitch; copied to
``hicache/data/vidur/``). Per worker count the model is

    t = max(floor_s, latency_s + nbytes / bandwidth_Bps)

Small messages sit on a flat floor (launch and synchronisation: 30-40 us here, with run-to-run
noise of the same size, so the floor is the median over messages under 1 MiB); large ones grow
at the bus bandwidth, fitted with its intercept to the messages of 4 MiB and more. Sizes past
the table extrapolate along that line.

Hot path: plain floats only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class AllReduceFit:
    """One worker count: ``max(floor_s, latency_s + nbytes / bandwidth_Bps)`` seconds."""

    floor_s: float
    latency_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{f.name} must be finite and >= 0, got {v}")
        if self.bandwidth_Bps == 0:
            raise ValueError("bandwidth_Bps must be > 0")

    def time(self, nbytes: float) -> float:
        return max(self.floor_s, self.latency_s + nbytes / self.bandwidth_Bps)


@dataclass(frozen=True)
class AllReduceModel:
    """All-reduce time by worker count (the counts measured: 2, 4, 8 on one DGX H100)."""

    fits: Mapping[int, AllReduceFit]

    def time(self, nbytes: float, workers: int) -> float:
        """Seconds to all-reduce ``nbytes`` (each rank's buffer) over ``workers`` GPUs.

        One worker or nothing to reduce: 0. A worker count without a fit is a ``ValueError``
        naming the ones there are (no table means no basis for a number).
        """
        if workers == 1 or nbytes <= 0:
            return 0.0
        fit = self.fits.get(workers)
        if fit is None:
            have = ", ".join(str(w) for w in sorted(self.fits))
            raise ValueError(f"no all-reduce fit for {workers} workers (have {have})")
        return fit.time(nbytes)


__all__ = ["AllReduceFit", "AllReduceModel"]
