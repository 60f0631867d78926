"""The report's figures of the KV pools and the host link: HBM and host occupancy over time,
PCIe traffic over time, and tokens written to vs loaded back from the host."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from studies.report.canvas import ReportFigure, frame, new_figure
from studies.report.derive import (
    PCIE_BINS,
    mean_used,
    occupancy,
    pcie,
    pcie_totals,
    peak_used,
    timeline_runs,
    write_traffic,
)
from studies.report.fmt import integer, num, pct, tokens
from studies.report.load import ReportData, Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_D2H_COLOR, _H2D_COLOR = "#d95f02", "#1b9e77"


def _steps(s: Mapping[str, Any], key: str) -> tuple[list[float], list[float]]:
    """Bin starts + the final edge, and per-bin values + the last repeated: a "post" step
    line that covers the last bin too."""
    xs = [*s["t_s"], s["t_s"][-1] + s["width_s"][-1]]
    ys = [v or 0.0 for v in s[key]]
    return xs, [*ys, ys[-1]] if ys else ys


def _picked_note(data: ReportData, picked: Sequence[Run]) -> str:
    pd = bool(picked) and picked[0].is_pd
    kind = [r for r in data.runs if r.is_pd == pd]
    others = len(data.runs) - len(kind)
    other = (
        (f" The {others} single-server run(s) are in the HBM, host and PCIe figures." if pd
         else f" The {others} PD run(s) are in the PD figures, per role.")
        if others else ""
    )  # fmt: skip
    if len(picked) == len(kind):
        return other
    return (
        f" {len(picked)} of {len(kind)} runs are shown: one per series, at its "
        f"median {'capacity' if data.x == 'capacity' else 'rate'}." + other
    )


#: The warm-up window's span in the figures over time, and its legend label.
WARMUP_COLOR = "#bdbdbd"
WARMUP_LABEL = "warm-up (not counted)"


def _shade_warmup(axes: Sequence[Axes], r: Run) -> None:
    """Shade ``r``'s warm-up window (if any) on each of ``axes``, behind the data."""
    window = r.warmup_window_s
    if window is None:
        return
    for ax in axes:
        ax.axvspan(*window, color=WARMUP_COLOR, alpha=0.35, lw=0, zorder=0)


def _legend(fig: Figure, ax: Axes, picked: Sequence[Run], ncols: int) -> None:
    """The figure's legend: ``ax``'s entries, plus the warm-up span when a run shown has one."""
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    if any(r.warmup_window_s is not None for r in picked):
        handles.append(Patch(facecolor=WARMUP_COLOR, alpha=0.35, label=WARMUP_LABEL))
        labels.append(WARMUP_LABEL)
        ncols += 1
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols)


def _window_data(r: Run) -> dict[str, Any]:
    """``{"warmup_window_s": [start, end]}`` for the figure data of a run with a warm-up
    window, ``{}`` otherwise (runs without one keep their data as before)."""
    window = r.warmup_window_s
    return {} if window is None else {"warmup_window_s": list(window)}


def _warmup_caption(picked: Sequence[Run], totals: str = "") -> str:
    """The caption's sentence on the warm-up span ("" when no run shown has a window);
    ``totals``: what the figure's table leaves out of the window, if anything."""
    if not any(r.warmup_window_s is not None for r in picked):
        return ""
    return (
        " The grey span is the warm-up window: its requests ran, and show here over time, "
        f"but are left out of every figure of requests{totals}."
    )


def _token_axis(ax: Axes) -> None:
    """Token counts as x tick labels: 16.4K, 2M."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens(v)))


# --- occupancy -------------------------------------------------------------------------------


def _occupancy_axes(left: Axes, right: Axes, r: Run, s: Mapping[str, Any]) -> None:
    """One run's row: the HBM pool stacked by part (left), the host pool in use (right)."""
    from matplotlib.ticker import PercentFormatter

    xs = _steps(s, "requests")[0]
    ys = [_steps(s, k)[1] for k in ("requests", "locked", "evictable")]
    left.stackplot(
        xs,
        ys,
        labels=("running requests", "locked (in use, in flight)", "cached, evictable"),
        colors=("#1f78b4", "#fdbf6f", "#b2df8a"),
        step="post",
    )
    left.set_title(f"{r.label}: HBM KV pool ({tokens(r.device_tokens)} tokens)", fontsize=9)
    left.set_ylabel("% of pool")
    if s["host"]:
        right.step(*_steps(s, "host"), where="post", color="#6a3d9a")
        right.set_title(f"host KV pool ({tokens(r.host_tokens)} tokens)", fontsize=9)
    else:
        right.text(0.5, 0.5, "no host tier", ha="center", va="center", transform=right.transAxes)
    for ax in (left, right):
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(True, alpha=0.3)


def fig_occupancy(data: ReportData) -> ReportFigure | None:
    """HBM (stacked: running requests, locked, evictable cache) and host pool use over time;
    None when every run is a PD run (their pools per role: :mod:`studies.report.figures_pd`)."""
    picked = timeline_runs(data)
    if not picked:
        return None
    series: list[dict[str, Any]] = [
        {"run": r.label, "dir": r.shown, **occupancy(r), **_window_data(r)} for r in picked
    ]
    fig = new_figure(12.0, 0.7 + 2.0 * len(picked))
    axes = fig.subplots(len(picked), 2, squeeze=False, sharex="row")
    for i, (r, s) in enumerate(zip(picked, series, strict=True)):
        left, right = axes[i]
        _occupancy_axes(left, right, r, s)
        _shade_warmup((left, right), r)
        if i == len(picked) - 1:
            left.set_xlabel("simulated time [s]")
            right.set_xlabel("simulated time [s]")
    _legend(fig, axes[0][0], picked, 3)
    numbers = frame(
        [
            {
                "run": s["run"],
                "HBM used, mean": pct(mean_used(s)),
                "HBM used, peak": pct(peak_used(s)),
                "host used, peak": pct(max((v or 0.0 for v in s["host"]), default=math.nan)),
            }
            for s in series
        ],
        ["run", "HBM used, mean", "HBM used, peak", "host used, peak"],
    )
    return ReportFigure(
        "fig-occupancy",
        "HBM and host occupancy over time",
        "Left: the device (HBM) KV pool, stacked: tokens of running requests, locked cache "
        "(in use by a request or a copy in flight), and evictable cached tokens; the rest is "
        "free. Right: the host (DRAM) pool in use."
        + _warmup_caption(picked)
        + _picked_note(data, picked),
        fig,
        {"runs": series},
        numbers,
    )


# --- PCIe ------------------------------------------------------------------------------------


def _pcie_axes(busy_ax: Axes, rate_ax: Axes, r: Run, s: Mapping[str, Any]) -> None:
    """One run's row: link busy fraction (left) and throughput (right), both directions."""
    from matplotlib.ticker import PercentFormatter

    names = {"d2h": "device → host (writes)", "h2d": "host → device (loads)"}
    colors = {"d2h": _D2H_COLOR, "h2d": _H2D_COLOR}
    for d in ("d2h", "h2d"):
        busy_ax.step(*_steps(s, f"{d}_busy"), where="post", color=colors[d], label=names[d], lw=1.1)
        rate_ax.step(*_steps(s, f"{d}_gb_s"), where="post", color=colors[d], lw=1.1)
    if not r.host_tokens:
        for ax in (busy_ax, rate_ax):
            ax.text(0.5, 0.5, "no host tier", ha="center", va="center", transform=ax.transAxes)
    busy_ax.set_title(f"{r.label}: link busy", fontsize=9)
    busy_ax.set_ylabel("busy [% of time]")
    # a link is rarely saturated: scale to the peak (at least 5 %) so bursts stay visible
    peak = max((v or 0.0 for d in ("d2h", "h2d") for v in s[f"{d}_busy"]), default=0.0)
    busy_ax.set_ylim(0, min(1.02, max(0.05, peak * 1.15)))
    busy_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    rate_ax.set_title("throughput", fontsize=9)
    rate_ax.set_ylabel("[GB/s]")
    rate_ax.set_ylim(bottom=0)
    for ax in (busy_ax, rate_ax):
        ax.grid(True, alpha=0.3)


def fig_pcie(data: ReportData) -> ReportFigure | None:
    """PCIe busy fraction and throughput per direction over time; None when every run is a
    PD run."""
    picked = timeline_runs(data)
    if not picked:
        return None
    series: list[dict[str, Any]] = [
        {"run": r.label, "dir": r.shown, **pcie(r), **_window_data(r)} for r in picked
    ]
    fig = new_figure(12.0, 0.7 + 2.0 * len(picked))
    axes = fig.subplots(len(picked), 2, squeeze=False, sharex="row")
    for i, (r, s) in enumerate(zip(picked, series, strict=True)):
        busy_ax, rate_ax = axes[i]
        _pcie_axes(busy_ax, rate_ax, r, s)
        _shade_warmup((busy_ax, rate_ax), r)
        if i == len(picked) - 1:
            busy_ax.set_xlabel("simulated time [s]")
            rate_ax.set_xlabel("simulated time [s]")
    _legend(fig, axes[0][0], picked, 2)
    rows = []
    for r in picked:
        totals = pcie_totals(r)
        row: dict[str, Any] = {"run": r.label}
        for d in ("d2h", "h2d"):
            row[f"{d} busy"] = pct(totals[f"{d}_busy"])
            row[f"{d} GB"] = num(totals[f"{d}_gb"])
        rows.append(row)
    numbers = frame(rows, ["run", "d2h busy", "d2h GB", "h2d busy", "h2d GB"])
    return ReportFigure(
        "fig-pcie",
        "PCIe traffic over time",
        f"Per direction of the host link, in {PCIE_BINS} equal time bins: the fraction of time "
        "a copy was in service, and the throughput (a copy's bytes spread over its service "
        "time). Device → host are write-through/back copies, host → device are load-backs."
        + _warmup_caption(picked, " and of the table's totals (copies from its end on)")
        + _picked_note(data, picked),
        fig,
        {"bins": PCIE_BINS, "runs": series},
        numbers,
    )


# --- write amplification ---------------------------------------------------------------------


#: Runs drawn in the write-amplification chart (the table lists all).
MAX_WRITE_BARS = 12


def _amplification_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Highest write amplification first: writes never loaded back (no amplification, but
    something written) before any ratio, runs without a host tier (nothing to copy) last;
    ties in run order."""

    def key(r: dict[str, Any]) -> tuple[int, float]:
        amp = r["write_amplification"]
        if amp is not None:
            return (1, -float(amp))
        if r["host"] and r["tokens_written"]:
            return (0, -float(r["tokens_written"]))
        return (2, 0.0)

    return sorted(rows, key=key)


def _write_bars(ax: Axes, rows: list[dict[str, Any]]) -> None:
    """Per run, tokens written (D2H) and loaded back (H2D) side by side, the write
    amplification noted beside them."""
    ys = list(range(len(rows)))
    ax.barh(
        [y - 0.19 for y in ys],
        [r["tokens_written"] for r in rows],
        0.38,
        color=_D2H_COLOR,
        label="written to host (D2H)",
    )
    ax.barh(
        [y + 0.19 for y in ys],
        [r["tokens_loaded"] for r in rows],
        0.38,
        color=_H2D_COLOR,
        label="loaded back (H2D)",
    )
    for y, r in zip(ys, rows, strict=True):
        amp = r["write_amplification"]
        note = (
            "no host tier"
            if not r["host"]
            else f"× {amp:.2f}"
            if amp is not None
            else "nothing loaded back"
        )
        ax.annotate(
            note,
            (max(r["tokens_written"], r["tokens_loaded"]), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
        )
    ax.set_yticks(ys, [r["run"] for r in rows])


def fig_writes(data: ReportData) -> ReportFigure:
    """Tokens written to the host vs loaded back, per run: with many runs, the
    :data:`MAX_WRITE_BARS` of highest write amplification (the table has them all)."""
    rows = [
        {"run": r.label, "dir": r.shown, "host": r.host_tokens > 0, **write_traffic(r)}
        for r in data.runs
    ]
    ranked = _amplification_order(rows)
    drawn = ranked[:MAX_WRITE_BARS] if len(rows) > MAX_WRITE_BARS else rows
    fig = new_figure(11.0, 1.4 + 0.36 * len(drawn))
    ax = fig.add_subplot(1, 1, 1)
    _write_bars(ax, drawn)
    ax.invert_yaxis()
    _token_axis(ax)
    ax.set_xlabel("tokens copied [tokens]")
    ax.margins(x=0.12)
    ax.grid(True, axis="x", alpha=0.3)
    title = "Write amplification: tokens written to the host vs loaded back"
    ax.set_title(title if drawn is rows else f"{title}\n({len(drawn)} of {len(rows)} runs: "
                 "the highest write amplification)")  # fmt: skip
    fig.legend(loc="outside right upper")
    numbers = frame(
        [
            {
                "run": r["run"],
                "written": integer(r["tokens_written"]),
                "loaded": integer(r["tokens_loaded"]),
                "written / loaded": num(r["write_amplification"]),
                "excess writes": integer(r["excess_writes"]),
            }
            for r in (rows if drawn is rows else ranked)
        ],
        ["run", "written", "loaded", "written / loaded", "excess writes"],
    )
    shown = (
        ""
        if drawn is rows
        else f" The chart shows the {len(drawn)} of {len(rows)} runs with the highest write "
        "amplification (writes never loaded back first); the table lists every run, in the "
        "same order."
    )
    return ReportFigure(
        "fig-writes",
        "Tokens written vs loaded back",
        "Tokens copied from HBM to the host pool and from the host back to HBM. The number "
        "beside the bars is the write amplification, tokens written per token loaded back; "
        "excess writes (written − loaded) bound from below the copies never read back."
        + (
            " Copies that started in the warm-up window are left out, as in summary.json."
            if data.any_warmup
            else ""
        )
        + shown,
        fig,
        {"rows": rows, "drawn": [r["run"] for r in drawn]},
        numbers,
    )
