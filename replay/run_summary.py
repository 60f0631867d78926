"""What a replay run reports: each op's prediction, the error figures and the large ops'
bandwidth against the plain-copy peak (:func:`summarize_ops`), and a few lines for the
terminal (:func:`format_summary`). :func:`replay.run.run_replay` produces the op table
(columns :data:`OP_COLUMNS`) these read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from hicache.latency import OP_DIRECTION, Profile, op_charges, op_time

OP_COLUMNS = (
    "op_id",
    "kind",
    "direction",
    "backend",
    "layout",
    "nbytes",
    "pages",
    "runs",
    "layers",
    "calls",
    "nodes",
    "issue_s",
    "duration_s",
    "host_s",
    "issue_cpu_s",
)


def predict(profile: Profile, ops: pd.DataFrame) -> np.ndarray:
    """``hicache.latency``'s seconds for each op row (``kind, backend, nbytes, runs, layers``),
    uncoupled (the replay never overlaps the two directions)."""
    out = np.empty(len(ops))
    for i, (kind, b, nb, runs, layers) in enumerate(
        zip(ops.kind, ops.backend, ops.nbytes, ops.runs, ops.layers, strict=True)
    ):
        link = profile.link(str(b), OP_DIRECTION[str(kind)])
        out[i] = op_time(link, op_charges(str(kind), int(nb), int(runs), int(layers)))
    return out


def _stats(err: np.ndarray) -> dict[str, float]:
    if len(err) == 0:
        return {"n": 0, "median": math.nan, "p90": math.nan}
    return {
        "n": len(err),
        "median": float(np.median(err)),
        "p90": float(np.quantile(err, 0.9)),
        "max": float(err.max()),
    }


def summarize_ops(
    ops: pd.DataFrame, peak_Bps: dict[str, float], large_op_bytes: int
) -> dict[str, Any]:
    """Prediction errors (``|predicted - measured| / measured``: median, p90, per direction and
    overall) and the effective bandwidth of large ops against the plain-copy peak.

    ``large_ops``: ops of at least ``large_op_bytes``, however fragmented (the largest tenth when
    there are none that large). ``large_contiguous_ops``: those of them that are one contiguous
    run (the largest single-run ops when there are none): the copies that *can* reach the peak,
    which the >= 90 % target is about; fragmented ones pay per-run costs by design."""
    out: dict[str, Any] = {"ops": len(ops)}
    if ops.empty:
        return out
    err = ops.rel_err.to_numpy()
    out["error"] = {"all": _stats(err)}
    large: dict[str, Any] = {}
    contiguous: dict[str, Any] = {}

    def bw_row(sel: pd.DataFrame, how: str, d: str) -> dict[str, Any]:
        bw = float((sel.nbytes / sel.duration_s).median())
        return {
            "selection": how,
            "n": len(sel),
            "median_Bps": bw,
            "peak_Bps": peak_Bps.get(d, math.nan),
            "fraction_of_peak": bw / peak_Bps[d] if d in peak_Bps else math.nan,
        }

    for d in ("d2h", "h2d"):
        sel = ops[ops.direction == d]
        out["error"][d] = _stats(sel.rel_err.to_numpy())
        if sel.empty:
            continue
        big = sel[sel.nbytes >= large_op_bytes]
        how = f">= {large_op_bytes:,} B"
        if big.empty:
            # no op that large in this trace: use the largest tenth instead, and say so
            big = sel[sel.nbytes >= sel.nbytes.quantile(0.9)]
            how = f"largest 10% (>= {int(big.nbytes.min()):,} B)"
        large[d] = bw_row(big, how, d)
        one = big[big.runs == 1]
        how1 = f"{how}, one contiguous run"
        if one.empty:
            single = sel[sel.runs == 1]
            if single.empty:
                continue
            one = single[single.nbytes >= single.nbytes.quantile(0.9)]
            how1 = f"largest 10% of the one-run ops (>= {int(one.nbytes.min()):,} B)"
        contiguous[d] = bw_row(one, how1, d)
    out["large_ops"] = large
    out["large_contiguous_ops"] = contiguous
    out["bytes"] = {d: int(ops[ops.direction == d].nbytes.sum()) for d in ("d2h", "h2d")}
    out["count"] = {k: int((ops.kind == k).sum()) for k in ("write", "load")}
    if "issue_cpu_s" in ops.columns:
        # how much of an op's measured time its issuing thread was busy issuing it: near 1,
        # the op is bound by the CPU side (per-run copy calls, host gathers), not the link
        share = (ops.issue_cpu_s / ops.duration_s).to_numpy()
        out["issue_share"] = {
            "median": float(np.median(share)),
            "issue_bound_fraction": float(np.mean(share >= 0.8)),
        }
    return out


def format_summary(s: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    c = s["cache"]
    lines = [
        f"{s['requests']} requests on {s['device']} ({s['machine'].get('gpu_name', '')}): hit "
        f"rate {c['hit_rate']:.2%}; {s.get('count', {}).get('write', 0)} writes, "
        f"{s.get('count', {}).get('load', 0)} loads; replay {s['replay_s']:.2f} s",
        f"profile: {s['profile']['path'] or 'shipped default'} ({s['profile']['gpu']}, "
        f"measured={s['profile']['measured']})",
    ]
    for d, e in s.get("error", {}).items():
        if e.get("n"):
            lines.append(
                f"  prediction |rel err| {d:>3}: median {e['median']:.1%}, p90 {e['p90']:.1%} "
                f"(n={e['n']})"
            )
    for key, what in (("large_ops", "large"), ("large_contiguous_ops", "large contiguous")):
        for d, v in s.get(key, {}).items():
            lines.append(
                f"  {what} {d} ops ({v['selection']}, n={v['n']}): {v['median_Bps'] / 1e9:.2f} "
                f"GB/s = {v['fraction_of_peak']:.0%} of the plain-copy peak "
                f"{v['peak_Bps'] / 1e9:.2f} GB/s"
            )
    if "issue_share" in s:
        i = s["issue_share"]
        lines.append(
            f"  issuing thread busy for a median {i['median']:.0%} of an op's time; "
            f"{i['issue_bound_fraction']:.0%} of ops issue-bound (>= 80%)"
        )
    return "\n".join(lines)


__all__ = ["OP_COLUMNS", "format_summary", "predict", "summarize_ops"]
