"""What every report figure shares: :class:`ReportFigure`, the matplotlib settings, a fresh Agg
figure, series colours and legend, and the numbers table.

Matplotlib is used through the object-oriented API on the Agg canvas only, and imported
lazily. SVG output is deterministic: the ids use a fixed salt and the date is left out.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from studies.report.load import ReportData

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

SALT = "hicache-sim-report"
RC: Any = {  # Any: matplotlib types rc keys as literals
    "svg.fonttype": "none",  # text stays text: small files, selectable and searchable
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "pdf.fonttype": 42,
}


@dataclass
class ReportFigure:
    """One figure: the matplotlib Figure, the data it plots (JSON-ready), and the numbers shown
    beside it. Displays itself in Jupyter (``_repr_svg_``)."""

    id: str
    title: str
    caption: str = field(repr=False)
    figure: Figure = field(repr=False)
    data: dict[str, Any] = field(repr=False)
    numbers: pd.DataFrame = field(repr=False)

    note: str = field(default="", repr=False)
    """A remark shown above the figure (empty: none)."""

    @property
    def width_px(self) -> int:
        """The figure's natural width on a page in CSS pixels (96 per inch): the HTML shows
        it at this size, or narrower when the page is narrower, so that every figure's text
        appears at the same size."""
        return round(self.figure.get_figwidth() * 96)

    def to_svg(self) -> str:
        """The figure as an ``<svg>`` element (no XML prolog), deterministic."""
        import matplotlib

        buf = io.StringIO()
        with matplotlib.rc_context({**RC, "svg.hashsalt": f"{SALT}-{self.id}"}):
            self.figure.savefig(buf, format="svg", metadata={"Date": None})
        text = buf.getvalue()
        return text[text.index("<svg") :]

    def _repr_svg_(self) -> str:
        return self.to_svg()


def new_figure(width: float, height: float) -> Figure:
    """An empty figure (inches, 100 dpi, constrained layout) on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def tint(color: Any, amount: float = 0.55) -> tuple[float, float, float]:
    """``color`` mixed with white (``amount`` of white), opaque: a light fill on which lines
    and hatching in ``color`` itself stay visible (an alpha would fade the hatch too)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def dodge(x: float, k: int, n: int, log: bool, step: float) -> float:
    """``x`` moved for series ``k`` of ``n`` so that equal points of different series sit
    side by side: ``step`` apart around ``x`` (decades on a log axis, x units otherwise)."""
    off = (k - (n - 1) / 2) * step
    return float(x * 10**off) if log else x + off


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p")


def series_colors(data: ReportData) -> dict[str, Any]:
    """A colour per series, in series order (tab10, or tab20 beyond 10 series)."""
    from matplotlib import colormaps

    order = data.series_order()
    cmap = colormaps["tab10" if len(order) <= 10 else "tab20"]
    return {s: cmap(i % cmap.N) for i, s in enumerate(order)}


def series_legend(
    fig: Figure, data: ReportData, extra: Sequence[Any] = (), markers: bool = False
) -> None:
    """The series legend (plus ``extra`` handles) outside the axes, upper right: colour
    patches, or lines with each series' marker (:data:`MARKERS`, in series order)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colors = series_colors(data)
    handles: list[Any] = [
        Line2D(
            [],
            [],
            color=colors[s],
            marker=MARKERS[k % len(MARKERS)],
            ms=6,
            mfc=tint(colors[s], 0.3),
            mec=colors[s],
            label=s,
        )
        if markers
        else Patch(color=colors[s], label=s)
        for k, s in enumerate(data.series_order())
    ]
    fig.legend(handles=[*handles, *extra], loc="outside right upper", title="series")


def frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """The numbers shown beside a figure: ``rows`` as a DataFrame with ``columns``."""
    import pandas as pd

    return pd.DataFrame(rows, columns=list(columns))
