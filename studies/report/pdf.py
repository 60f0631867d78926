"""The report's PDF: the figures one per page, then the comparison table (and the SGLang
defects a run would hit) as text pages."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from studies.report.canvas import RC, ReportFigure, new_figure
from studies.report.derive import comparison_columns, comparison_table, warmup_note
from studies.report.derive_pd import role_tables
from studies.report.figures_storage import defect_rows
from studies.report.load import ReportData
from traces.fsutil import write_atomic

#: Lines of the comparison table per text page.
_LINES_PER_PAGE = 60


def write_pdf(data: ReportData, figures: Sequence[ReportFigure], title: str, path: Path) -> Path:
    """Figures one per page, then the comparison table as text pages, written atomically to
    ``path``. No creation date: the same inputs give the same bytes."""
    return write_atomic(path, lambda tmp: _pdf(data, figures, title, tmp))


def _pdf(data: ReportData, figures: Sequence[ReportFigure], title: str, path: Path) -> None:
    import matplotlib
    import pandas as pd
    from matplotlib.backends.backend_pdf import PdfPages

    raw = comparison_table(data)
    text = pd.DataFrame(
        {title_: [fmt(v) for v in raw[key]] for title_, key, fmt, _ in comparison_columns(data)},
        index=raw.index,
    ).to_string()
    lines = text.splitlines()
    warmup = warmup_note(data)
    if warmup:
        lines = [*textwrap.wrap(warmup, 150), "", *lines]
    for title_, table in role_tables(data):
        lines += ["", f"PD runs, {title_.lower()}:", *table.to_string().splitlines()]
    defects = defect_rows(data)
    if defects is not None:
        from studies.report.html import defects_title

        lines += ["", f"{defects_title(data)}:"]
        if not defects:
            lines.append("none were hit")
        for d in defects:
            lines.append(f"{d['code']:>5}  {d['run']}: {d['count']:,} x, {d['tokens']:,} tokens")
            lines.append(f"       {d['what']}")
    meta = {"Title": title, "Creator": "hicache-sim", "CreationDate": None}
    with matplotlib.rc_context(RC), PdfPages(path, metadata=meta) as pdf:
        for f in figures:
            pdf.savefig(f.figure)
        for start in range(0, len(lines), _LINES_PER_PAGE):
            page = new_figure(16.5, 11.7)
            page.text(
                0.01,
                0.99,
                "\n".join(lines[start : start + _LINES_PER_PAGE]),
                family="monospace",
                fontsize=6,
                va="top",
            )
            pdf.savefig(page)
