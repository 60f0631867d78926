"""The stand-alone hit-rate figure of the cache-only replay (``hicache-sim hitrate --plot``,
the demo's ``hitrate.png``): the report's study figure
(:func:`studies.report.figures_hitrate.draw_hitrate_study`) on its own Agg canvas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traces.fsutil import write_atomic


def plot_hitrate(
    rows: list[dict[str, Any]], out: Path, title: str = "", series: str | None = None
) -> Path:
    """Hit rate vs device capacity (log x), one line per policy; the device part dashed.

    ``series`` names the row field that labels a line (default: what differs among
    eviction, write policy, page size and outputs). The infinite-capacity hit rate, if
    present, is drawn as the ceiling; the y axis starts at zero. The file format follows the
    suffix of ``out`` (matplotlib's default, PNG, without one); the file is written
    atomically.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from studies.report.canvas import RC
    from studies.report.figures_hitrate import draw_hitrate_study

    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(9.5, 5), dpi=110, layout="constrained")
        FigureCanvasAgg(fig)
        draw_hitrate_study(fig, rows, title or "hit rate vs capacity", series)
        # the temporary file's name says nothing of the format: name it from out
        fmt = out.suffix[1:] or matplotlib.rcParams["savefig.format"]
        meta = {"Software": None} if out.suffix == ".png" else None
        write_atomic(out, lambda tmp: fig.savefig(tmp, format=fmt, metadata=meta))
    return out
