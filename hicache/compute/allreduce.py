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

import itertools
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


#: SGLang's custom (one-shot/two-shot NVLink) all-reduce on H100, sgl-project/sglang PR #2904
#: ("unit test performance in H100 (without cuda graph)", `test_trt_reduce.py`: fp32 tensors of
#: 512 ... 1,048,576 elements, so 2 KiB ... 4 MiB; 100 calls timed with a wall clock):
#: workers -> ((bytes, seconds), ...)
SGLANG_CUSTOM_AR_H100: dict[int, tuple[tuple[int, float], ...]] = {
    2: ((2048, 3.7e-6), (16384, 3.9e-6), (131072, 4.5e-6), (1 << 20, 7.9e-6),
        (2 << 20, 12.5e-6), (4 << 20, 19.9e-6)),
    4: ((2048, 4.8e-6), (16384, 3.7e-6), (131072, 4.8e-6), (1 << 20, 13.9e-6),
        (2 << 20, 20.2e-6), (4 << 20, 31.1e-6)),
    8: ((2048, 5.9e-6), (16384, 5.7e-6), (131072, 7.8e-6), (1 << 20, 16.7e-6),
        (2 << 20, 22.1e-6), (4 << 20, 33.8e-6)),
}  # fmt: skip
#: messages SGLang's custom all-reduce takes (its buffer, 8 MiB); larger ones go to NCCL
CUSTOM_AR_MAX_BYTES = 8 << 20


@dataclass(frozen=True)
class CustomAllReduce:
    """SGLang's custom all-reduce by worker count: piecewise linear in bytes between the
    measured points, flat below the first, along the last segment past the last (up to
    :data:`CUSTOM_AR_MAX_BYTES`, where SGLang hands over to NCCL)."""

    points: Mapping[int, tuple[tuple[int, float], ...]]

    def time(self, nbytes: float, workers: int) -> float:
        if workers == 1 or nbytes <= 0:
            return 0.0
        pts = self.points.get(workers)
        if pts is None:
            have = ", ".join(str(w) for w in sorted(self.points))
            raise ValueError(f"no custom all-reduce figures for {workers} workers (have {have})")
        if nbytes <= pts[0][0]:
            return pts[0][1]
        (b0, t0), (b1, t1) = pts[-2], pts[-1]  # past the last point: along the last segment
        for lo, hi in itertools.pairwise(pts):
            if nbytes <= hi[0]:
                (b0, t0), (b1, t1) = lo, hi
                break
        return t0 + (nbytes - b0) * (t1 - t0) / (b1 - b0)


__all__ = [
    "CUSTOM_AR_MAX_BYTES",
    "SGLANG_CUSTOM_AR_H100",
    "AllReduceFit",
    "AllReduceModel",
    "CustomAllReduce",
]
