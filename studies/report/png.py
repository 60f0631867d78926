"""The stand-alone hit-rate figure of the cache-only replay (``hicache-sim hitrate --plot``,
the demo's ``hitrate.png``): Agg backend, object-oriented API."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from traces.fsutil import write_atomic


def plot_hitrate(
    rows: list[dict[str, Any]], out: Path, title: str = "", series: str | None = None
) -> Path:
    """Hit rate vs device capacity (log x), one line per policy; host part shown dashed.

    ``series`` names the row field that labels a line (default: eviction + write policy).
    The infinite-capacity hit rate, if present, is drawn as the ceiling. The file format
    follows the suffix of ``out`` (matplotlib's default, PNG, without one); the file is
    written atomically.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        label = str(r[series]) if series else f"{r['eviction']} / {r['write_policy']}"
        if not series and not r.get("host_tokens"):
            label = f"{r['eviction']} / no host tier"
        groups[label].append(r)
    fig = Figure(figsize=(8, 5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["device_tokens"])
        xs = [r["device_tokens"] for r in rs]
        (line,) = ax.plot(xs, [r["hit_rate"] for r in rs], marker="o", label=f"{label} (total)")
        if any(r["host_hit_rate"] for r in rs):
            ax.plot(
                xs,
                [r["device_hit_rate"] for r in rs],
                ls="--",
                color=line.get_color(),
                alpha=0.7,
                label=f"{label} (device part)",
            )
    inf = next(
        (r["infinite_capacity_hit_rate"] for r in rows if "infinite_capacity_hit_rate" in r), None
    )
    if inf is not None:
        ax.axhline(inf, color="black", lw=1, ls=":", label=f"infinite capacity ({inf:.1%})")
    ax.set_xscale("log")
    ax.set_xlabel("device (HBM) KV capacity [tokens]")
    ax.set_ylabel("prompt tokens served from cache [fraction]")
    ax.set_ylim(0, 1 if inf is None else min(1.0, inf * 1.25 + 0.02))
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "hit rate vs capacity")
    ax.legend(fontsize=8, loc="best")
    # the temporary file's name says nothing of the format: name it from out
    fmt = out.suffix[1:] or matplotlib.rcParams["savefig.format"]
    meta = {"Software": None} if out.suffix == ".png" else None
    write_atomic(out, lambda tmp: fig.savefig(tmp, format=fmt, metadata=meta))
    return out
