"""Fit ``hicache.latency``'s transfer constants to measurements and write a profile JSON.

:func:`calibrate` fits ``alpha``, ``gamma`` and ``beta`` per IO backend and direction and
``eta`` per direction (the fits, the model they fit and their error measures are in
:mod:`replay.fit`, re-exported here), takes the compute constants, and assembles a
:class:`~hicache.latency.Profile` whose provenance says where each value came from.

Compute constants: ``gemm_scale`` from the GEMM rows and ``decode_hbm_efficiency`` from the HBM rows
when the benchmark ran on CUDA; everything else is copied from the shipped default profile of
the GPU and link, and the provenance says which values were measured.

A profile is ``"measured": true`` only when the benchmark ran on CUDA; a CPU calibration is
marked unmeasured and says so in its provenance (it exercises the pipeline, not a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from hicache.latency import BACKENDS, DIRECTIONS, LinkParams, Profile
from hicache.profile import COMPUTE_KEYS, MEASURED_ON
from replay.fit import (
    ETA_MIN_BYTES,
    LinkFit,
    charge_columns,
    error_stats,
    fit_eta,
    fit_link,
    medians,
    op_rows_for_fit,
    predict_ops,
    rel_errors,
)
from replay.outputs import read_json, read_table

if TYPE_CHECKING:
    from hicache.hardware import GpuSpec


@dataclass
class Calibration:
    """The result of :func:`calibrate`: the profile and what went into it."""

    profile: Profile
    fits: dict[str, dict[str, LinkFit]]
    eta: dict[str, tuple[float, str]]
    notes: list[str]


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
    preset names) from a benchmark table and its ``meta.json`` dict (see the module docstring);
    ``replay``: fit rows of replay ops (:func:`replay_rows`) added to the bench's op rows.

    ``kernel_layout`` selects which host layout's kernel ops to fit (default: ``page_first``
    when measured, SGLang's default, else ``layer_first``). ``ValueError`` if a backend and
    direction has no rows.
    """
    from hicache.hardware import get_gpu, get_link

    gpu_spec = get_gpu(gpu)
    get_link(link)
    machine = {str(k): str(v) for k, v in dict(meta.get("machine", {})).items()}
    measured = machine.get("device", "cpu") == "cuda"
    if kernel_layout is None:
        kl = set(bench[(bench.kind == "op") & (bench.backend == "kernel")].layout)
        kernel_layout = "page_first" if "page_first" in kl or not kl else "layer_first"
    eta = {d: fit_eta(bench, d) for d in DIRECTIONS}
    fits, n_replay = _fit_links(bench, replay, kernel_layout)
    links = {
        b: {d: LinkParams(f.alpha_s, f.beta_Bps, f.gamma_s, eta[d][0]) for d, f in by.items()}
        for b, by in fits.items()
    }
    base, base_name = _default_compute(gpu, link)
    compute, how = _compute_constants(bench, base, gpu_spec, measured)
    copied = [k for k in compute if not any(m.startswith(k) for m in how)]
    how.append(f"{', '.join(copied)} copied from {base_name} (not measured)")
    notes = _notes(kernel_layout, measured)
    prov = {
        "source": source or "hicache-sim replay calibrate",
        MEASURED_ON: _measured_on(machine),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "bench_date": str(meta.get("date", "unknown")),
        "code_commit": str(meta.get("code_commit", "unknown")),
        **{f"machine_{k}": v for k, v in machine.items()},
        "sizes": _sizes_text(bench),
        "replay_ops": str(n_replay),
        "eta": "; ".join(f"{d}: {eta[d][1]}" for d in DIRECTIONS),
        "compute": "; ".join(how),
        "notes": "; ".join(notes),
        **{f"fit_{b}_{d}": fits[b][d].describe() for b in BACKENDS for d in DIRECTIONS},
    }
    profile = Profile(
        gpu=gpu,
        link_name=link,
        links=links,
        measured=measured,
        provenance=prov,
        **compute,
    )
    return Calibration(profile=profile, fits=fits, eta=eta, notes=notes)


def _fit_links(
    bench: pd.DataFrame, replay: pd.DataFrame | None, kernel_layout: str
) -> tuple[dict[str, dict[str, LinkFit]], int]:
    """:func:`fit_link` per backend and direction on the bench's median op rows (kernel: of
    ``kernel_layout``) plus the matching ``replay`` rows; returns the fits and how many replay
    rows went in. ``ValueError`` for a backend and direction without rows."""
    fits: dict[str, dict[str, LinkFit]] = {}
    n_replay = 0
    for b in BACKENDS:
        fits[b] = {}
        for d in DIRECTIONS:
            rows = op_rows_for_fit(bench, b, d, kernel_layout)
            if replay is not None and len(replay):
                rp = replay[(replay.backend == b) & (replay.direction == d)]
                n_replay += len(rp)
                rows = pd.concat([rows, rp], ignore_index=True)
            if rows.empty:
                raise ValueError(f"no {b} {d} measurements to fit (run the bench with --backends)")
            fits[b][d] = fit_link(
                rows.n_alpha.to_numpy(float),
                rows.n_gamma.to_numpy(float),
                rows["bytes"].to_numpy(float),
                rows.duration_s.to_numpy(float),
            )
    return fits, n_replay


def _compute_constants(
    bench: pd.DataFrame, base: Profile, gpu_spec: GpuSpec, cuda: bool
) -> tuple[dict[str, float], list[str]]:
    """The compute constants (:data:`COMPUTE_KEYS`): those of ``base``, with ``gemm_scale`` and
    ``decode_hbm_efficiency`` measured from the GEMM and HBM rows of a CUDA bench; and a line
    per measured value saying how."""
    compute = {k: getattr(base, k) for k in COMPUTE_KEYS}
    how = []
    scale = gemm_scale(bench, gpu_spec) if cuda else None
    if scale is not None:
        compute["gemm_scale"] = scale
        how.append(
            f"gemm_scale {scale:.3f} = one layer's bf16 GEMMs measured / predicted by the "
            f"operator tables for {gpu_spec.name} (hicache.forward.compute_models_for)"
        )
    hbm = bench[bench.kind == "hbm"]
    if cuda and len(hbm):
        bw = float((hbm["bytes"] / hbm.duration_s).median())
        compute["decode_hbm_efficiency"] = min(1.0, bw / gpu_spec.hbm_bw)
        how.append(
            f"decode_hbm_efficiency {compute['decode_hbm_efficiency']:.3f} = device copy "
            f"{bw / 1e9:.0f} GB/s / {gpu_spec.hbm_bw / 1e9:.0f}"
        )
    return compute, how


def gemm_scale(bench: pd.DataFrame, gpu_spec: GpuSpec) -> float | None:
    """Measured over predicted seconds of the bench's GEMMs, one of each shape at its median
    time (None without GEMM rows that carry their shape)."""
    from hicache.forward import compute_models_for
    from replay.bench_compute import parse_gemm_label

    g = bench[bench.kind == "gemm"]
    if g.empty:
        return None
    model, _, _ = compute_models_for(gpu_spec)
    measured = predicted = 0.0
    for label, t in g.groupby("layout").duration_s.median().items():
        shape = parse_gemm_label(str(label))
        if shape is None:
            return None
        measured += float(t)
        predicted += model.time(*shape)
    return measured / predicted if predicted > 0 else None


def _measured_on(machine: dict[str, str]) -> str:
    """The provenance's ``measured_on`` (:data:`hicache.profile.MEASURED_ON`): ``cpu``, the GPU
    preset of the bench's device, or ``cuda:<name>`` for a GPU without one."""
    from replay.presets import gpu_preset_for

    if machine.get("device", "cpu") != "cuda":
        return "cpu"
    name = machine.get("gpu_name", "")
    return gpu_preset_for(name) or f"cuda:{name or 'unknown'}"


def _notes(kernel_layout: str, measured: bool) -> list[str]:
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
    return notes


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


#: Columns the fit reads, and those of them that must be numbers.
_BENCH_COLUMNS = ("kind", "backend", "direction", "host_memory", "layout", "bytes", "run_pages",
                  "layers", "n_alpha", "n_gamma", "flops", "duration_s")  # fmt: skip
_NUMERIC = ("bytes", "run_pages", "layers", "n_alpha", "n_gamma", "flops", "duration_s")


def _read_bench_table(folder: Path) -> pd.DataFrame:
    """``bench.parquet`` (or ``bench.csv``), every read error as a ``ValueError`` naming it."""
    name = "bench.parquet" if (folder / "bench.parquet").is_file() else "bench.csv"
    try:
        df = read_table(folder, "bench")
    except (OSError, ValueError) as e:
        if str(e).startswith(str(folder)):
            raise
        text = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"{folder / name}: cannot read the bench table: {text}") from None
    missing = [c for c in _BENCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{folder / name}: not a bench table: no column {', '.join(missing)}")
    for c in _NUMERIC:
        if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            raise ValueError(f"{folder / name}: column {c}: expected numbers")
        if not np.isfinite(df[c].to_numpy(float)).all():
            raise ValueError(f"{folder / name}: column {c}: expected finite numbers")
    if (df.duration_s <= 0).any():
        raise ValueError(f"{folder / name}: column duration_s: expected times > 0")
    for c in ("kind", "backend", "direction", "host_memory", "layout"):
        df[c] = df[c].astype(str).where(df[c].notna(), "")
    return df


def load_bench(folder: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The table and ``meta.json`` of a bench output folder; ``ValueError`` naming the file
    when one is missing or is not what ``replay bench`` writes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a bench folder (hicache-sim replay bench --out)")
    df = _read_bench_table(folder)
    meta_path = folder / "meta.json"
    try:
        meta = read_json(meta_path) if meta_path.is_file() else {}
    except UnicodeDecodeError:
        raise ValueError(f"{meta_path}: not a UTF-8 text (JSON) file") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: expected an object")
    if not isinstance(meta.get("machine", {}), dict):
        raise ValueError(f"{meta_path}: machine: expected an object")
    return df, meta


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


__all__ = [
    "ETA_MIN_BYTES",
    "Calibration",
    "LinkFit",
    "calibrate",
    "charge_columns",
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
