"""The report's L3 storage parts: the "L3 storage traffic" figure (only when some run has an L3
tier, ``storage.backend`` not "none") and the rows of the "SGLang 0.5.14 defects this trace
would hit" table (from ``summary.json``'s ``sglang_defects``).

Runs written before the L3 tier have neither a ``storage`` block nor ``sglang_defects``: they
count as runs without an L3 tier and without defect counters.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from studies.report.canvas import ReportFigure, frame, new_figure
from studies.report.fmt import integer, ms, num, sig, tokens
from studies.report.load import ReportData, Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_READ_COLOR, _WRITE_COLOR = "#6a3d9a", "#b15928"
_P50_COLOR, _P90_COLOR = "#a6cee3", "#1f78b4"
_ENDS = (
    ("terminated", "prefetches_terminated", "#33a02c"),
    ("revoked", "prefetches_revoked", "#bdbdbd"),
    ("aborted", "prefetches_aborted", "#e31a1c"),
)
_DISCARD_COLOR = "#ff7f00"


def storage_traffic(run: Run) -> dict[str, Any]:
    """One L3 run's traffic to and from its store (``storage`` block of summary.json) and
    the prefetch waits of its finished requests (warm-up left out) that waited on a prefetch
    (``prefetch_wait_s`` > 0 in requests.parquet): their count, p50 and p90 (interpolated, as
    summary.json's percentiles; None when no request waited)."""
    import numpy as np

    st = run.storage or {}
    req = run.finished()
    waits = (
        req.loc[req["prefetch_wait_s"] > 0, "prefetch_wait_s"].to_numpy(dtype=float)
        if "prefetch_wait_s" in req
        else np.zeros(0)
    )
    p50, p90 = (float(np.quantile(waits, q)) for q in (0.5, 0.9)) if len(waits) else (None, None)
    return {
        "backend": st.get("backend"),
        "bytes_read": int(st.get("bytes_read", 0)),
        "bytes_written": int(st.get("bytes_written", 0)),
        "gb_read": sig(st.get("bytes_read", 0) / 1e9),
        "gb_written": sig(st.get("bytes_written", 0) / 1e9),
        "requests_waited": len(waits),
        "prefetch_wait_p50_s": sig(p50) if p50 is not None else None,
        "prefetch_wait_p90_s": sig(p90) if p90 is not None else None,
        "prefetch_wait_mean_s": sig(float(waits.mean())) if len(waits) else None,
        "prefetches_issued": int(st.get("prefetches_issued", 0)),
        **{key: int(st.get(key, 0)) for _, key, _ in _ENDS},
        "pages_discarded": int(st.get("pages_discarded", 0)),
        "storage_hit_tokens": int(st.get("storage_hit_tokens", 0)),
        "requests_with_l3_hit": int(st.get("requests_with_l3_hit", 0)),
    }


def _pair_bars(
    ax: Axes, ys: list[int], left: list[float], right: list[float], colors: tuple[str, str],
    labels: tuple[str, str],
) -> None:  # fmt: skip
    """Two bars per run, side by side (``left`` above ``right``)."""
    ax.barh([y - 0.19 for y in ys], left, 0.38, color=colors[0], label=labels[0])
    ax.barh([y + 0.19 for y in ys], right, 0.38, color=colors[1], label=labels[1])


def _no_data(ax: Axes, text: str) -> None:
    """An empty panel: the reason in its middle, no ticks."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])


def _ticks(ax: Axes) -> None:
    """At most 5 x ticks, large numbers short (12K, 1.5M): side by side, panels are narrow."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tokens(v) if v >= 1e3 else f"{v:g}"))


def _draw(axes: Any, rows: list[dict[str, Any]]) -> None:
    """The four panels: bytes, prefetch waits, how prefetches ended, discarded pages."""
    ys = list(range(len(rows)))
    traffic, waits, ends, discarded = axes
    _pair_bars(traffic, ys, [r["gb_read"] or 0.0 for r in rows],
               [r["gb_written"] or 0.0 for r in rows], (_READ_COLOR, _WRITE_COLOR),
               ("read from the store (prefetch)", "written to the store (backup)"))  # fmt: skip
    traffic.set_title("bytes to and from the store", fontsize=9)
    traffic.set_xlabel("[GB]")
    _pair_bars(waits, ys, [r["prefetch_wait_p50_s"] or 0.0 for r in rows],
               [r["prefetch_wait_p90_s"] or 0.0 for r in rows], (_P50_COLOR, _P90_COLOR),
               ("prefetch wait p50", "prefetch wait p90"))  # fmt: skip
    if not any(r["requests_waited"] for r in rows):
        _no_data(waits, "no request waited")
    waits.set_title("prefetch wait (requests that waited)", fontsize=9)
    waits.set_xlabel("[s]")
    left = [0.0] * len(rows)
    for label, key, color in _ENDS:
        vals = [float(r[key]) for r in rows]
        ends.barh(ys, vals, 0.6, left=left, color=color, label=f"prefetches {label}")
        left = [a + b for a, b in zip(left, vals, strict=True)]
    if not any(left):
        _no_data(ends, "no prefetch issued")
    ends.set_title("how prefetches ended", fontsize=9)
    ends.set_xlabel("[prefetches]")
    discarded.barh(ys, [r["pages_discarded"] for r in rows], 0.6, color=_DISCARD_COLOR,
                   label="pages read, then discarded")  # fmt: skip
    if not any(r["pages_discarded"] for r in rows):
        _no_data(discarded, "none discarded")
    discarded.set_title("pages read after their prefetch ended", fontsize=9)
    discarded.set_xlabel("[pages]")
    traffic.set_yticks(ys, [r["run"] for r in rows])
    traffic.set_ylim(len(rows) - 0.4, -0.6)  # top to bottom in run order
    for ax in axes:
        ax.grid(True, axis="x", alpha=0.3)
        ax.margins(x=0.1)
        ax.set_xlim(left=0)
        if ax.get_xticks().size:
            _ticks(ax)


def fig_storage(data: ReportData) -> ReportFigure | None:
    """L3 storage traffic per run with an L3 tier: GB read from / written to the store,
    prefetch waits p50/p90, prefetches terminated / revoked / aborted, pages discarded.
    None when no run has an L3 tier (the report then has no such figure)."""
    l3 = [r for r in data.runs if r.has_l3]
    if not l3:
        return None
    rows = [{"run": r.label, "dir": r.shown, **storage_traffic(r)} for r in l3]
    fig = new_figure(13.0, max(2.6, 1.5 + 0.42 * len(rows)))
    axes = fig.subplots(1, 4, sharey=True)
    _draw(axes, rows)
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="outside lower center", ncols=4)
    numbers = frame(
        [
            {
                "run": r["run"],
                "backend": r["backend"],
                "read [GB]": num(r["gb_read"]),
                "written [GB]": num(r["gb_written"]),
                "waited": integer(r["requests_waited"]),
                "wait p50 [ms]": ms(r["prefetch_wait_p50_s"]),
                "wait p90 [ms]": ms(r["prefetch_wait_p90_s"]),
                "issued": integer(r["prefetches_issued"]),
                "terminated": integer(r["prefetches_terminated"]),
                "revoked": integer(r["prefetches_revoked"]),
                "aborted": integer(r["prefetches_aborted"]),
                "discarded pages": integer(r["pages_discarded"]),
            }
            for r in rows
        ],
        ["run", "backend", "read [GB]", "written [GB]", "waited", "wait p50 [ms]",
         "wait p90 [ms]", "issued", "terminated", "revoked", "aborted", "discarded pages"],
    )  # fmt: skip
    without = len(data.runs) - len(l3)
    note = f" The {without} run(s) without an L3 tier are left out." if without else ""
    if any(r.warmup_window_s is not None for r in l3):
        note += (
            " The prefetch waits leave the warm-up window's requests out; the store's bytes "
            "and the prefetch counts are the whole run's (as summary.json's storage block)."
        )
    return ReportFigure(
        "fig-storage",
        "L3 storage traffic",
        "Per run with an L3 storage tier: gigabytes read from the store (prefetches, into the "
        "host pool) and written to it (backups of host pages after their device-to-host copy "
        "was acknowledged), all instances together; the time requests waited on their "
        "prefetch (p50 and p90 over finished requests with a prefetch wait > 0); how "
        "prefetches ended (terminated: the hit pages went into the host pool, when complete "
        "or at the stop policy's deadline; revoked: the store held less than the prefetch "
        "threshold; aborted with their request); and pages still read after their prefetch "
        "was terminated, then discarded." + note,
        fig,
        {"rows": rows},
        numbers,
    )


# --- SGLang 0.5.14 defects -------------------------------------------------------------------


def defect_rows(data: ReportData) -> list[dict[str, Any]] | None:
    """One row per (defect code, run) with a nonzero count, code order then run order:
    ``code, run, dir, count, tokens, what``. None when no run records defect counters (all
    written before the simulator counted them)."""
    recorded = [r for r in data.runs if isinstance(r.summary.get("sglang_defects"), dict)]
    if not recorded:
        return None
    codes: dict[str, None] = {}
    for r in recorded:
        codes.update(dict.fromkeys(r.summary["sglang_defects"]))
    rows = []
    for code in sorted(codes, key=_code_order):
        for r in recorded:
            d = r.summary["sglang_defects"].get(code) or {}
            if int(d.get("count", 0)):
                rows.append(
                    {
                        "code": code,
                        "run": r.label,
                        "dir": r.shown,
                        "count": int(d["count"]),
                        "tokens": int(d.get("tokens", 0)),
                        "what": str(d.get("what", "")),
                    }
                )
    return rows


def _code_order(code: str) -> tuple[int, float, str]:
    """D1 < D2 < ... < D10, then the others (L2LB) by name."""
    if code.startswith("D") and code[1:].isdigit():
        return (0, float(code[1:]), code)
    return (1, math.inf, code)


__all__ = ["defect_rows", "fig_storage", "storage_traffic"]
