"""The report's figures of hit rate and TTFT (the pool and traffic figures are in
:mod:`studies.report.figures_traffic`, the L3 storage traffic in
:mod:`studies.report.figures_storage`), and :func:`report_figures`, all of them in order.

Each ``fig_*`` function takes the :class:`~studies.report.load.ReportData` and returns a
:class:`~studies.report.canvas.ReportFigure`: the figure, the exact data it plots and the
numbers shown beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from studies.report.canvas import (
    MARKERS,
    RC,
    ReportFigure,
    dodge,
    frame,
    new_figure,
    series_colors,
    series_legend,
    tint,
)
from studies.report.derive import (
    BREAKDOWN_PARTS,
    pick,
    quantile_grid,
    ttft_breakdown,
    ttft_quantiles,
)
from studies.report.figures_pd import fig_pd_occupancy, fig_pd_transfer, fig_pd_ttft
from studies.report.figures_storage import fig_storage
from studies.report.figures_traffic import fig_occupancy, fig_pcie, fig_writes
from studies.report.fmt import capacity_text, ms, pct, sig, tokens
from studies.report.load import ReportData

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: How the storage (L3) part of a hit-rate bar is drawn: cross-hatched on a lighter tint.
_L3_HATCH = "xxx"
_L3_TINT = 0.8
#: Panels of the TTFT CDF figure (one per capacity or rate).
MAX_CDF_PANELS = 6
_PART_COLORS = {
    "prefetch wait": "#ff7f00",
    "queueing": "#9e9e9e",
    "load stall": "#e31a1c",
    "prefill compute": "#1f78b4",
    "other": "#cab2d6",
}


def _warmup_sentence(data: ReportData) -> str:
    """The captions' note on the warm-up window ("" when no run has one)."""
    if not data.any_warmup:
        return ""
    return " Requests of the warm-up window are left out, as in summary.json."


# --- hit rate --------------------------------------------------------------------------------


def _hitrate_rows(data: ReportData, groups: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """One row per run, grouped by capacity (``groups`` order), with its hit rates
    (``storage_hit_rate`` 0 and ``l3`` false for a run without an L3 tier)."""
    rows: list[dict[str, Any]] = []
    for cap in groups:
        for run in data.runs:
            if run.capacity == cap:
                s = run.summary
                rows.append(
                    {
                        "run": run.label,
                        "dir": run.shown,
                        "series": run.series,
                        "device_tokens": cap[0],
                        "host_tokens": cap[1],
                        "device_hit_rate": s["device_hit_rate"],
                        "host_hit_rate": s["host_hit_rate"],
                        # runs without an L3 tier (and runs written before it) have none
                        "storage_hit_rate": run.rate("storage_hit_rate"),
                        "hit_rate": s["hit_rate"],
                        "l3": run.has_l3,
                    }
                )
    return rows


def _hitrate_bars(
    ax: Axes, data: ReportData, groups: Sequence[tuple[int, int]], rows: list[dict[str, Any]]
) -> None:
    """Per capacity group, a bar per run: device part solid, host part hatched on top, and
    the storage (L3) part cross-hatched on a lighter tint above it (runs with an L3 tier)."""
    colors = series_colors(data)
    per_group = max(
        sum(1 for r in rows if (r["device_tokens"], r["host_tokens"]) == g) for g in groups
    )
    width = 0.8 / per_group
    for gi, cap in enumerate(groups):
        members = [r for r in rows if (r["device_tokens"], r["host_tokens"]) == cap]
        for j, r in enumerate(members):
            x = gi + (j - (len(members) - 1) / 2) * width
            c = colors[r["series"]]
            ax.bar(x, r["device_hit_rate"], width * 0.9, color=c, edgecolor=c)
            # the hatch takes the edge colour: the full series colour on a light tint of it
            ax.bar(
                x,
                r["host_hit_rate"],
                width * 0.9,
                bottom=r["device_hit_rate"],
                facecolor=tint(c),
                hatch="///",
                edgecolor=c,
                linewidth=0.8,
            )
            if r["l3"]:
                ax.bar(
                    x,
                    r["storage_hit_rate"],
                    width * 0.9,
                    bottom=r["device_hit_rate"] + r["host_hit_rate"],
                    facecolor=tint(c, _L3_TINT),
                    hatch=_L3_HATCH,
                    edgecolor=c,
                    linewidth=0.8,
                )


def fig_hitrate(data: ReportData) -> ReportFigure:
    """Hit rate vs KV capacity: one bar per run, grouped by capacity, coloured by series;
    the device (HBM) part solid, the host (DRAM) part hatched on top, and, when some run has
    an L3 tier, its storage part cross-hatched above that."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    groups = sorted({r.capacity for r in data.runs}, key=lambda c: (c[0] + c[1], c[0]))
    rows = _hitrate_rows(data, groups)
    legend_in = 0.8 + 0.07 * max((len(s) for s in data.series_order()), default=0)
    fig = new_figure(max(7.0, min(14.0, 2.0 + 0.35 * len(rows))) + max(0.0, legend_in - 2.2), 4.6)
    ax = fig.add_subplot(1, 1, 1)
    _hitrate_bars(ax, data, groups, rows)
    ax.set_xticks(range(len(groups)), [capacity_text(g).replace(" + ", "\n+ ") for g in groups])
    ax.set_xlabel("KV capacity: device (HBM) + host (DRAM) pool [tokens]")
    ax.set_ylabel("prompt tokens served from cache [%]")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    top = max((r["hit_rate"] for r in rows), default=1.0)
    ax.set_ylim(0, min(1.0, top * 1.15 + 0.02))
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Hit rate vs capacity")
    parts = [
        Patch(facecolor="#555555", edgecolor="#555555", label="device (HBM) hits"),
        Patch(
            facecolor=tint("#555555"), hatch="///", edgecolor="#555555", label="host (DRAM) hits"
        ),
    ]
    l3 = data.any_l3
    if l3:
        parts.append(
            Patch(
                facecolor=tint("#555555", _L3_TINT),
                hatch=_L3_HATCH,
                edgecolor="#555555",
                label="storage (L3) hits",
            )
        )
    series_legend(fig, data, parts)
    numbers = frame(
        [
            {
                "run": r["run"],
                "capacity": capacity_text((r["device_tokens"], r["host_tokens"])),
                "device": pct(r["device_hit_rate"]),
                "host": pct(r["host_hit_rate"]),
                "L3": pct(r["storage_hit_rate"]) if r["l3"] else "–",
                "total": pct(r["hit_rate"]),
            }
            for r in rows
        ],
        ["run", "capacity", "device", "host", *(["L3"] if l3 else []), "total"],
    )
    storage = (
        ", and the storage (L3) part, pages prefetched from the L3 store into the host pool "
        "before admission, cross-hatched above that (runs with an L3 tier; the store is not "
        "part of the capacity)"
        if l3
        else ""
    )
    return ReportFigure(
        "fig-hitrate",
        "Hit rate vs capacity",
        "Share of prompt tokens served from the cache instead of recomputed, per run: the "
        f"device (HBM) part solid, the host (DRAM) part hatched on top{storage}. Bars are "
        "grouped by the KV capacity of the run (device pool + host pool, in tokens)."
        + (
            " A PD run's capacity and hits are its prefill servers' (one server's pools); the "
            "decode side's are in the per-role tables."
            if any(r.is_pd for r in data.runs)
            else ""
        )
        + _warmup_sentence(data),
        fig,
        {"rows": rows, "tiers": ["device", "host", "storage"] if l3 else ["device", "host"]},
        numbers,
    )


# --- TTFT ------------------------------------------------------------------------------------


def _cdf_lines(data: ReportData, panels: Sequence[float]) -> list[dict[str, Any]]:
    """One line per run shown, panel by panel, with its TTFT quantiles."""
    lines: list[dict[str, Any]] = []
    for xv in panels:
        for r in data.runs:
            if data.x_value(r) == xv:
                lines.append(
                    {
                        "run": r.label,
                        "dir": r.shown,
                        "series": r.series,
                        "panel": data.x_title(r),
                        "ttft_s": ttft_quantiles(r),
                    }
                )
    return lines


def _cdf_panels(fig: Figure, data: ReportData, lines: list[dict[str, Any]], n_panels: int) -> None:
    """The CDF panels, up to 3 a row, axes shared; log TTFT when it spans over 20x."""
    probs = quantile_grid()
    colors = series_colors(data)
    ncols = min(3, n_panels)
    nrows = math.ceil(n_panels / ncols)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    every = [v for ln in lines for v in ln["ttft_s"]]
    log = bool(every) and min(every) > 0 and max(every) / min(every) > 20
    titles = list(dict.fromkeys(ln["panel"] for ln in lines))
    for i, title in enumerate(titles):
        ax = axes[i // ncols][i % ncols]
        for ln in lines:
            if ln["panel"] == title and ln["ttft_s"]:
                ax.plot(
                    ln["ttft_s"], probs, drawstyle="steps-post", color=colors[ln["series"]], lw=1.4
                )
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if log:
            ax.set_xscale("log")
        if i // ncols == nrows - 1 or i + ncols >= len(titles):
            ax.set_xlabel("TTFT [s]")
        if i % ncols == 0:
            ax.set_ylabel("requests with TTFT ≤ x [fraction]")
    for j in range(len(titles), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)


def _ttft_numbers(data: ReportData) -> pd.DataFrame:
    """TTFT p50 / p90 / p99 / mean of each run, from its summary."""
    return frame(
        [
            {
                "run": r.label,
                "p50 [ms]": ms(r.summary["ttft_p50_s"]),
                "p90 [ms]": ms(r.summary["ttft_p90_s"]),
                "p99 [ms]": ms(r.summary["ttft_p99_s"]),
                "mean [ms]": ms(r.summary["ttft_mean_s"]),
            }
            for r in data.runs
        ],
        ["run", "p50 [ms]", "p90 [ms]", "p99 [ms]", "mean [ms]"],
    )


def fig_ttft_cdf(data: ReportData) -> ReportFigure:
    """TTFT CDF per series, one panel per capacity (or request rate)."""
    panels_all = sorted({data.x_value(r) for r in data.runs})
    panels = pick(panels_all, MAX_CDF_PANELS)
    lines = _cdf_lines(data, panels)
    ncols = min(3, len(panels))
    # room for the legend beside the panels: long series labels need more than one panel has
    legend_in = max(2.2, 0.8 + 0.07 * max((len(s) for s in data.series_order()), default=0))
    fig = new_figure(4.0 * ncols + legend_in, 3.2 * math.ceil(len(panels) / ncols) + 0.4)
    _cdf_panels(fig, data, lines, len(panels))
    series_legend(fig, data)
    fig.suptitle("TTFT distribution (CDF)")
    what = "capacities" if data.x == "capacity" else "rates"
    shown = (
        ""
        if len(panels) == len(panels_all)
        else f" {len(panels)} of the {len(panels_all)} {what} are shown (evenly spread)."
    )
    return ReportFigure(
        "fig-ttft-cdf",
        "TTFT distribution",
        "Fraction of finished requests whose time to first token is at most x, one line per "
        f"series, one panel per {'KV capacity' if data.x == 'capacity' else 'request rate'}."
        + _warmup_sentence(data)
        + shown,
        fig,
        {"probabilities": quantile_grid(), "lines": lines},
        _ttft_numbers(data),
    )


def _percentile_axes(
    ax: Axes, p: int, data: ReportData, rows: list[dict[str, Any]], log: bool
) -> None:
    """TTFT percentile ``p`` against the x axis: a line per series, ticks at measured x.
    Series are dodged sideways a little (equal values stay visible side by side, each with
    its own marker) and the axes leave room around the points, so none sits on an edge."""
    from matplotlib.ticker import NullFormatter

    colors = series_colors(data)
    xs = [r["x"] for r in rows]
    order = data.series_order()
    lo, hi = min(xs), max(xs)
    if log:
        step = 0.012 * max(math.log10(hi / lo), 0.5)
    else:
        step = 0.012 * max(hi - lo, abs(hi) * 0.5, 1e-9)
    for k, s in enumerate(order):
        pts = [r for r in rows if r["series"] == s]
        ax.plot(
            [dodge(r["x"], k, len(order), log, step) for r in pts],
            [r[f"ttft_p{p}_s"] for r in pts],
            marker=MARKERS[k % len(MARKERS)],
            color=colors[s],
            lw=1.4,
            ms=6,
            mfc=tint(colors[s], 0.3),
            mec=colors[s],
            clip_on=False,
        )
    ax.set_title(f"TTFT p{p}")
    ax.set_ylabel("TTFT [s]")
    vals = [r[f"ttft_p{p}_s"] for r in rows]
    top = max((v for v in vals if v is not None and math.isfinite(v)), default=1.0)
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    ax.margins(x=0.08)
    ax.grid(True, which="both", alpha=0.3)
    if log:
        ax.set_xscale("log")
    # ticks at the measured x values: log-scale minor labels would be unreadable
    ticks = pick(sorted(set(xs)), 8)
    if data.x == "capacity":
        ax.set_xticks(ticks, [tokens(t) for t in ticks])
        ax.set_xlabel("KV capacity, device + host [tokens]")
    else:
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlabel("request rate [× the trace's rate]")
    ax.xaxis.set_minor_formatter(NullFormatter())


def fig_ttft_percentiles(data: ReportData) -> ReportFigure:
    """TTFT p50 / p90 / p99 vs capacity (or request rate), one line per series."""
    rows: list[dict[str, Any]] = [
        {
            "run": r.label,
            "dir": r.shown,
            "series": r.series,
            "x": data.x_value(r),
            "ttft_p50_s": r.summary["ttft_p50_s"],
            "ttft_p90_s": r.summary["ttft_p90_s"],
            "ttft_p99_s": r.summary["ttft_p99_s"],
        }
        for r in data.runs
    ]
    rows.sort(key=lambda r: (data.series_order().index(r["series"]), r["x"]))
    fig = new_figure(13.0, 3.9)
    xs = [r["x"] for r in rows]
    log = min(xs) > 0 and max(xs) / min(xs) >= 4
    for ax, p in zip(fig.subplots(1, 3), (50, 90, 99), strict=True):
        _percentile_axes(ax, p, data, rows, log)
    series_legend(fig, data, markers=True)
    numbers = frame(
        [
            {
                "run": r["run"],
                "x": tokens(r["x"]) if data.x == "capacity" else f"{r['x']:g}",
                "p50 [ms]": ms(r["ttft_p50_s"]),
                "p90 [ms]": ms(r["ttft_p90_s"]),
                "p99 [ms]": ms(r["ttft_p99_s"]),
            }
            for r in rows
        ],
        ["run", "x", "p50 [ms]", "p90 [ms]", "p99 [ms]"],
    ).rename(columns={"x": "capacity [tokens]" if data.x == "capacity" else "rate ×"})
    what = "KV capacity (device + host pool, tokens)" if data.x == "capacity" else "request rate"
    return ReportFigure(
        "fig-ttft-percentiles",
        f"TTFT percentiles vs {'capacity' if data.x == 'capacity' else 'request rate'}",
        f"Median, 90th and 99th percentile time to first token against the {what}, one line "
        "per series (percentiles interpolated between requests, as in summary.json)."
        + _warmup_sentence(data),
        fig,
        {"x": data.x, "rows": rows},
        numbers,
    )


def fig_ttft_breakdown(data: ReportData) -> ReportFigure | None:
    """Mean TTFT split into its parts, one horizontal stacked bar per run; PD runs have
    theirs (per step of the way through both roles, :mod:`studies.report.figures_pd`): None
    when every run is one."""
    rows: list[dict[str, Any]] = [
        {"run": r.label, "dir": r.shown, **{k: sig(v) for k, v in ttft_breakdown(r).items()}}
        for r in data.runs
        if not r.is_pd
    ]
    if not rows:
        return None
    fig = new_figure(11.0, 1.4 + 0.28 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    left = [0.0] * len(rows)
    ys = list(range(len(rows)))
    for part in BREAKDOWN_PARTS:
        vals = [1e3 * (r[part] or 0.0) for r in rows]
        ax.barh(ys, vals, 0.7, left=left, color=_PART_COLORS[part], label=part)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(ys, [r["run"] for r in rows])
    ax.set_ylim(len(rows) - 0.4, -0.6)  # top to bottom in run order, no empty rows
    ax.set_xlim(0, max(max(left, default=0.0), 1e-9) * 1.03)
    ax.set_xlabel("mean time per request [ms]")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Where TTFT goes")
    fig.legend(loc="outside right upper")
    numbers = frame(
        [
            {
                "run": r["run"],
                **{f"{p} [ms]": ms(r[p]) for p in BREAKDOWN_PARTS},
                "TTFT [ms]": ms(r["ttft"]),
            }
            for r in rows
        ],
        ["run", *(f"{p} [ms]" for p in BREAKDOWN_PARTS), "TTFT [ms]"],
    )
    return ReportFigure(
        "fig-ttft-breakdown",
        "TTFT breakdown",
        "Mean time to first token per request, split into L3 prefetch wait (arrival until the "
        "request's storage prefetch ended; 0 without an L3 tier), queueing (the rest of "
        "arrival to admission), load stall (waiting for host-to-device loads), prefill "
        "compute, and other (waits between prefill chunks and for batch slots)."
        + _warmup_sentence(data)
        + (
            " PD runs have their own breakdown, step by step through both roles."
            if any(r.is_pd for r in data.runs)
            else ""
        ),
        fig,
        {"parts": list(BREAKDOWN_PARTS), "rows": rows},
        numbers,
    )


# --- all of them -----------------------------------------------------------------------------

#: The figures of a report, in order; one that returns None does not apply to the runs (the
#: L3 storage traffic without an L3 tier, the PD figures without a PD run, the pools and
#: PCIe over time when every run is a PD run) and is left out.
FIGURES: tuple[Callable[[ReportData], ReportFigure | None], ...] = (
    fig_hitrate,
    fig_ttft_cdf,
    fig_ttft_percentiles,
    fig_ttft_breakdown,
    fig_pd_ttft,
    fig_occupancy,
    fig_pcie,
    fig_pd_transfer,
    fig_pd_occupancy,
    fig_writes,
    fig_storage,
)


def report_figures(data: ReportData) -> list[ReportFigure]:
    """Every figure of the report for ``data`` that applies to it (see :data:`FIGURES`)."""
    import matplotlib

    with matplotlib.rc_context(RC):
        return [f for f in (make(data) for make in FIGURES) if f is not None]
