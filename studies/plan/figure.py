"""The planning figure: left, the instances each configuration needs (bars; a hatched bar at
the maximum for "more than"); right, one panel per target: the metric against N for every
configuration (log-x), the target a horizontal line, failing runs hollow."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any

from studies.report.canvas import MARKERS, new_figure

if TYPE_CHECKING:
    from studies.plan import Plan


def plot_plan(plan: Plan, fmt: str = "png") -> bytes:
    """The figure as ``fmt`` (``png`` or ``svg``) bytes."""
    from matplotlib import colormaps

    n = len(plan.configs)
    panels = 1 + len(plan.targets)
    fig = new_figure(4.0 + 4.2 * len(plan.targets), max(3.4, 1.2 + 0.32 * n))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    colors = [cmap(i % cmap.N) for i in range(n)]
    _bars(axes[0], plan, colors)
    for ax, target in zip(axes[1:], plan.targets, strict=True):
        _curves(ax, plan, target.key, target.limit, target.label, colors)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    buf = io.BytesIO()
    meta = {"Software": None} if fmt == "png" else {"Date": None}
    fig.savefig(buf, format=fmt, metadata=meta)
    return buf.getvalue()


def _bars(ax: Any, plan: Plan, colors: list[Any]) -> None:
    names = [c.config.name for c in plan.configs]
    ys = list(range(len(names)))[::-1]
    for y, c, color in zip(ys, plan.configs, colors, strict=True):
        over = c.instances is None
        width = plan.max_instances if over else c.instances
        ax.barh(y, width, color=color, hatch="//" if over else None,
                alpha=0.45 if over else 0.9, edgecolor=color)  # fmt: skip
        ax.text(width, y, f" > {plan.max_instances}" if over else f" {c.instances}",
                va="center", fontsize=8)  # fmt: skip
    ax.set_yticks(ys, names, fontsize=8)
    ax.set_xlabel("instances needed")
    ax.set_xlim(0, plan.max_instances * 1.15)
    ax.set_title("instances to meet every target")


def _curves(ax: Any, plan: Plan, key: str, limit: float, label: str, colors: list[Any]) -> None:
    seconds = key.endswith("_s")
    scale = 1e3 if seconds and limit < 1 else 1.0
    unit = (" (ms)" if scale == 1e3 else " (s)") if seconds else ""
    values: list[float] = []
    for k, (c, color) in enumerate(zip(plan.configs, colors, strict=True)):
        pts = [
            (e.instances, float(e.summary.get(key, math.nan)) * scale, e.passed)
            for e in c.evaluations
        ]
        pts = [p for p in pts if math.isfinite(p[1])]
        if not pts:
            continue
        values.extend(p[1] for p in pts)
        marker = MARKERS[k % len(MARKERS)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker,
                markersize=4, linewidth=1.2, label=c.config.name)  # fmt: skip
        fails = [p for p in pts if not p[2]]
        if fails:
            ax.scatter([p[0] for p in fails], [p[1] for p in fails], marker=marker,
                       facecolors="white", edgecolors=color, s=18, zorder=3)  # fmt: skip
    ax.axhline(limit * scale, color="black", linestyle="--", linewidth=1.0, label="target")
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks([2**i for i in range(plan.max_instances.bit_length())])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    positive = [v for v in [*values, limit * scale] if v > 0]
    if positive and max(positive) > 20 * min(positive):  # overloaded runs dwarf the target
        ax.set_yscale("log")
    ax.set_xlabel("instances (N)")
    ax.set_ylabel(f"{key.removesuffix('_s') if seconds else key}{unit}")
    ax.set_title(label)
    ax.grid(True, which="major", alpha=0.3)


__all__ = ["plot_plan"]
