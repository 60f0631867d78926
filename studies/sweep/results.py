"""The results table of a sweep: one row per job from what its job directory holds, written
as ``results.parquet`` and ``results.csv``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studies.sweep.jobs import JobSpec, is_finished
from traces.fsutil import write_csv_atomic, write_parquet_atomic

if TYPE_CHECKING:
    import pandas as pd


def _row(out: Path, spec: JobSpec, summary_keys: dict[str, None]) -> dict[str, Any]:
    row: dict[str, Any] = {"job": spec.name, "status": "missing", "error": None}
    row.update(dict(spec.axes))
    d = out / "runs" / spec.name
    if spec.config is None:
        row.update(status="failed", error=spec.error)
    elif is_finished(d, spec):
        conf = json.loads((d / "config.json").read_text())
        summary = json.loads((d / "summary.json").read_text())
        row.update(
            status="ok",
            device_tokens=conf["device_tokens"],
            host_tokens=conf["host_tokens"],
            run_dir=f"runs/{spec.name}",
        )
        row.update(summary)
        summary_keys.update(dict.fromkeys(summary))
    elif (d / "error.json").is_file():
        row.update(status="failed", error=json.loads((d / "error.json").read_text())["error"])
    return row


def collect_results(out: Path, specs: Sequence[JobSpec]) -> pd.DataFrame:
    """The results table from what the job directories hold, one row per spec in order:
    ``job, status ("ok" | "failed" | "missing"), error``, the axis columns,
    ``device_tokens, host_tokens`` (resolved pools), every ``summary.json`` field, and
    ``run_dir`` (relative to ``out``; empty for a job without a run)."""
    import pandas as pd

    summary_keys: dict[str, None] = {}
    rows = [_row(out, spec, summary_keys) for spec in specs]
    axes = [c for c, _ in specs[0].axes] if specs else []
    columns = [
        "job",
        "status",
        "error",
        *axes,
        "device_tokens",
        "host_tokens",
        *summary_keys,
        "run_dir",
    ]
    return pd.DataFrame(rows, columns=columns)


def write_results(df: pd.DataFrame, out: Path) -> None:
    """``out/results.parquet`` and ``out/results.csv`` (no index), each written atomically."""
    write_parquet_atomic(df, out / "results.parquet")
    write_csv_atomic(df, out / "results.csv")


__all__ = ["collect_results", "write_results"]
