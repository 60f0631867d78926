"""Derived metrics of runs: TTFT quantiles and breakdown, pool occupancy and PCIe traffic over
time, write traffic, and the comparison table with its best cells."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from studies.report.fmt import integer, ms, num, pct, sig
from studies.report.load import ReportData, Run

if TYPE_CHECKING:
    import pandas as pd

#: Runs drawn in the per-run time-series figures (more would be unreadable).
MAX_TIMELINE_RUNS = 6
CDF_POINTS = 200
TIME_POINTS = 200  # occupancy bins
PCIE_BINS = 120


def quantile_grid() -> list[float]:
    """The probabilities k/CDF_POINTS, k = 1..CDF_POINTS, of :func:`ttft_quantiles`."""
    return [k / CDF_POINTS for k in range(1, CDF_POINTS + 1)]


def ttft_quantiles(run: Run) -> list[float]:
    """TTFT at probabilities k/CDF_POINTS (k = 1..CDF_POINTS) over finished requests (the
    warm-up window's left out, :meth:`~studies.report.load.Run.finished`), nearest rank
    (numpy ``inverted_cdf``): every point is a measured TTFT."""
    import numpy as np

    ttft = run.finished()["ttft_s"].dropna().to_numpy(dtype=float)
    if not len(ttft):
        return []
    q = np.quantile(ttft, quantile_grid(), method="inverted_cdf")
    return [sig(float(v)) or 0.0 for v in q]


def pick(values: Sequence[Any], n: int) -> list[Any]:
    """At most ``n`` of ``values``, evenly spread, first and last kept."""
    if len(values) <= n:
        return list(values)
    idx = sorted({round(i * (len(values) - 1) / (n - 1)) for i in range(n)})
    return [values[i] for i in idx]


BREAKDOWN_PARTS = ("prefetch wait", "queueing", "load stall", "prefill compute", "other")


def ttft_breakdown(run: Run) -> dict[str, float]:
    """Mean seconds per finished request (warm-up left out): L3 prefetch wait (arrival until
    its prefetch ended; 0 without an L3 tier), queueing (the rest of arrival to admission),
    load stall (waiting for host->device loads), prefill compute, and other (the rest of the
    TTFT: waiting between prefill chunks and for batch slots); plus the mean TTFT."""
    req = run.finished()
    if not len(req):
        return {p: math.nan for p in (*BREAKDOWN_PARTS, "ttft")}
    q, stall, pre, ttft = (
        float(req[c].mean()) for c in ("queue_s", "load_stall_s", "prefill_s", "ttft_s")
    )
    # runs written before the L3 tier have no prefetch column
    wait = float(req["prefetch_wait_s"].mean()) if "prefetch_wait_s" in req else 0.0
    return {
        "prefetch wait": wait,
        "queueing": max(0.0, q - wait),
        "load stall": stall,
        "prefill compute": pre,
        "other": max(0.0, ttft - q - stall - pre),
        "ttft": ttft,
    }


def warmup_note(data: ReportData) -> str:
    """What the runs' warm-up windows left out, one sentence ("" when no run has one):
    "Warm-up: the first 120 s (1,234 requests) ran but count in no figure ...". Runs with
    different windows or counts are listed per window, with the range of counts."""
    by_window: dict[float, list[int]] = {}
    for r in data.runs:
        if r.warmup_window_s is not None:
            by_window.setdefault(r.warmup_s, []).append(r.warmup_requests)
    if not by_window:
        return ""
    parts = []
    for window_s, counts in sorted(by_window.items()):
        lo, hi = min(counts), max(counts)
        n = f"{lo:,} requests" if lo == hi else f"{lo:,} to {hi:,} requests per run"
        parts.append(f"the first {window_s:g} s ({n})")
    without = sum(1 for r in data.runs if r.warmup_window_s is None)
    others = f" ({without} run(s) without a window count every request)" if without else ""
    return (
        f"Warm-up: {' and '.join(parts)} ran but count in no figure or table{others}, as in "
        "summary.json; the figures over time show the whole run and shade the window."
    )


def timeline_runs(data: ReportData, pd: bool = False) -> list[Run]:
    """The runs drawn over time: all if few; else one per series (at that series' median
    capacity or rate), at most MAX_TIMELINE_RUNS. Runs of one kind: without ``pd`` those of
    one server or a cluster, with it the PD runs (whose figures over time are per role,
    :mod:`studies.report.figures_pd`)."""
    runs = [r for r in data.runs if r.is_pd == pd]
    if len(runs) <= MAX_TIMELINE_RUNS:
        return runs
    picked = []
    for s in data.series_order():
        members = sorted((r for r in runs if r.series == s), key=data.x_value)
        if members:
            picked.append(members[(len(members) - 1) // 2])
    return picked[:MAX_TIMELINE_RUNS]


def time_edges(run: Run, bins: int) -> Any:
    """``bins + 1`` equal bin edges over the simulated time (one empty bin if it is 0)."""
    import numpy as np

    end = float(run.summary["sim_duration_s"])
    return np.linspace(0.0, end, bins + 1) if end > 0 else np.zeros(2)


def occupancy(run: Run, bins: int = TIME_POINTS) -> dict[str, list[float | None]]:
    """Pool occupancy, time-averaged over ``bins`` equal bins of the simulated time (bin
    start ``t_s``, width ``width_s``). The timeline is a step function: each sample holds
    until the next (the last one to the end), nothing is used before the first. HBM parts are
    fractions of the device pool, host use a fraction of the host pool ([] without one).
    Averages, not point samples: a fast-changing pool does not alias into spikes. A cluster's
    fractions are the mean over its instances (each against its own pools)."""
    return instances_occupancy(run, run.table("timeline"), run.capacity, bins)


def instances_occupancy(
    run: Run, tl: Any, pools: tuple[int, int], bins: int = TIME_POINTS
) -> dict[str, list[float | None]]:
    """:func:`occupancy` of the timeline rows ``tl`` (one server's, or several servers' with
    an ``instance`` column: the mean of their fractions), each server's pools ``pools``
    (device, host tokens)."""
    if "instance" in tl and tl["instance"].nunique() > 1:
        parts = [
            _occupancy(run, g.reset_index(drop=True), bins, pools)
            for _, g in tl.groupby("instance")
        ]
        out = dict(parts[0])
        for key in ("requests", "locked", "evictable", "host"):
            cols = [p[key] for p in parts]
            out[key] = [_mean_or_none([c[i] for c in cols]) for i in range(len(cols[0]))]
        return out
    return _occupancy(run, tl.reset_index(drop=True), bins, pools)


def _mean_or_none(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sig(sum(got) / len(got)) if got else None


def step_means(tl: Any, col: str, edges: Any) -> Any:
    """Per bin between ``edges``, the time average of timeline column ``col`` read as a step
    function (each sample holds until the next, the last one to the end; nothing before the
    first)."""
    import numpy as np

    width = np.diff(edges)
    t = tl["t_s"].to_numpy(dtype=float)
    # integral of the step function from 0 to each edge: the whole segments before the edge
    # (cumulative) plus the part of the segment the edge falls in
    idx = np.searchsorted(t, edges, side="right") - 1
    dt = np.diff(t, append=t[-1] if len(t) else 0.0)
    v = tl[col].to_numpy(dtype=float)
    before = np.concatenate(([0.0], np.cumsum(v * dt)))
    k = np.maximum(idx, 0)
    area = np.where(idx >= 0, before[k] + v[k] * (edges - t[k]) if len(t) else 0.0, 0.0)
    return np.diff(area) / np.where(width > 0, width, 1.0)


def _occupancy(
    run: Run, tl: Any, bins: int, pools: tuple[int, int]
) -> dict[str, list[float | None]]:
    import numpy as np

    edges = time_edges(run, bins)
    width = np.diff(edges)

    def mean_per_bin(col: str) -> Any:
        return step_means(tl, col, edges)

    dev = float(pools[0])
    host = float(pools[1])
    out: dict[str, list[float | None]] = {
        "t_s": [sig(float(x)) for x in edges[:-1]],
        "width_s": [sig(float(w)) for w in width],
    }
    for key, col in (
        ("requests", "device_request_tokens"),
        ("locked", "device_protected_tokens"),
        ("evictable", "device_evictable_tokens"),
    ):
        out[key] = [sig(float(v) / dev) for v in mean_per_bin(col)]
    out["host"] = [sig(float(v) / host) for v in mean_per_bin("host_used_tokens")] if host else []
    return out


def _used(s: Mapping[str, Any]) -> list[float]:
    return [
        sum(s[k][i] or 0.0 for k in ("requests", "locked", "evictable"))
        for i in range(len(s["t_s"]))
    ]


def mean_used(s: Mapping[str, Any]) -> float:
    """Mean HBM pool use (all parts) of an :func:`occupancy` result; NaN without bins."""
    u = _used(s)
    return sum(u) / len(u) if u else math.nan


def peak_used(s: Mapping[str, Any]) -> float:
    """Peak HBM pool use (all parts, bin averages) of an :func:`occupancy` result."""
    return max(_used(s), default=math.nan)


def pcie(run: Run, bins: int = PCIE_BINS) -> dict[str, list[float | None]]:
    """Per direction, over ``bins`` equal time bins of the simulated time: the busy fraction
    (time a copy was in service / bin width; a cluster's mean over its instances' links) and
    throughput (GB/s, 1 GB = 1e9 B, all links together; a copy's bytes spread evenly over its
    service time, all at once if it took no time)."""
    import numpy as np

    tr = run.table("transfers")
    edges = time_edges(run, bins)
    width = np.diff(edges)
    out: dict[str, list[float | None]] = {
        "t_s": [sig(float(t)) for t in edges[:-1]],
        "width_s": [sig(float(w)) for w in width],
    }
    for d in ("d2h", "h2d"):
        sel = tr[tr["direction"] == d]
        start = sel["start_s"].to_numpy(dtype=float)
        dur = sel["end_s"].to_numpy(dtype=float) - start
        nbytes = sel["bytes"].to_numpy(dtype=float)
        busy, moved = served_by(start, dur, nbytes, edges)
        safe = np.where(width > 0, width, 1.0)
        out[f"{d}_busy"] = [sig(float(v)) for v in np.diff(busy) / safe / run.instances]
        out[f"{d}_gb_s"] = [sig(float(v)) for v in np.diff(moved) / safe / 1e9]
    return out


def served_by(start: Any, dur: Any, nbytes: Any, edges: Any) -> tuple[Any, Any]:
    """At each of ``edges``: the service time of the intervals ``[start, start + dur)`` so far
    (summed over them) and the bytes they moved so far (an interval's ``nbytes`` spread
    evenly over it, all at once if it took no time). ``np.diff`` of either is per bin."""
    import numpy as np

    busy = np.zeros(len(edges))
    moved = np.zeros(len(edges))
    for lo in range(0, len(start), 4096):  # bounded memory: edges x 4096 at a time
        s, du, b = start[lo : lo + 4096], dur[lo : lo + 4096], nbytes[lo : lo + 4096]
        elapsed = np.clip(edges[:, None] - s[None, :], 0.0, du[None, :])
        busy += elapsed.sum(axis=1)
        frac = np.where(
            du[None, :] > 0,
            elapsed / np.where(du > 0, du, 1.0)[None, :],
            (edges[:, None] >= s[None, :]).astype(float),
        )
        moved += (frac * b[None, :]).sum(axis=1)
    return busy, moved


def pcie_totals(run: Run) -> dict[str, float]:
    """Per direction over the run (with a warm-up window, as summary.json: the copies that
    started after it, over the time after it): the busy fraction of the link (``d2h_busy``, a
    cluster's mean over its links; NaN when that took no simulated time) and the gigabytes
    moved (``d2h_gb``, all links)."""
    tr = run.measured_transfers()
    window = run.warmup_window_s
    span_s = float(run.summary["sim_duration_s"]) - (window[1] if window else 0.0)
    out: dict[str, float] = {}
    for d in ("d2h", "h2d"):
        sel = tr[tr["direction"] == d]
        busy = float((sel["end_s"] - sel["start_s"]).sum())
        out[f"{d}_busy"] = busy / span_s / run.instances if span_s > 0 else math.nan
        out[f"{d}_gb"] = float(sel["bytes"].sum()) / 1e9
    return out


def write_traffic(run: Run) -> dict[str, Any]:
    """Tokens copied to the host (D2H pages x page size), loaded back (H2D), the write
    amplification (written / loaded; None when nothing was loaded) and the excess writes
    (written - loaded: a lower bound on copies that were never read back). With a warm-up
    window, the copies that started after it (as summary.json's PCIe bytes)."""
    tr = run.measured_transfers()
    written = int(tr.loc[tr["direction"] == "d2h", "pages"].sum()) * run.page_size
    loaded = int(tr.loc[tr["direction"] == "h2d", "pages"].sum()) * run.page_size
    return {
        "tokens_written": written,
        "tokens_loaded": loaded,
        "write_amplification": written / loaded if loaded else None,
        "excess_writes": max(0, written - loaded),
    }


#: One comparison column: (title, summary/derived key, formatter, best is "max" | "min" | None).
Column = tuple[str, str, Callable[[Any], str], str | None]
#: Comparison columns.
COMPARISON: tuple[Column, ...] = (
    ("HBM pool [tokens]", "device_tokens", integer, None),
    ("host pool [tokens]", "host_tokens", integer, None),
    ("hit rate", "hit_rate", pct, "max"),
    ("device hits", "device_hit_rate", pct, "max"),
    ("host hits", "host_hit_rate", pct, "max"),
    ("L3 hits", "storage_hit_rate", pct, "max"),
    ("TTFT mean [ms]", "ttft_mean_s", ms, "min"),
    ("TTFT p50 [ms]", "ttft_p50_s", ms, "min"),
    ("TTFT p90 [ms]", "ttft_p90_s", ms, "min"),
    ("TTFT p99 [ms]", "ttft_p99_s", ms, "min"),
    ("TPOT mean [ms]", "tpot_mean_s", ms, "min"),
    ("E2E mean [s]", "e2e_mean_s", num, "min"),
    ("queueing mean [ms]", "queue_mean_s", ms, "min"),
    ("output [tok/s]", "throughput_output_tok_s", lambda x: num(x, 0), "max"),
    ("D2H [GB]", "gb_d2h", num, None),
    ("H2D [GB]", "gb_h2d", num, None),
    ("written / loaded", "write_amplification", num, "min"),
    ("prefetch wait mean [ms]", "prefetch_wait_mean_s", ms, None),
    ("L3 read [GB]", "gb_l3_read", num, None),
    ("L3 written [GB]", "gb_l3_written", num, None),
    ("retractions", "retractions", integer, "min"),
    ("rejected", "rejected_requests", integer, "min"),
)


#: Comparison columns shown only when some run has an L3 tier (empty for the others).
L3_COLUMNS = ("storage_hit_rate", "prefetch_wait_mean_s", "gb_l3_read", "gb_l3_written")


def comparison_columns(data: ReportData) -> tuple[Column, ...]:
    """The :data:`COMPARISON` columns that apply to ``data``: the L3 ones
    (:data:`L3_COLUMNS`) only when some run has an L3 tier."""
    if data.any_l3:
        return COMPARISON
    return tuple(c for c in COMPARISON if c[1] not in L3_COLUMNS)


def comparison_table(data: ReportData) -> pd.DataFrame:
    """One row per run (index: its label), the raw numbers of :func:`comparison_columns`
    (the L3 columns are None for a run without an L3 tier)."""
    import pandas as pd

    columns = comparison_columns(data)
    rows = []
    for r in data.runs:
        s = r.summary
        row: dict[str, Any] = {"device_tokens": r.device_tokens, "host_tokens": r.host_tokens}
        row.update({k: s.get(k) for _, k, _, _ in columns if k in s})
        row["gb_d2h"] = s["bytes_d2h"] / 1e9
        row["gb_h2d"] = s["bytes_h2d"] / 1e9
        row["write_amplification"] = write_traffic(r)["write_amplification"]
        st = r.storage
        if st is None:
            row["storage_hit_rate"] = row["prefetch_wait_mean_s"] = None
        else:
            row["gb_l3_read"] = st.get("bytes_read", 0) / 1e9
            row["gb_l3_written"] = st.get("bytes_written", 0) / 1e9
        rows.append(row)
    return pd.DataFrame(
        rows, index=[r.label for r in data.runs], columns=[k for _, k, _, _ in columns]
    )


def best_cells(table: pd.DataFrame) -> dict[str, set[str]]:
    """For each metric with a direction, the run labels holding its best value (ties all
    count; runs without a value left out); nothing when there is only one run."""
    out: dict[str, set[str]] = {}
    if len(table) < 2:
        return out
    for _, key, _, how in COMPARISON:
        if how is None or key not in table:
            continue
        col = table[key].astype(float)
        col = col[col.notna()]
        if len(col) and col.nunique() > 1:
            target = col.max() if how == "max" else col.min()
            out[key] = {str(i) for i in col.index[col == target]}
    return out
