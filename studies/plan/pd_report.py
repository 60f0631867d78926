"""A PD plan's figure (``plan.png``) and page (``plan.html``).

The figure: one panel per configuration, the splits the search evaluated (prefill servers
across, decode servers up, both log2), passing filled and failing hollow, the chosen split a
star on its line of equal GPUs. The page: the trace and each role's setup, the targets, what
decode-side HiCache changes (like for like), the notes, the table and the figure (inline
SVG), readable offline."""

from __future__ import annotations

import html
import io
import math
from typing import TYPE_CHECKING, Any

from studies.report.canvas import new_figure

if TYPE_CHECKING:
    from studies.plan.pd import PdConfigPlan, PdPlan


def plot_pd_plan(plan: PdPlan, fmt: str = "png") -> bytes:
    """The figure as ``fmt`` (``png`` or ``svg``) bytes."""
    n = max(1, len(plan.configs))
    fig = new_figure(0.4 + 3.6 * n, 3.8)
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, c in zip(axes, plan.configs, strict=False):
        _panel(ax, c, plan.max_instances)
    buf = io.BytesIO()
    meta = {"Software": None} if fmt == "png" else {"Date": None}
    fig.savefig(buf, format=fmt, metadata=meta)
    return buf.getvalue()


def _panel(ax: Any, c: PdConfigPlan, cap: int) -> None:
    from matplotlib.ticker import FuncFormatter

    ok = [e.point for e in c.evaluations if e.passed]
    bad = [e.point for e in c.evaluations if not e.passed]
    if ok:
        ax.scatter(*zip(*ok, strict=True), color="tab:green", s=22, label="passes")
    if bad:
        ax.scatter(*zip(*bad, strict=True), facecolors="white", edgecolors="tab:red", s=22,
                   label="fails")  # fmt: skip
    ticks = [2**i for i in range(cap.bit_length())]
    if c.split is not None and c.gpus is not None:
        p, d = c.split
        tp_p, tp_d = c.config.prefill.tp, c.config.decode.tp
        top = (c.gpus - tp_d) / tp_p  # the most prefill servers at these GPUs
        xs = [top ** (i / 63) for i in range(64)] if top > 1 else [1.0]
        ax.plot(xs, [(c.gpus - x * tp_p) / tp_d for x in xs], color="gray", linestyle="--",
                linewidth=0.9, label=f"{c.gpus} GPUs")  # fmt: skip
        ax.scatter([p], [d], marker="*", s=160, color="black", zorder=3, label=f"{p}:{d}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_xlim(0.8, cap * 1.25)
    ax.set_ylim(0.8, cap * 1.25)
    ax.set_xlabel("prefill servers")
    ax.set_ylabel("decode servers")
    ax.set_title(c.config.name if not c.config.refused else f"{c.config.name} (not evaluated)",
                 fontsize=9)  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best", frameon=False)


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2rem;max-width:1300px;color:#222}"
    "table{border-collapse:collapse;margin:1rem 0}td,th{padding:.25rem .6rem;"
    "border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child"
    "{text-align:left}th{background:#f4f4f4}figure{margin:1rem 0}svg{max-width:100%;"
    "height:auto}.note{color:#555}"
)
#: The table's columns and their headers.
_COLUMNS = (
    ("configuration", "configuration"), ("split", "prefill:decode"), ("gpus", "GPUs"),
    ("prefill_gpus", "prefill GPUs"), ("decode_gpus", "decode GPUs"),
    ("prefill_servers", "prefill servers"), ("decode_servers", "decode servers"),
    ("gpu_hours", "GPU-hours"),
    ("prefill_host_dram_gb_per_instance", "prefill host DRAM / inst [GB]"),
    ("decode_host_dram_gb_per_instance", "decode host DRAM / inst [GB]"),
    ("prefill_hit_rate", "prefill hit rate"), ("decode_hit_rate", "decode hit rate"),
    ("transfer_bytes_saved_share", "KV bytes saved"),
)  # fmt: skip


def _cell(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if key.endswith(("hit_rate", "_share")):
        return f"{value:.1%}"
    if key.endswith("_s"):
        return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def pd_plan_html(plan: PdPlan) -> str:
    """The page (a string); deterministic for a given plan."""
    from studies.plan.pd_savings import pd_savings_lines

    cols = [*_COLUMNS, *([("cost_usd", "cost [$]")] if plan.gpu_hour_usd > 0 else []),
            *((t.key, t.key.removesuffix("_s")) for t in plan.targets)]  # fmt: skip
    keys = {t.key for t in plan.targets}
    head = "".join(f"<th>{html.escape(name)}</th>" for _, name in cols)
    body = []
    for r in plan.rows():
        cells = []
        for key, _ in cols:
            text = html.escape(_cell(key, r[key]))
            if key == "split" and r[key] is None:
                text = f"none up to {plan.max_instances}:{plan.max_instances}"
            elif r["split"] is None and key in keys:
                text = f"({html.escape(_cell(key, r[f'{key}_best']))} best)"
            elif r.get(f"{key}_lo") is not None:
                text = html.escape(f"{_cell(key, r[key])} [{_cell(key, r[f'{key}_lo'])} – "
                                   f"{_cell(key, r[f'{key}_hi'])}]")  # fmt: skip
            cells.append(f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    targets = ", ".join(t.label for t in plan.targets)
    if plan.slo is not None:
        targets += f"; goodput counts requests with {plan.slo.label}"
    if plan.seeds > 1:
        targets += f"; each judged on the median of {plan.seeds} seeds, in brackets p5 – p95"
    savings = pd_savings_lines(plan) or ["no configuration without the decode radix cache to "
                                         "compare against"]  # fmt: skip
    setups = dict.fromkeys(s for c in plan.configs
                           for s in (c.config.prefill.setup, c.config.decode.setup))  # fmt: skip
    notes = plan.notes()
    trace = f"Trace <code>{html.escape(plan.trace)}</code>. " if plan.trace else ""
    svg = plot_pd_plan(plan, fmt="svg").decode()
    svg = svg[svg.index("<svg") :]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>hicache-sim plan (PD)</title><style>{_STYLE}</style></head><body>"
        "<h1>Capacity plan: prefill/decode split</h1>"
        f"<p>{trace}Setups:</p><ul>{_items(setups)}</ul>"
        f"<p>Targets: {html.escape(targets)}, and not overloaded. The split with the fewest "
        f"GPUs that meets them, up to {plan.max_instances} servers per role (bounds per role "
        "by doubling and bisection, then the staircase of the fewest decode servers per "
        "prefill count; assumes more servers of either role never fail a passing run).</p>"
        f"<h2>What decode-side HiCache changes (like for like)</h2><ul>{_items(savings)}</ul>"
        + (f"<h2>Notes</h2><ul>{_items(notes)}</ul>" if notes else "")
        + f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        '<p class="note">GPUs: prefill servers × prefill model.tp + decode servers × decode '
        "model.tp; GPU-hours: GPUs × the trace's arrival span; servers: each role's instances "
        "placed whole on its own gpu.server. Hit rates: the prefill side's, and the decode "
        "server's own with the decode radix cache. The figures rest on the simulator's "
        "timing profile (FIDELITY.md).</p>"
        f"<figure>{svg}</figure></body></html>\n"
    )


def _items(lines: Any) -> str:
    return "".join(f"<li>{html.escape(s)}</li>" for s in lines)


__all__ = ["pd_plan_html", "plot_pd_plan"]
