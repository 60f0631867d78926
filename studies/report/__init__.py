"""Reports: one self-contained HTML file (and optionally a PDF) from runs and sweeps.

``build_report(dirs, out)`` reads run directories (``summary.json``, ``config.json``, the
Parquet tables of :mod:`sim.metrics`) and sweep directories (``results.parquet`` + job run
directories, :mod:`studies.sweep`) and writes:

- figures, inline as SVG, each with the numbers it shows beside it and, for tools and tests,
  the exact plotted data as JSON (``<script type="application/json" class="figure-data"
  data-figure="ID">``): hit rate vs capacity (device, host and, with an L3 tier, storage
  parts stacked), TTFT CDF, TTFT p50/p90/p99 vs capacity (or request rate), the TTFT
  breakdown (prefetch wait / queueing / load stall / prefill compute / other), HBM and host
  occupancy over time, PCIe busy fraction and throughput per direction over time, tokens
  written to vs loaded back from the host, and, only when some run has an L3 tier, the L3
  storage traffic (bytes read and written, prefetch waits, how prefetches ended, discarded
  pages); optionally (``hitrate_rows``) a cache-only hit-rate study: hit rate vs device
  capacity per policy under the infinite-capacity ceiling;
- the SGLang 0.5.14 defects the runs would hit (``sglang_defects`` of summary.json: the
  nonzero counters, or a line saying none were hit; its rows as JSON under
  ``data-figure="sglang-defects"``);
- a comparison table with the best value of each metric highlighted (L3 columns only when
  some run has an L3 tier);
- the configurations: what all runs share, what differs, each run's ``config.json`` and each
  sweep's grid file and failed jobs.

Runs written before the L3 tier (no storage columns or keys) load as runs without one.

A run with a warm-up window (``workload.warmup_s``) reports as its summary.json counts: the
figures and tables of requests leave the window's requests (``warmup`` in requests.parquet)
out, and copy totals the copies that started in it; the figures over time show the whole run
with the window shaded, and the header says what was left out.

Runs are grouped automatically: the config keys whose values differ between runs label them.
Keys that size the pools (device tokens, host ratio/size) form the capacity axis; the others
(write policy, eviction, ...) form the series ("policy"). When only the request rate varies,
the rate is the x axis instead.

Output is deterministic: inputs are sorted, there are no timestamps, matplotlib's SVG ids use
a fixed salt and its date metadata is left out, so the same inputs give byte-identical files.
Matplotlib is used through the object-oriented API on the Agg canvas only.

The package, by job: :mod:`~studies.report.load` (runs, sweeps, labels),
:mod:`~studies.report.derive` (metrics and the comparison table),
:mod:`~studies.report.figures`, :mod:`~studies.report.figures_traffic`,
:mod:`~studies.report.figures_storage` (L3 traffic, the defect rows) and
:mod:`~studies.report.figures_hitrate` (the figures, on :mod:`~studies.report.canvas`),
:mod:`~studies.report.html` (the document),
:mod:`~studies.report.pdf`, and :mod:`~studies.report.png` (the stand-alone hit-rate plot).
Nothing here imports pandas or matplotlib until it is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.report.canvas import RC, ReportFigure, series_colors
from studies.report.derive import (
    BREAKDOWN_PARTS,
    CDF_POINTS,
    COMPARISON,
    MAX_TIMELINE_RUNS,
    PCIE_BINS,
    TIME_POINTS,
    best_cells,
    comparison_columns,
    comparison_table,
    occupancy,
    pcie,
    timeline_runs,
    ttft_breakdown,
    write_traffic,
)
from studies.report.figures import FIGURES, MAX_CDF_PANELS, report_figures
from studies.report.figures_hitrate import fig_hitrate_study, study_labels
from studies.report.figures_storage import defect_rows, fig_storage, storage_traffic
from studies.report.html import render_html
from studies.report.load import (
    CAPACITY_KEYS,
    HOST_ONLY_KEYS,
    RATE_KEYS,
    ReportData,
    Run,
    Sweep,
    describe_runs,
    load_runs,
)
from studies.report.pdf import write_pdf
from studies.report.png import plot_hitrate
from traces.fsutil import write_text_atomic


def build_report(
    dirs: list[Path],
    out: Path,
    pdf: bool = False,
    hitrate_rows: Sequence[dict[str, Any]] | None = None,
    hitrate_title: str | None = None,
    sections: Sequence[tuple[str, str, str]] = (),
) -> Path:
    """Write the HTML report of ``dirs`` (run and/or sweep directories) to ``out`` and, with
    ``pdf``, the same figures as ``out`` with suffix ``.pdf``. Returns ``out``.

    ``hitrate_rows``: rows of a cache-only hit-rate study (:func:`studies.sweep.
    run_hitrate_grid`, optionally with ``infinite_capacity_hit_rate`` and a ``policy`` label
    each), shown after the hit-rate figure as hit rate vs device capacity with its table;
    ``hitrate_title`` titles its plot. ``sections``: ``(id, title, HTML body)`` of more
    sections, shown after the figures (the demo's upgrade comparison). Same inputs give
    byte-identical files. Raises
    ``ValueError`` (one line) for unusable inputs."""
    data = load_runs(dirs)
    names = [s.name for s in data.sweeps]
    title = "hicache-sim report" + (f": {', '.join(names)}" if names else "")
    figures = report_figures(data)
    if hitrate_rows:
        study = hitrate_study(list(hitrate_rows), hitrate_title, series_colors(data))
        figures.insert(1, study)
    write_text_atomic(render_html(data, figures, title, sections), out)
    if pdf:
        write_pdf(data, figures, title, out.with_suffix(".pdf"))
    return out


def hitrate_study(
    rows: list[dict[str, Any]],
    title: str | None = None,
    colors: Mapping[str, Any] | None = None,
) -> ReportFigure:
    """The report figure of a cache-only hit-rate study (:func:`fig_hitrate_study`), with the
    note of :func:`sim.hitrate.write_back_ignores_hit_counts` when it applies."""
    import matplotlib

    from sim.hitrate import write_back_ignores_hit_counts

    note = write_back_ignores_hit_counts(rows) or ""
    with matplotlib.rc_context(RC):
        return fig_hitrate_study(rows, title, note, colors)


__all__ = [
    "BREAKDOWN_PARTS",
    "CAPACITY_KEYS",
    "CDF_POINTS",
    "COMPARISON",
    "FIGURES",
    "HOST_ONLY_KEYS",
    "MAX_CDF_PANELS",
    "MAX_TIMELINE_RUNS",
    "PCIE_BINS",
    "RATE_KEYS",
    "TIME_POINTS",
    "ReportData",
    "ReportFigure",
    "Run",
    "Sweep",
    "best_cells",
    "build_report",
    "comparison_columns",
    "comparison_table",
    "defect_rows",
    "describe_runs",
    "fig_hitrate_study",
    "fig_storage",
    "hitrate_study",
    "load_runs",
    "occupancy",
    "pcie",
    "plot_hitrate",
    "render_html",
    "report_figures",
    "storage_traffic",
    "study_labels",
    "timeline_runs",
    "ttft_breakdown",
    "write_pdf",
    "write_traffic",
]
