"""Fit the compute models to the measured tables, and check them out of sample.

* GEMM and memory-bound ops (:class:`~hicache.compute.gemm.GemmModel`): least squares on log
  time over every op of every row of the Vidur layer table (1 to 4,096 tokens, TP 1-8), each
  op mapped to its per-rank GEMM or bytes by :mod:`hicache.compute.layer`. Log time weighs a
  3 us op and a 3 ms op alike, which is what relative accuracy across batch sizes needs.
* Leave-one-model-out (LOMO): fit on three models, predict the fourth's ``linear_s`` (the sum
  of its linear ops, ``emb`` excluded) at 64 to 4,096 tokens and every TP degree.
* Attention (:class:`~hicache.compute.attention.AttentionModel`): least squares on log FLOP rate
  over the six FA3 points.
* All-reduce (:class:`~hicache.compute.allreduce.AllReduceModel`): closed form per worker count
  (module docstring of :mod:`hicache.compute.allreduce`), checked on held-out sizes.

numpy is imported inside the functions here: fitting is offline, and the runtime models stay
numpy-free. A small Levenberg-Marquardt does the nonlinear fits (no scipy in this project).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from hicache.compute.allreduce import AllReduceFit, AllReduceModel
from hicache.compute.attention import (
    FA3_H100_POINTS,
    FA3_PAPER_CAUSAL_RATIO,
    AttentionModel,
    prefill_attention_flops,
    prefill_attention_time,
)
from hicache.compute.gemm import GEMM_DTYPE_BYTES, GemmModel
from hicache.compute.layer import DenseLayer, dense_layer_ops, linear_time
from hicache.compute.profile import ComputeProfile
from hicache.compute.tables import (
    ALL_REDUCE_TABLE,
    MLP_TABLE,
    AllReduceRow,
    LayerRow,
    read_all_reduce_rows,
    read_layer_rows,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vec = npt.NDArray[np.float64]

#: Dense bf16/fp16 tensor peak of H100 SXM (HARDWARE.md C6; ``hicache.hardware.GPUS``).
H100_PEAK_FLOPS = 989e12
#: Token counts the LOMO and in-sample errors are scored on (the prefill range of interest;
#: below 64 the time is flat and set by reading the weights).
EVAL_TOKENS = (64, 4096)
#: All-reduce: the floor is the median under this size, the line is fitted from the next up.
AR_FLOOR_BELOW = 1 << 20
AR_LINE_FROM = 4 << 20
#: Starting point of the GEMM fit: launch 5 us, 700 TFLOPS, 3e5 outputs, 3 TB/s.
_GEMM_START = (5e-6, 7e14, 3e5, 3e12)
_ELEM_START = (3e-6, 2e12)


# ---------------------------------------------------------------------------------------------
# Nonlinear least squares
# ---------------------------------------------------------------------------------------------


def levenberg_marquardt(
    resid: Callable[[Vec], Vec], x0: Sequence[float] | Vec, max_iter: int = 500
) -> list[float]:
    """Minimise ``|resid(x)|^2`` from ``x0``: Gauss-Newton steps damped by a factor that
    shrinks after a good step and grows after a bad one; central-difference Jacobian. Stops
    when no damping improves the cost or the step is below 1e-12 in every coordinate."""
    import numpy as np

    x = np.asarray(x0, dtype=float)
    r = resid(x)
    cost, lam = float(r @ r), 1e-3
    for _ in range(max_iter):
        jac = np.empty((r.size, x.size))
        for i in range(x.size):
            h = np.zeros_like(x)
            h[i] = 1e-6
            jac[:, i] = (resid(x + h) - resid(x - h)) / 2e-6
        a, g = jac.T @ jac, jac.T @ r
        while lam < 1e12:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a)), -g)
            r_new = resid(x + step)
            if float(r_new @ r_new) < cost:
                break
            lam *= 4
        else:
            break
        x, r, cost, lam = x + step, r_new, float(r_new @ r_new), max(lam / 3, 1e-12)
        if float(np.max(np.abs(step))) < 1e-12:
            break
    return [float(v) for v in x]


# ---------------------------------------------------------------------------------------------
# GEMM + memory-bound ops
# ---------------------------------------------------------------------------------------------


class OpSample(NamedTuple):
    """One measured op: a GEMM (``m, n, k``; ``nbytes`` 0) or memory-bound op, in seconds."""

    model: str
    m: float
    n: int
    k: int
    nbytes: float
    seconds: float


def layer_of(row: LayerRow) -> DenseLayer:
    """The layer shape a Vidur row measured (a parallel block has no second norm)."""
    return DenseLayer(
        hidden=row.hidden,
        heads=row.heads,
        kv_heads=row.kv_heads,
        mlp_width=row.mlp_width,
        gated=row.gated,
        tp=row.tp,
        parallel_block="post_attention_layernorm" not in row.op_ms,
    )


def op_samples(rows: Sequence[LayerRow]) -> list[OpSample]:
    """Every linear op of every row, with its measured time in seconds."""
    out = []
    for row in rows:
        for op in dense_layer_ops(layer_of(row), row.tokens):
            s = row.op_ms[op.name] * 1e-3
            out.append(OpSample(row.model, op.m, op.n, op.k, op.nbytes, s))
    return out


def _gemm_predict(x: Vec, m: Vec, n: Vec, k: Vec) -> Vec:
    """:meth:`GemmModel.time`, vectorised, for ``x = log(launch, peak, tile_overhead, bw)``."""
    import numpy as np

    launch, peak, tile, bw = np.exp(x)
    t_flop = 2.0 * k * (m * n + tile) / peak
    t_mem = GEMM_DTYPE_BYTES * (k * n + m * k + m * n) / bw
    out: Vec = launch + np.hypot(t_flop, t_mem)
    return out


def fit_gemm(rows: Sequence[LayerRow]) -> GemmModel:
    """Fit all six coefficients of a :class:`GemmModel` to the ops of ``rows``."""
    import numpy as np

    samples = op_samples(rows)
    gemms = [s for s in samples if not s.nbytes]
    elems = [s for s in samples if s.nbytes]
    m, n, k = (np.array([getattr(s, c) for s in gemms], dtype=float) for c in "mnk")
    y = np.log([s.seconds for s in gemms])
    launch, peak, tile, bw = np.exp(
        levenberg_marquardt(lambda x: np.log(_gemm_predict(x, m, n, k)) - y, np.log(_GEMM_START))
    )
    b = np.array([s.nbytes for s in elems], dtype=float)
    ye = np.log([s.seconds for s in elems])
    e_launch, e_bw = np.exp(
        levenberg_marquardt(
            lambda x: np.log(np.exp(x[0]) + b / np.exp(x[1])) - ye, np.log(_ELEM_START)
        )
    )
    return GemmModel(
        launch_s=float(launch),
        peak_flops=float(peak),
        tile_overhead=float(tile),
        hbm_Bps=float(bw),
        elem_launch_s=float(e_launch),
        elem_Bps=float(e_bw),
    )


class ErrorStats(NamedTuple):
    """Absolute percentage errors of a set of predictions: median, 90th percentile, max."""

    n: int
    median_pct: float
    p90_pct: float
    max_pct: float


def error_stats(pred: Sequence[float], meas: Sequence[float]) -> ErrorStats:
    errs = sorted(abs(p / m - 1) * 100 for p, m in zip(pred, meas, strict=True))
    p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
    return ErrorStats(len(errs), statistics.median(errs), p90, errs[-1])


def measured_linear_s(row: LayerRow) -> float:
    """A row's measured ``linear_s``: every op but ``emb``, in seconds."""
    return sum(ms for op, ms in row.op_ms.items() if op != "emb") * 1e-3


def linear_errors(model: GemmModel, rows: Sequence[LayerRow]) -> ErrorStats:
    """Errors of predicted vs measured ``linear_s`` over the rows in :data:`EVAL_TOKENS`."""
    lo, hi = EVAL_TOKENS
    rows = [r for r in rows if lo <= r.tokens <= hi]
    pred = [linear_time(model, layer_of(r), r.tokens) for r in rows]
    return error_stats(pred, [measured_linear_s(r) for r in rows])


def models_of(rows: Sequence[LayerRow]) -> list[str]:
    return sorted({r.model for r in rows})


def leave_one_model_out(rows: Sequence[LayerRow]) -> dict[str, ErrorStats]:
    """Per model: ``linear_s`` errors when fitted on the other models only."""
    out = {}
    for name in models_of(rows):
        model = fit_gemm([r for r in rows if r.model != name])
        out[name] = linear_errors(model, [r for r in rows if r.model == name])
    return out


def in_sample(model: GemmModel, rows: Sequence[LayerRow]) -> dict[str, ErrorStats]:
    """Per model: ``linear_s`` errors of ``model`` (fitted on all rows)."""
    return {
        name: linear_errors(model, [r for r in rows if r.model == name]) for name in models_of(rows)
    }


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


def fit_attention(
    points: Sequence[tuple[int, float]] = FA3_H100_POINTS, peak_flops: float = H100_PEAK_FLOPS
) -> AttentionModel:
    """Fit ``max_efficiency`` and ``half_len`` to (sequence length, FLOP/s) points."""
    import numpy as np

    lens = np.array([p[0] for p in points], dtype=float)
    y = np.log([p[1] / peak_flops for p in points])
    eff, half = np.exp(
        levenberg_marquardt(lambda x: x[0] + np.log(lens / (lens + np.exp(x[1]))) - y, [-0.4, 5.5])
    )
    return AttentionModel(peak_flops=peak_flops, max_efficiency=float(eff), half_len=float(half))


def attention_point_errors(model: AttentionModel) -> dict[int, float]:
    """Signed % error of the fitted curve at each FA3 point."""
    return {n: (model.flops_per_s(n) / f - 1) * 100 for n, f in FA3_H100_POINTS}


def causal_ratio(
    model: AttentionModel, seq_len: int, heads: int = 16, head_dim: int = 128
) -> float:
    """Useful FLOP rate of a causal prefill of ``seq_len`` tokens over the non-causal rate at
    the same length (floor excluded), as the FA3 paper's Fig. 5 compares them."""
    t = prefill_attention_time(seq_len, 0, heads, head_dim, head_dim, model) - model.floor_s
    rate = prefill_attention_flops(seq_len, 0, heads, head_dim, head_dim) / t
    return rate / model.flops_per_s(seq_len)


def causal_ratio_errors(model: AttentionModel) -> dict[int, float]:
    """Signed % error of :func:`causal_ratio` against the FA3 paper's figures."""
    return {n: (causal_ratio(model, n) / r - 1) * 100 for n, r in FA3_PAPER_CAUSAL_RATIO}


# ---------------------------------------------------------------------------------------------
# All-reduce
# ---------------------------------------------------------------------------------------------


def fit_all_reduce_one(rows: Sequence[AllReduceRow]) -> AllReduceFit:
    """Fit one worker count: floor = median time under 1 MiB; latency and bandwidth = least
    squares on relative error over the sizes from 4 MiB."""
    import numpy as np

    floor = statistics.median(r.median_ms for r in rows if r.nbytes < AR_FLOOR_BELOW) * 1e-3
    big = [r for r in rows if r.nbytes >= AR_LINE_FROM]
    t = np.array([r.median_ms * 1e-3 for r in big])
    a = np.array([[1.0, r.nbytes] for r in big]) / t[:, None]
    (latency, inv_bw), *_ = np.linalg.lstsq(a, np.ones(len(big)), rcond=None)
    return AllReduceFit(floor_s=floor, latency_s=float(latency), bandwidth_Bps=float(1 / inv_bw))


def _by_workers(rows: Sequence[AllReduceRow]) -> dict[int, list[AllReduceRow]]:
    out: dict[int, list[AllReduceRow]] = {}
    for r in sorted(rows, key=lambda r: (r.workers, r.nbytes)):
        out.setdefault(r.workers, []).append(r)
    return out


def fit_all_reduce(rows: Sequence[AllReduceRow]) -> AllReduceModel:
    return AllReduceModel({w: fit_all_reduce_one(rs) for w, rs in _by_workers(rows).items()})


#: Size bands the all-reduce errors are reported in: (label, from bytes, below bytes).
AR_BANDS = (("<1MiB", 0, 1 << 20), ("1-4MiB", 1 << 20, 4 << 20), (">=4MiB", 4 << 20, 1 << 62))


def all_reduce_heldout(rows: Sequence[AllReduceRow]) -> dict[int, dict[str, ErrorStats]]:
    """Per worker count: fit on every other size, errors on the sizes left out, overall and
    by size band. The table has run-to-run noise of +-30 % under 1 MiB, so there the median
    is the meaningful figure."""
    out = {}
    for w, rs in _by_workers(rows).items():
        fit, test = fit_all_reduce_one(rs[::2]), rs[1::2]
        bands = {"all": test} | {
            name: [r for r in test if lo <= r.nbytes < hi] for name, lo, hi in AR_BANDS
        }
        out[w] = {
            name: error_stats([fit.time(r.nbytes) for r in sel], [r.median_ms * 1e-3 for r in sel])
            for name, sel in bands.items()
        }
    return out


# ---------------------------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------------------------


def _stats(s: ErrorStats) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in s._asdict().items()}


def fit_compute_profile(gpu: str = "h100-sxm", date: str = "") -> ComputeProfile:
    """Fit every model from the shipped tables and record how well each one fits."""
    rows = read_layer_rows()
    ar_rows = read_all_reduce_rows()
    gemm = fit_gemm(rows)
    attention = fit_attention()
    provenance: dict[str, Any] = {
        "source": "Vidur H100 profiles (microsoft/vidur 7d47513363ec447a741ac5e47241580b47724fbf,"
        " MIT) via hicache/data/vidur; FA3 points of HARDWARE.md C7 (pytorch/benchmark PR"
        " #2391); fitted by bench/fit_compute.py",
        "date": date,
        "tables": [str(p.relative_to(MLP_TABLE.parents[3])) for p in (MLP_TABLE, ALL_REDUCE_TABLE)],
        "measured": "GEMM/elementwise and all-reduce: yes (H100 SXM, fp16); attention: published",
        "linear_eval_tokens": list(EVAL_TOKENS),
        "lomo_linear_s_pct": {k: _stats(v) for k, v in leave_one_model_out(rows).items()},
        "in_sample_linear_s_pct": {k: _stats(v) for k, v in in_sample(gemm, rows).items()},
        "attention_point_err_pct": {
            str(k): round(v, 3) for k, v in attention_point_errors(attention).items()
        },
        "attention_causal_ratio_err_pct": {
            str(k): round(v, 3) for k, v in causal_ratio_errors(attention).items()
        },
        "all_reduce_heldout_pct": {
            str(w): {band: _stats(s) for band, s in bands.items()}
            for w, bands in all_reduce_heldout(ar_rows).items()
        },
    }
    return ComputeProfile(
        gpu=gpu,
        gemm=gemm,
        attention=attention,
        all_reduce=fit_all_reduce(ar_rows),
        provenance=provenance,
    )


__all__ = [
    "AR_BANDS",
    "EVAL_TOKENS",
    "H100_PEAK_FLOPS",
    "ErrorStats",
    "OpSample",
    "all_reduce_heldout",
    "attention_point_errors",
    "causal_ratio",
    "causal_ratio_errors",
    "error_stats",
    "fit_all_reduce",
    "fit_all_reduce_one",
    "fit_attention",
    "fit_compute_profile",
    "fit_gemm",
    "in_sample",
    "layer_of",
    "leave_one_model_out",
    "levenberg_marquardt",
    "linear_errors",
    "measured_linear_s",
    "models_of",
    "op_samples",
]
