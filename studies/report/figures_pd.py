"""The report's figures of PD runs (``pd.enabled``): TTFT step by step through both roles, the
KV transfer (the links' load over time and each request's transfer against its size) and each
role's occupancy over time (its servers' pools, and where its requests are). Each returns None
when no run is a PD run. The numbers come from :mod:`studies.report.derive_pd`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from studies.report.canvas import ReportFigure, frame, new_figure
from studies.report.derive import MAX_TIMELINE_RUNS, mean_used, peak_used, timeline_runs
from studies.report.derive_pd import (
    LINK_BINS,
    MAX_POINTS,
    PD_PARTS,
    STAGES,
    TIMELINE_COUNTS,
    link_load,
    link_totals,
    pd_runs,
    role_occupancy,
    stage_counts,
    transfer_points,
    ttft_parts,
)
from studies.report.figures_traffic import _legend, _shade_warmup, _steps, _window_data
from studies.report.fmt import ms, num, pct, sig, tokens
from studies.report.load import ReportData, Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_PART_COLORS = ("#fdbf6f", "#b2df8a", "#9e9e9e", "#1f78b4", "#fb9a99", "#e31a1c", "#cab2d6")
_STAGE_COLORS = {
    "prefill": ("#9e9e9e", "#fdbf6f", "#1f78b4", "#e31a1c"),
    "decode": ("#33a02c", "#fdbf6f", "#9e9e9e", "#cab2d6"),
}
_POOL_COLORS = ("#1f78b4", "#fdbf6f", "#b2df8a")
_HOST_COLOR, _LINE_COLOR = "#6a3d9a", "#000000"
_WARMUP = " Requests of the warm-up window are left out, as in summary.json."


def _warmup(runs: Sequence[Run]) -> str:
    return _WARMUP if any(r.warmup_window_s is not None for r in runs) else ""


# --- TTFT ------------------------------------------------------------------------------------


def fig_pd_ttft(data: ReportData) -> ReportFigure | None:
    """Mean TTFT of each PD run split into its steps (:data:`PD_PARTS`), one stacked bar."""
    runs = pd_runs(data)
    if not runs:
        return None
    parts = [p for p, _, _ in PD_PARTS]
    rows: list[dict[str, Any]] = [
        {"run": r.label, "dir": r.shown, **{k: sig(v) for k, v in ttft_parts(r).items()}}
        for r in runs
    ]
    fig = new_figure(11.0, 1.5 + 0.3 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(rows)))
    left = [0.0] * len(rows)
    for part, color in zip(parts, _PART_COLORS, strict=True):
        vals = [1e3 * (r[part] or 0.0) for r in rows]
        ax.barh(ys, vals, 0.7, left=left, color=color, label=part)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(ys, [r["run"] for r in rows])
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, max(max(left, default=0.0), 1e-9) * 1.03)
    ax.set_xlabel("mean time per request [ms]")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Where a PD request's TTFT goes")
    fig.legend(loc="outside right upper")
    numbers = frame(
        [{"run": r["run"], **{f"{p} [ms]": ms(r[p]) for p in parts}, "TTFT [ms]": ms(r["ttft"]),
          "TPOT [ms]": ms(r["tpot"])} for r in rows],
        ["run", *(f"{p} [ms]" for p in parts), "TTFT [ms]", "TPOT [ms]"],
    )  # fmt: skip
    return ReportFigure(
        "fig-pd-ttft",
        "PD: TTFT step by step",
        "Mean time to first token of a PD run's finished requests, step by step: waiting for "
        "pages on the decode server (pre-allocation), the bootstrap to the prefill server, its "
        "waiting queue, the prefill itself (load stalls included), the wait for the prefill "
        "server's KV link, the transfer, and the wait until the decode server merges the "
        "request and streams its first token. The steps add up to the TTFT; TPOT is the "
        "decode server's." + _warmup(runs),
        fig,
        {"parts": parts, "rows": rows},
        numbers,
    )


# --- the KV transfer -------------------------------------------------------------------------


def _link_axes(busy: Axes, rate: Axes, r: Run, s: Mapping[str, Any]) -> None:
    """One run's link busy share (mean over links, busiest link) and throughput over time."""
    from matplotlib.ticker import PercentFormatter

    n = int(r.summary.get("pd_config", {}).get("prefill_instances", 1))
    busy.step(*_steps(s, "busy_mean"), where="post", color="#1f78b4", lw=1.2,
              label=f"mean of the {n} link(s)")  # fmt: skip
    if n > 1:
        busy.step(*_steps(s, "busy_max"), where="post", color="#e31a1c", lw=0.9,
                  label="busiest link")  # fmt: skip
    # rarely saturated: scale to the peak (at least 5 %) so that bursts stay visible
    peak = max((v or 0.0 for k in ("busy_mean", "busy_max") for v in s[k]), default=0.0)
    busy.set_ylim(0, min(1.02, max(0.05, peak * 1.15)))
    busy.yaxis.set_major_formatter(PercentFormatter(1.0))
    busy.set_title(f"{r.label}: KV links busy", fontsize=9)
    busy.set_ylabel("busy [% of time]")
    rate.step(*_steps(s, "gb_s"), where="post", color="#33a02c", lw=1.1)
    rate.set_ylim(bottom=0)
    rate.set_title("KV sent, all links", fontsize=9)
    rate.set_ylabel("[GB/s per rank]")


def _scatter_axes(ax: Axes, p: Mapping[str, Any]) -> None:
    """Each request's time on the link and its wait before it, against the KV it sent."""
    ax.scatter(p["mb"], p["wait_ms"], s=6, color="#fb9a99", alpha=0.6, lw=0,
               label="wait for the link")  # fmt: skip
    ax.scatter(p["mb"], p["transfer_ms"], s=6, color="#e31a1c", lw=0, label="on the link")
    ax.set_xlabel("KV sent [MB per rank]")
    ax.set_ylabel("[ms]")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.set_title("per request", fontsize=9)


def fig_pd_transfer(data: ReportData) -> ReportFigure | None:
    """Per PD run: the KV links' busy share and throughput over time, and each request's
    transfer time and link wait against its size."""
    picked = timeline_runs(data, pd=True)
    if not picked:
        return None
    series = [{"run": r.label, "dir": r.shown, **link_load(r), **_window_data(r)} for r in picked]
    points = [{"run": r.label, **transfer_points(r)} for r in picked]
    fig = new_figure(13.0, 0.9 + 2.3 * len(picked))
    axes = fig.subplots(len(picked), 3, squeeze=False)
    for i, (r, s, p) in enumerate(zip(picked, series, points, strict=True)):
        busy, rate, scatter = axes[i]
        _link_axes(busy, rate, r, s)
        _scatter_axes(scatter, p)
        busy.sharex(rate)
        _shade_warmup((busy, rate), r)
        for ax in (busy, rate, scatter):
            ax.grid(True, alpha=0.3)
        if i == len(picked) - 1:
            busy.set_xlabel("simulated time [s]")
            rate.set_xlabel("simulated time [s]")
        if i == 0:
            scatter.legend(loc="upper left", fontsize=8, markerscale=2)
    _legend(fig, axes[0][0], picked, 2)
    rows = []
    for r in picked:
        s, t = r.summary, link_totals(r)
        rows.append(
            {
                "run": r.label,
                "transfer mean [ms]": ms(s.get("transfer_mean_s")),
                "p90 [ms]": ms(s.get("transfer_p90_s")),
                "link wait [ms]": ms(s.get("transfer_wait_mean_s")),
                "GB per rank": num(s.get("transfer_bytes_per_rank", 0) / 1e9),
                "links busy": pct(t["busy_mean"]),
                "busiest": pct(t["busy_max"]),
            }
        )
    numbers = frame(rows, ["run", "transfer mean [ms]", "p90 [ms]", "link wait [ms]",
                           "GB per rank", "links busy", "busiest"])  # fmt: skip
    return ReportFigure(
        "fig-pd-transfer",
        "PD: the KV transfer",
        f"Left: the share of time the prefill servers' KV links (one per prefill server, its "
        f"transfers one after another) were sending, in {LINK_BINS} equal time bins: the mean "
        "over the links and the busiest one. Middle: KV sent per second, all links together "
        "(bytes per rank: every TP rank sends its own slice over its own NIC). Right: each "
        "finished request's time on the link and its wait for the link, against the KV it "
        f"sent (at most {MAX_POINTS:,} requests, evenly picked). The table's busy shares are "
        "over the whole run." + _warmup(picked) + _others(data, picked),
        fig,
        {"bins": LINK_BINS, "runs": series, "requests": points},
        numbers,
    )


def _others(data: ReportData, picked: Sequence[Run]) -> str:
    n = len(pd_runs(data))
    if len(picked) == n:
        return ""
    return f" {len(picked)} of the {n} PD runs are shown (at most {MAX_TIMELINE_RUNS})."


# --- each role's occupancy -------------------------------------------------------------------


def _pool_axes(ax: Axes, r: Run, role: str, s: Mapping[str, Any]) -> None:
    """A role's HBM pool stacked by part and its host pool in use (mean over its servers)."""
    from matplotlib.ticker import PercentFormatter

    xs = _steps(s, "requests")[0]
    ys = [_steps(s, k)[1] for k in ("requests", "locked", "evictable")]
    ax.stackplot(
        xs,
        ys,
        colors=_POOL_COLORS,
        step="post",
        labels=("running requests", "locked (in use, in flight)", "cached, evictable"),
    )
    if s["host"]:
        ax.step(*_steps(s, "host"), where="post", color=_HOST_COLOR, lw=1.1, ls="--",
                label="host pool in use")  # fmt: skip
    device, host = r.role_pools(role)
    pools = f"{tokens(device)} HBM" + (f" + {tokens(host)} host" if host else "")
    ax.set_title(f"{role} servers' pools ({pools} tokens each)", fontsize=9)
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("% of pool")


def _stage_axes(ax: Axes, r: Run, role: str, s: Mapping[str, Any], legend: bool) -> None:
    """Where the role's requests are, stacked by stage, and the timeline's own count."""
    names = [st for st, _, _ in STAGES[role]]
    xs = _steps(s, names[0])[0]
    ax.stackplot(xs, [_steps(s, n)[1] for n in names], colors=_STAGE_COLORS[role], step="post",
                 labels=names)  # fmt: skip
    ax.step(*_steps(s, "timeline"), where="post", color=_LINE_COLOR, lw=0.9,
            label=TIMELINE_COUNTS[role][1])  # fmt: skip
    ax.set_ylim(bottom=0)
    label = r.label if len(r.label) <= 60 else r.label[:57] + "..."
    ax.set_title(f"{label}: {role} requests, all servers", fontsize=9)
    ax.set_ylabel("requests")
    if legend:
        ax.legend(loc="upper left", fontsize=7, framealpha=0.8)


def _queue(role: str) -> str:
    """The stage the table's "queued" column reads: the waiting queue (prefill), the
    prealloc queue (decode)."""
    return "waiting queue" if role == "prefill" else "prealloc queue"


def fig_pd_occupancy(data: ReportData) -> ReportFigure | None:
    """Per PD run and role: the servers' pools over time and where the requests are."""
    picked = timeline_runs(data, pd=True)
    if not picked:
        return None
    runs: list[dict[str, Any]] = []
    for r in picked:
        one: dict[str, Any] = {"run": r.label, "dir": r.shown, **_window_data(r)}
        for role in ("prefill", "decode"):
            one[role] = {"pools": role_occupancy(r, role), "requests": stage_counts(r, role)}
        runs.append(one)
    fig = new_figure(13.0, 0.8 + 2.0 * 2 * len(picked))
    axes = fig.subplots(2 * len(picked), 2, squeeze=False, sharex=True)
    for i, (r, one) in enumerate(zip(picked, runs, strict=True)):
        for j, role in enumerate(("prefill", "decode")):
            pool_ax, req_ax = axes[2 * i + j]
            _pool_axes(pool_ax, r, role, one[role]["pools"])
            _stage_axes(req_ax, r, role, one[role]["requests"], legend=i == 0)
            _shade_warmup((pool_ax, req_ax), r)
            for ax in (pool_ax, req_ax):
                ax.grid(True, alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("simulated time [s]")
    _legend(fig, axes[0][0], picked, 4)
    rows = []
    for one in runs:
        for role in ("prefill", "decode"):
            p, q = one[role]["pools"], one[role]["requests"]
            waiting = max((v or 0.0 for v in q[_queue(role)]), default=0.0)
            rows.append({"run": one["run"], "role": role, "HBM used, mean": pct(mean_used(p)),
                         "HBM used, peak": pct(peak_used(p)),
                         "host used, peak": pct(max((v or 0.0 for v in p["host"]),
                                                    default=float("nan"))),
                         "queued, peak": num(waiting, 1)})  # fmt: skip
    cols = ["run", "role", "HBM used, mean", "HBM used, peak", "host used, peak", "queued, peak"]
    return ReportFigure(
        "fig-pd-occupancy",
        "PD: each role's occupancy over time",
        "Per PD run, a row per role. Left: the device (HBM) KV pool of the role's servers, "
        "stacked (tokens of running requests, locked cache, evictable cached tokens; the rest "
        "is free), and the host pool in use, as fractions of one server's "
        "pools, the mean over the role's servers. Right: where the role's finished requests "
        "are, stacked by SGLang's queues (prefill: waiting queue at the bottom, then bootstrap "
        "queue, prefilling, inflight while its KV is sent; decode: decoding at the bottom, "
        "then prealloc queue, transfer queue, waiting to merge), time-averaged per bin, all "
        "servers together; the line is the timeline's own count (sampled per scheduler "
        "iteration) of the bottom layer: the waiting queue (prefill), the running batch "
        "(decode). The table's queued peak is the highest bin of the prefill waiting queue and of "
        "the decode prealloc queue." + _others(data, picked),
        fig,
        {"runs": runs},
        frame(rows, cols),
    )
