"""The least-squares fits of ``hicache.latency``'s transfer constants, and how well a profile
predicts measured ops; :func:`replay.calibrate.calibrate` assembles them into a profile.

The model (``hicache.latency``): an op that pays ``n_alpha`` fixed costs, ``n_gamma`` per-run costs
and moves ``bytes`` takes ``n_alpha * alpha + n_gamma * gamma + bytes / beta``; what an op is
charged is ``hicache.latency.op_charges``, the one cost rule (a write pays alpha once and gamma
per run and layer, a load alpha per layer). Per IO backend and direction, :func:`fit_link`
solves for ``(alpha, gamma, 1/beta)`` by least squares over the benchmark's ``op`` rows
(medians over repeats), plus the ops of any replay run directories given, each row weighted
by ``1 / measured``: the error that matters is relative (the targets are median relative
errors), and unweighted squares would let the 256 MiB copies decide everything and leave
``alpha`` to noise. Coefficients are kept
non-negative (a negative one is pinned to 0 and the rest refitted); a ``gamma`` that the rows
cannot tell apart from ``alpha`` (every op with the same runs per alpha) is pinned to 0.

``eta`` per direction (:func:`fit_eta`): the median, over the both-at-once sizes of at least
16 MiB (all sizes if none is that large), of ``t_alone / t_together`` for plain copies of the
same size and host memory: the bandwidth ratio when ``alpha`` is negligible. The same ``eta``
is used for both backends (the link, not the issuing code, is what couples the directions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hicache.latency import OpCharges, Profile, op_charges, op_time

#: bidir sizes at least this large estimate eta (alpha is negligible there)
ETA_MIN_BYTES = 16 * 1024 * 1024
_GROUP = [
    "kind",
    "backend",
    "direction",
    "host_memory",
    "layout",
    "bytes",
    "run_pages",
    "runs",
    "layers",
    "n_alpha",
    "n_gamma",
]


@dataclass(frozen=True)
class LinkFit:
    """The fitted constants of one backend and direction, and how well they fit."""

    alpha_s: float
    gamma_s: float
    beta_Bps: float
    n: int
    median_rel_err: float
    p90_rel_err: float
    max_rel_err: float
    pinned: tuple[str, ...] = field(default_factory=tuple)
    """Coefficients forced to 0 (negative or not identifiable)."""

    def describe(self) -> str:
        pin = f", pinned to 0: {', '.join(self.pinned)}" if self.pinned else ""
        return (
            f"alpha {self.alpha_s * 1e6:.3g} us, gamma {self.gamma_s * 1e6:.3g} us, beta "
            f"{self.beta_Bps / 1e9:.4g} GB/s; n={self.n}, |rel err| median "
            f"{self.median_rel_err:.2%} p90 {self.p90_rel_err:.2%} max {self.max_rel_err:.2%}{pin}"
        )


def fit_link(
    n_alpha: Sequence[float] | np.ndarray,
    n_gamma: Sequence[float] | np.ndarray,
    nbytes: Sequence[float] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
) -> LinkFit:
    """Relative least squares of ``seconds ~ n_alpha*alpha + n_gamma*gamma + nbytes/beta`` with
    ``alpha, gamma >= 0`` (see the module docstring). ``ValueError`` when the rows cannot
    determine a positive bandwidth (e.g. one copy size only) or are empty."""
    A = np.column_stack([np.asarray(x, dtype=float) for x in (n_alpha, n_gamma, nbytes)])
    t = np.asarray(seconds, dtype=float)
    if len(t) == 0:
        raise ValueError("no measurements to fit")
    if not np.all(t > 0):
        raise ValueError("measured durations must be > 0")
    W = A / t[:, None]
    names = ("alpha", "gamma", "1/beta")
    free = [0, 1, 2]
    pinned: list[str] = []
    # gamma cannot be told apart when every op has the same runs per alpha (its column is a
    # multiple of alpha's, or zero): pin it; alpha vs bandwidth needs several sizes, or fail
    if np.linalg.matrix_rank(W) < 3:
        free.remove(1)
        pinned.append(names[1])
    if np.linalg.matrix_rank(W[:, free]) < len(free):
        raise ValueError(
            "cannot separate the fixed cost from the bandwidth: the measurements need copies "
            f"of several sizes ({len(t)} rows, {len(set(A[:, 2]))} distinct sizes)"
        )
    while True:
        sol, *_ = np.linalg.lstsq(W[:, free], np.ones(len(t)), rcond=None)
        coef = dict(zip(free, sol, strict=True))
        neg = [c for c in free if c != 2 and coef[c] < 0]
        if not neg:
            break
        worst = min(neg, key=lambda c: coef[c])
        free.remove(worst)
        pinned.append(names[worst])
    inv_beta = coef.get(2, 0.0)
    if not inv_beta > 0:
        raise ValueError(
            "cannot fit a bandwidth: the measurements need copies of several sizes "
            f"({len(t)} rows, {len(set(A[:, 2]))} distinct sizes)"
        )
    alpha, gamma = coef.get(0, 0.0), coef.get(1, 0.0)
    pred = A @ np.array([alpha, gamma, inv_beta])
    err = np.abs(pred - t) / t
    return LinkFit(
        alpha_s=float(alpha),
        gamma_s=float(gamma),
        beta_Bps=float(1.0 / inv_beta),
        n=len(t),
        median_rel_err=float(np.median(err)),
        p90_rel_err=float(np.quantile(err, 0.9)),
        max_rel_err=float(err.max()),
        pinned=tuple(pinned),
    )


def medians(df: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct measurement config, ``duration_s`` = median over its repeats."""
    cols = [c for c in _GROUP if c in df.columns]
    return df.groupby(cols, dropna=False)["duration_s"].median().reset_index()


def fit_eta(bench: pd.DataFrame, direction: str) -> tuple[float, str]:
    """``(eta, how)`` for one direction from the plain and bidir rows (see the module
    docstring); ``(1.0, reason)`` when there is nothing to estimate it from."""
    med = medians(bench)
    bid = med[(med.kind == "bidir") & (med.direction == direction)]
    if bid.empty:
        return 1.0, "not measured (no both-directions rows); 1.0"
    mem = bid.host_memory.iloc[0]
    plain = med[(med.kind == "plain") & (med.direction == direction) & (med.host_memory == mem)]
    alone = dict(zip(plain["bytes"], plain.duration_s, strict=True))
    big = bid[bid["bytes"] >= ETA_MIN_BYTES]
    use = big if len(big) else bid
    ratios = [alone[b] / t for b, t in zip(use["bytes"], use.duration_s, strict=True) if b in alone]
    if not ratios:
        return 1.0, "not measured (no plain copy of the both-directions sizes); 1.0"
    eta = float(min(1.0, max(0.05, float(np.median(ratios)))))
    lo, hi = int(use["bytes"].min()), int(use["bytes"].max())
    return eta, f"{eta:.3f} = median t_alone/t_together over {len(ratios)} sizes {lo:,}-{hi:,} B"


def op_rows_for_fit(
    bench: pd.DataFrame, backend: str, direction: str, kernel_layout: str | None
) -> pd.DataFrame:
    """Median op rows of one backend and direction (kernel: of ``kernel_layout``)."""
    med = medians(bench)
    sel = med[(med.kind == "op") & (med.backend == backend) & (med.direction == direction)]
    if backend == "kernel" and kernel_layout:
        sel = sel[sel.layout == kernel_layout]
    return sel


def charge_columns(direction: str, nbytes: int, runs: int, layers: int) -> dict[str, int]:
    """The fit columns ``n_alpha`` / ``n_gamma`` of a copy op in ``direction`` (d2h is a
    write, h2d a load), from ``hicache.latency.op_charges``."""
    kind = "write" if direction == "d2h" else "load"
    c = op_charges(kind, nbytes, runs, layers)
    return {"n_alpha": c.n_alpha, "n_gamma": c.n_gamma}


def predict_ops(profile: Profile, rows: pd.DataFrame) -> np.ndarray:
    """The model's seconds for fit-style rows (``backend, direction, n_alpha, n_gamma,
    bytes``), with the coupling factor off (each row ran alone)."""
    out = np.empty(len(rows))
    for i, (b, d, na, ng, nb) in enumerate(
        zip(rows.backend, rows.direction, rows.n_alpha, rows.n_gamma, rows["bytes"], strict=True)
    ):
        out[i] = op_time(profile.link(str(b), str(d)), OpCharges(na, ng, nb))
    return out


def rel_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``|predicted - measured| / measured``."""
    m = np.asarray(measured, dtype=float)
    return np.asarray(np.abs(np.asarray(predicted, dtype=float) - m) / m, dtype=float)


def error_stats(err: np.ndarray) -> dict[str, float]:
    """Median, p90 and max of relative errors (NaN when empty)."""
    if len(err) == 0:
        return {"n": 0, "median": math.nan, "p90": math.nan, "max": math.nan}
    return {
        "n": len(err),
        "median": float(np.median(err)),
        "p90": float(np.quantile(err, 0.9)),
        "max": float(np.max(err)),
    }


__all__ = [
    "ETA_MIN_BYTES",
    "LinkFit",
    "charge_columns",
    "error_stats",
    "fit_eta",
    "fit_link",
    "medians",
    "op_rows_for_fit",
    "predict_ops",
    "rel_errors",
]
