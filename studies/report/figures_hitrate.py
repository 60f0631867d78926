"""The cache-only hit-rate study (rows of :func:`studies.sweep.run_hitrate_grid`, as
``hicache-sim hitrate`` and the demo make them): hit rate vs device capacity, one line per
policy, the device part dashed, the infinite-capacity hit rate as the ceiling; vs the host
pool instead when the rows share one device pool and differ in the host pool.

:func:`fig_hitrate_study` makes it a report figure (with its table);
:func:`draw_hitrate_study` draws it on any figure (the stand-alone plot of
:mod:`studies.report.png` uses it too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from studies.errors import StudyError
from studies.report.canvas import MARKERS, ReportFigure, dodge, frame, new_figure, tint
from studies.report.fmt import missing, pct, sig, tokens

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The row fields kept in the figure's data (the rest are the replay's other counters).
STUDY_FIELDS = (
    "series",
    "eviction",
    "write_policy",
    "page_size",
    "outputs",
    "device_tokens",
    "host_tokens",
    "hit_rate",
    "device_hit_rate",
    "host_hit_rate",
    "storage",
    "storage_tokens",
    "storage_hit_rate",
    "tokens_written",
    "tokens_loaded",
    "requests",
)


def study_labels(
    rows: Sequence[dict[str, Any]], series: str | None = None, host_axis: bool = False
) -> list[str]:
    """A series label per row: the row field ``series`` names when given (the demo's
    ``policy``); else what differs among eviction, write policy, page size and outputs
    ("no host tier" in place of the write policy without a host pool), and the L3 store
    ("no L3", "L3 unlimited", "L3 1.05M") when it differs. Where a series has
    several host pools at one device pool, the host pool is added ("host 16.4K"), unless the
    host pool is the x axis (``host_axis``)."""
    if series is not None:
        labels = [str(r[series]) for r in rows]
    else:
        keys = [k for k in ("eviction", "page_size", "outputs")
                if len({r.get(k) for r in rows}) > 1]  # fmt: skip
        l3 = len({_l3_text(r) for r in rows if r["host_tokens"]}) > 1
        labels = []
        for r in rows:
            parts = [f"page {r[k]}" if k == "page_size" else str(r.get(k)) for k in keys]
            parts.append(str(r["write_policy"]) if r["host_tokens"] else "no host tier")
            if l3 and r["host_tokens"]:
                parts.append(_l3_text(r))
            labels.append(" · ".join(parts))
    hosts: dict[tuple[str, int], set[int]] = {}
    for lab, r in zip(labels, rows, strict=True):
        hosts.setdefault((lab, r["device_tokens"]), set()).add(r["host_tokens"])
    if not host_axis and any(len(h) > 1 for h in hosts.values()):
        labels = [
            f"{lab} · host {tokens(r['host_tokens'])}" if r["host_tokens"] else lab
            for lab, r in zip(labels, rows, strict=True)
        ]
    return labels


def _l3_text(row: dict[str, Any]) -> str:
    """A row's L3 store: "no L3", "L3 unlimited" or "L3 1.05M" (tokens)."""
    if not row.get("storage"):
        return "no L3"
    size = int(row.get("storage_tokens") or 0)
    return f"L3 {tokens(size)}" if size else "L3 unlimited"


def _has_l3(rows: Sequence[dict[str, Any]]) -> bool:
    return any(r.get("storage") for r in rows)


def _tokens(x: Any) -> str:
    return "–" if missing(x) else tokens(float(x))


def _ceiling(rows: Sequence[dict[str, Any]]) -> float | None:
    inf = next((r["infinite_capacity_hit_rate"] for r in rows
                if r.get("infinite_capacity_hit_rate") is not None), None)  # fmt: skip
    return float(inf) if inf is not None else None


def _colors(order: Sequence[str], given: Mapping[str, Any]) -> dict[str, Any]:
    """A colour per series: ``given`` ones (the timed runs' series of the same name), the
    others the next colours of tab10 (tab20 beyond 10) not taken yet."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps["tab10" if len(order) + len(given) <= 10 else "tab20"]
    out = {s: given[s] for s in order if s in given}
    taken = {to_hex(c) for c in out.values()}
    free = (c for c in (cmap(i) for i in range(cmap.N)) if to_hex(c) not in taken)
    for s in order:
        if s not in out:
            out[s] = next(free, "#555555")
    return out


def draw_hitrate_study(
    fig: Figure,
    rows: Sequence[dict[str, Any]],
    title: str,
    series: str | None = None,
    colors: Mapping[str, Any] | None = None,
) -> None:
    """Hit rate (solid, one marker per series), its device part (dashed, when a host tier
    served anything) and, for series with an L3 store, its device + host part (dash-dot: the
    gap to the total is the storage part) vs the device pool, the infinite-capacity hit rate
    dotted; the y axis
    starts at zero. Series are dodged sideways a little so that equal points stay visible.
    ``colors``: colours of series by label (others get free ones)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter, PercentFormatter

    host_axis = x_key(rows) == "host_tokens"
    key = "host_tokens" if host_axis else "device_tokens"
    flat = [r for r in rows if host_axis and not r["host_tokens"]]  # no host tier: a level
    rows = [r for r in rows if r not in flat]
    labels = study_labels(rows, series, host_axis)
    order = list(dict.fromkeys(labels))
    palette = _colors(order, colors or {})
    devs = sorted({int(r[key]) for r in rows})
    log = devs[0] > 0 and devs[-1] / devs[0] >= 4
    step = 0.01 * max(math.log10(devs[-1] / devs[0]), 0.5) if log else 0.01 * devs[-1]
    ax = fig.add_subplot(1, 1, 1)
    handles: list[Any] = []
    dashed = dash_dot = False
    for k, s in enumerate(order):
        pts = sorted((r for lab, r in zip(labels, rows, strict=True) if lab == s),
                     key=lambda r: r[key])  # fmt: skip
        xs = [dodge(r[key], k, len(order), log, step) for r in pts]
        c = palette[s]
        m = MARKERS[k % len(MARKERS)]
        style = {"color": c, "marker": m, "ms": 6, "mfc": tint(c, 0.3), "mec": c}
        ax.plot(xs, [r["hit_rate"] for r in pts], lw=1.6, clip_on=False, **style)
        handles.append(Line2D([], [], lw=1.6, label=s, **style))
        if any(r["host_hit_rate"] for r in pts) or any(r.get("storage_hit_rate") for r in pts):
            dashed = True
            ax.plot(xs, [r["device_hit_rate"] for r in pts], color=c, lw=1.1, ls="--")
        if any(r.get("storage_hit_rate") for r in pts):
            dash_dot = True
            below = [r["device_hit_rate"] + r["host_hit_rate"] for r in pts]
            ax.plot(xs, below, color=c, lw=1.1, ls="-.")
    # one level per distinct hit rate (the write policy does not matter without a host tier)
    for r in {pct(r["hit_rate"]): r for r in flat}.values():
        ax.axhline(r["hit_rate"], color="#888888", lw=1.2, ls="--")
        handles.append(Line2D([], [], color="#888888", lw=1.2, ls="--",
                              label=f"no host tier ({pct(r['hit_rate'])})"))  # fmt: skip
    inf = _ceiling([*rows, *flat])
    top = max([r["hit_rate"] for r in [*rows, *flat]] + ([inf] if inf is not None else []))
    if dashed:
        handles.append(Line2D([], [], color="#444444", lw=1.1, ls="--", label="device (HBM) part"))
    if dash_dot:
        handles.append(
            Line2D(
                [],
                [],
                color="#444444",
                lw=1.1,
                ls="-.",
                label="device + host part",
            )
        )
    if inf is not None:
        ax.axhline(inf, color="black", lw=1.2, ls=":")
        ax.annotate(
            f"infinite capacity: {pct(inf)}",
            (0.01, inf),
            xycoords=("axes fraction", "data"),
            xytext=(0, 3),
            textcoords="offset points",
            va="bottom",
            fontsize=9,
        )
        handles.append(Line2D([], [], color="black", lw=1.2, ls=":", label="infinite capacity"))
    if log:
        ax.set_xscale("log")
    ticks = devs if len(devs) <= 8 else [devs[round(i * (len(devs) - 1) / 7)] for i in range(8)]
    ax.set_xticks(ticks, [tokens(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(x=0.08)
    ax.set_ylim(0, min(1.0, top * 1.15) if top > 0 else 1.0)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(True, alpha=0.3)
    if host_axis:
        ax.set_xlabel(
            f"host (DRAM) KV pool [tokens], device pool {tokens(rows[0]['device_tokens'])}"
        )
    else:
        ax.set_xlabel("device (HBM) KV pool [tokens]")
    ax.set_ylabel("prompt tokens served from cache [%]")
    ax.set_title(title)
    fig.legend(handles=handles, loc="outside right upper", title="series")


def x_key(rows: Sequence[dict[str, Any]]) -> str:
    """The x axis of the study: ``device_tokens``, or ``host_tokens`` when every row has the
    same device pool and the host pools (of the rows that have one) differ."""
    devs = {int(r["device_tokens"]) for r in rows}
    hosts = {int(r["host_tokens"]) for r in rows if r["host_tokens"]}
    return "host_tokens" if len(devs) == 1 and len(hosts) > 1 else "device_tokens"


def fig_hitrate_study(
    rows: Sequence[dict[str, Any]],
    title: str | None = None,
    note: str = "",
    colors: Mapping[str, Any] | None = None,
) -> ReportFigure:
    """The cache-only study as a report figure: the plot, its rows and a table of them
    (series in order of first appearance, then device pool). ``note`` is shown above it,
    ``colors`` colour series by label (:func:`draw_hitrate_study`)."""
    if not rows:
        raise StudyError("the hit-rate study has no rows")
    labels = study_labels(rows, "policy" if all("policy" in r for r in rows) else None)
    order = list(dict.fromkeys(labels))
    ranked = sorted(
        zip(labels, rows, strict=True),
        key=lambda x: (order.index(x[0]), x[1]["device_tokens"], x[1]["host_tokens"]),
    )
    fig = new_figure(8.8, 4.6)
    draw_hitrate_study(fig, [r for _, r in ranked], title or "Hit rate vs device capacity",
                       "policy" if all("policy" in r for r in rows) else None, colors)  # fmt: skip
    inf = _ceiling(rows)
    l3 = _has_l3(rows)
    numbers = frame(
        [
            {
                "series": lab,
                "HBM": tokens(r["device_tokens"]),
                "host": tokens(r["host_tokens"]) if r["host_tokens"] else "–",
                "L3": _l3_text(r).removeprefix("L3 ") if r.get("storage") else "–",
                "hit rate": pct(r["hit_rate"]),
                "device": pct(r["device_hit_rate"]),
                "host hits": pct(r["host_hit_rate"]),
                "L3 hits": pct(r.get("storage_hit_rate")) if r.get("storage") else "–",
                "written": _tokens(r.get("tokens_written")),
                "loaded": _tokens(r.get("tokens_loaded")),
            }
            for lab, r in ranked
        ],
        [
            "series",
            "HBM",
            "host",
            *(["L3"] if l3 else []),
            "hit rate",
            "device",
            "host hits",
            *(["L3 hits"] if l3 else []),
            "written",
            "loaded",
        ],
    ).rename(columns={"HBM": "HBM [tokens]", "host": "host [tokens]", "L3": "L3 [tokens]"})
    data_rows: list[dict[str, Any]] = [
        {**{k: r.get(k) for k in STUDY_FIELDS if k != "series"}, "series": lab} for lab, r in ranked
    ]
    for d in data_rows:
        for k in ("hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate"):
            if d.get(k) is not None:
                d[k] = sig(float(d[k]))
    n = next((r.get("requests") for r in rows if r.get("requests")), None)
    return ReportFigure(
        "fig-hitrate-study",
        "Hit rate vs device capacity (cache-only replay)",
        "Share of prompt tokens served from the cache when the trace is replayed through the "
        "policy core one request at a time, without timing"
        + (f" ({n:,} requests)" if n else "")
        + ": per series the total (solid) and its device (HBM) part (dashed)"
        + (
            ", for series with an L3 store also the device + host part (dash-dot; above it, "
            "the storage part: pages a prefetch at arrival brought from the store, its I/O "
            "taken as instant)"
            if l3
            else ""
        )
        + ", against the device pool; the host pool of each run is in the table. The dotted "
        "line is the "
        "infinite-capacity hit rate"
        + (f" ({pct(inf)})" if inf is not None else "")
        + ", what a cache that never evicts serves: the best any policy can do. Points of "
        "different series at one capacity are drawn slightly apart.",
        fig,
        {"infinite_capacity_hit_rate": inf, "rows": data_rows},
        numbers,
        note,
    )
