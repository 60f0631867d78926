"""Kept for old imports: :func:`plot_hitrate` now lives in :mod:`studies.report.png`.

Remove once nothing imports ``studies.plots`` (``cli/main.py`` and
``notebooks/02_trace_explorer.ipynb`` still do).
"""

from __future__ import annotations

from studies.report.png import plot_hitrate

__all__ = ["plot_hitrate"]
