"""Fit ``hicache.latency``'s transfer constants to measurements and write a profile JSON.

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

``eta`` per direction: the median, over the both-at-once sizes of at least 16 MiB (all sizes
if none is that large), of ``t_alone / t_together`` for plain copies of the same size and host
memory: the bandwidth ratio when ``alpha`` is negligible. The same ``eta`` is used for both
backends (the link, not the issuing code, is what couples the directions).

Compute constants: ``mfu`` from the GEMM rows and ``decode_hbm_efficiency`` from the HBM rows
when the benchmark ran on CUDA; everything else is copied from the shipped default profile of
the GPU and link, and the provenance says which values were measured.

A profile is ``"measured": true`` only when the benchmark ran on CUDA; a CPU calibration is
marked unmeasured and says so in its provenance (it exercises the pipeline, not a GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hicache.latency import (
    BACKENDS,
    DIRECTIONS,
    LinkParams,
    OpCharges,
    Profile,
    charged_time,
    op_charges,
)
from replay.outputs import read_json, read_table

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

    def predict(self, n_alpha: Any, n_gamma: Any, nbytes: Any) -> Any:
        c = OpCharges(n_alpha, n_gamma, nbytes)
        return charged_time(self.alpha_s, self.gamma_s, self.beta_Bps, c)

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


def replay_rows(dirs: Sequence[Path]) -> pd.DataFrame:
    """The op tables of replay run directories as fit rows (``n_alpha``, ``n_gamma``)."""
    frames = []
    for d in dirs:
        ops = read_table(Path(d), "ops")
        charges = [
            charge_columns(str(dr), int(nb), int(r), int(ly))
            for dr, nb, r, ly in zip(ops.direction, ops.nbytes, ops.runs, ops.layers, strict=True)
        ]
        f = pd.DataFrame(
            {
                "backend": ops.backend,
                "direction": ops.direction,
                "layout": ops.layout,
                "bytes": ops.nbytes,
                "n_alpha": [c["n_alpha"] for c in charges],
                "n_gamma": [c["n_gamma"] for c in charges],
                "duration_s": ops.duration_s,
            }
        )
        frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass
class Calibration:
    """The result of :func:`calibrate`: the profile and what went into it."""

    profile: Profile
    fits: dict[str, dict[str, LinkFit]]
    eta: dict[str, tuple[float, str]]
    notes: list[str]


def _default_compute(gpu: str, link: str) -> tuple[Profile, str]:
    from hicache.latency import default_profile_path, load_profile

    path = default_profile_path(gpu, link)
    if path.is_file():
        # the published-figures estimate, even where a measured profile is shipped: what a
        # calibration does not measure is copied from a stated source, not from another run
        return load_profile(path, gpu, link), path.name
    fallback = default_profile_path("h100-sxm", "pcie5-x16")
    return load_profile(fallback, "h100-sxm", "pcie5-x16"), fallback.name


def gemm_rate(df: pd.DataFrame) -> float:
    """Achieved FLOP/s of the ``gemm`` rows as one layer runs them: the FLOPs of one of each
    GEMM over the sum of their median times (the big MLP GEMMs weigh in as they do in a
    layer). NaN without GEMM rows."""
    g = df[df.kind == "gemm"]
    if g.empty:
        return float("nan")
    per = g.groupby("layout").agg(flops=("flops", "first"), t=("duration_s", "median"))
    return float(per.flops.sum() / per.t.sum())


def calibrate(
    bench: pd.DataFrame,
    meta: dict[str, Any],
    *,
    gpu: str,
    link: str,
    replay: pd.DataFrame | None = None,
    kernel_layout: str | None = None,
    source: str = "",
) -> Calibration:
    """Fit a :class:`~hicache.latency.Profile` for ``gpu`` + ``link`` (``hicache.hardware``
    preset names) from a benchmark table and its ``meta.json`` dict (see the module docstring).

    ``kernel_layout`` selects which host layout's kernel ops to fit (default: ``page_first``
    when measured, SGLang's default, else ``layer_first``). ``ValueError`` if a backend and
    direction has no rows.
    """
    from hicache.hardware import get_gpu, get_link

    gpu_spec = get_gpu(gpu)
    get_link(link)
    machine = {str(k): str(v) for k, v in dict(meta.get("machine", {})).items()}
    device = machine.get("device", "cpu")
    if kernel_layout is None:
        kl = set(bench[(bench.kind == "op") & (bench.backend == "kernel")].layout)
        kernel_layout = "page_first" if "page_first" in kl or not kl else "layer_first"
    fits: dict[str, dict[str, LinkFit]] = {}
    links: dict[str, dict[str, LinkParams]] = {}
    eta = {d: fit_eta(bench, d) for d in DIRECTIONS}
    n_replay = 0
    for b in BACKENDS:
        fits[b], links[b] = {}, {}
        for d in DIRECTIONS:
            rows = op_rows_for_fit(bench, b, d, kernel_layout)
            if replay is not None and len(replay):
                rp = replay[(replay.backend == b) & (replay.direction == d)]
                n_replay += len(rp)
                rows = pd.concat([rows, rp], ignore_index=True)
            if rows.empty:
                raise ValueError(f"no {b} {d} measurements to fit (run the bench with --backends)")
            fit = fit_link(
                rows.n_alpha.to_numpy(float),
                rows.n_gamma.to_numpy(float),
                rows["bytes"].to_numpy(float),
                rows.duration_s.to_numpy(float),
            )
            fits[b][d] = fit
            links[b][d] = LinkParams(fit.alpha_s, fit.beta_Bps, fit.gamma_s, eta[d][0])
    base, base_name = _default_compute(gpu, link)
    compute = {
        "mfu": base.mfu,
        "prefill_overhead_s": base.prefill_overhead_s,
        "attn_efficiency": base.attn_efficiency,
        "decode_hbm_efficiency": base.decode_hbm_efficiency,
        "decode_overhead_s": base.decode_overhead_s,
    }
    measured_compute = []
    gemm = bench[bench.kind == "gemm"]
    if device == "cuda" and len(gemm):
        rate = gemm_rate(bench)
        compute["mfu"] = min(1.0, rate / gpu_spec.peak_flops_bf16)
        names = ", ".join(str(n) for n in dict.fromkeys(gemm.layout))
        measured_compute.append(
            f"mfu {compute['mfu']:.3f} = one layer's bf16 linear GEMMs ({names}) at "
            f"{rate / 1e12:.1f} TFLOP/s / peak {gpu_spec.peak_flops_bf16 / 1e12:.0f}"
        )
    hbm = bench[bench.kind == "hbm"]
    if device == "cuda" and len(hbm):
        bw = float((hbm["bytes"] / hbm.duration_s).median())
        compute["decode_hbm_efficiency"] = min(1.0, bw / gpu_spec.hbm_bw)
        measured_compute.append(
            f"decode_hbm_efficiency {compute['decode_hbm_efficiency']:.3f} = device copy "
            f"{bw / 1e9:.0f} GB/s / {gpu_spec.hbm_bw / 1e9:.0f}"
        )
    measured = device == "cuda"
    notes = [
        "kernel backend = torch index_select/index_copy_ emulation (device gather/scatter, CPU "
        "gather/scatter on the pinned host side, one bulk copy), not SGLang's kernels",
        f"kernel ops fitted from the {kernel_layout} host layout; direct from layer_first",
        "eta from plain copies in both directions at once, used for both backends",
    ]
    if not measured:
        notes.insert(
            0,
            "NOT A GPU MEASUREMENT: the benchmark ran on CPU tensors (no CUDA); these numbers "
            "exercise the calibration pipeline and must not be used as GPU latencies",
        )
    copied = [k for k in compute if not any(m.startswith(k) for m in measured_compute)]
    prov = {
        "source": source or "hicache-sim replay calibrate",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "bench_date": str(meta.get("date", "unknown")),
        "code_commit": str(meta.get("code_commit", "unknown")),
        **{f"machine_{k}": v for k, v in machine.items()},
        "sizes": _sizes_text(bench),
        "replay_ops": str(n_replay),
        "eta": "; ".join(f"{d}: {eta[d][1]}" for d in DIRECTIONS),
        "compute": "; ".join(
            [*measured_compute, f"{', '.join(copied)} copied from {base_name} (not measured)"]
        ),
        "notes": "; ".join(notes),
    }
    for b in BACKENDS:
        for d in DIRECTIONS:
            prov[f"fit_{b}_{d}"] = fits[b][d].describe()
    profile = Profile(
        gpu=gpu,
        link_name=link,
        links=links,
        measured=measured,
        provenance=prov,
        **compute,
    )
    return Calibration(profile=profile, fits=fits, eta=eta, notes=notes)


def _sizes_text(df: pd.DataFrame) -> str:
    parts = []
    for kind in ("plain", "bidir", "op"):
        sel = df[df.kind == kind]
        if sel.empty:
            continue
        lo, hi = int(sel["bytes"].min()), int(sel["bytes"].max())
        extra = ""
        if kind == "plain":
            extra = f", {', '.join(sorted(set(sel.host_memory)))}"
        if kind == "op":
            runs = sorted({int(r) for r in sel.run_pages})
            layers = sorted({int(x) for x in sel.layers})
            extra = (
                f", backends {'/'.join(sorted(set(sel.backend)))}, run lengths {runs} pages "
                f"(0 = contiguous), layers {layers}"
            )
        parts.append(f"{kind}: {len(set(sel['bytes']))} sizes {lo:,}-{hi:,} B{extra}")
    return "; ".join(parts)


def load_bench(folder: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The table and ``meta.json`` of a bench output folder (``ValueError`` if missing)."""
    folder = Path(folder)
    df = read_table(folder, "bench")
    meta_path = folder / "meta.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: expected an object")
    return df, meta


def predict_ops(profile: Profile, rows: pd.DataFrame) -> np.ndarray:
    """The model's seconds for fit-style rows (``backend, direction, n_alpha, n_gamma,
    bytes``), with the coupling factor off (each row ran alone)."""
    out = np.empty(len(rows))
    for i, (b, d, na, ng, nb) in enumerate(
        zip(rows.backend, rows.direction, rows.n_alpha, rows.n_gamma, rows["bytes"], strict=True)
    ):
        p = profile.link(str(b), str(d))
        out[i] = na * p.alpha_s + ng * p.gamma_s + nb / p.beta_Bps
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
    "Calibration",
    "LinkFit",
    "calibrate",
    "error_stats",
    "fit_eta",
    "fit_link",
    "gemm_rate",
    "load_bench",
    "medians",
    "op_rows_for_fit",
    "predict_ops",
    "rel_errors",
    "replay_rows",
]
