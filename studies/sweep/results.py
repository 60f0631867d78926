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


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A ``summary.json`` as flat result columns: its scalar fields as they are; the L3
    ``storage`` block (only runs with an L3 tier have one) as ``storage_<key>`` columns
    (``storage_backend``, ``storage_prefetches_issued``, ``storage_bytes_read``, ...; a key
    already starting ``storage_`` keeps its name, one the summary has at the top level, such
    as ``prefetch_wait_mean_s``, is not repeated); ``sglang_defects`` as
    ``sglang_defect_<code>`` (count) and ``sglang_defect_<code>_tokens`` columns. Other
    nested values (a cluster's ``per_instance``) stay as they are."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key == "storage" and isinstance(value, dict):
            for k, v in value.items():
                if k in summary:
                    continue
                out[k if k.startswith("storage_") else f"storage_{k}"] = v
        elif key == "sglang_defects" and isinstance(value, dict):
            for code, d in value.items():
                out[f"sglang_defect_{code}"] = int(d.get("count", 0))
                out[f"sglang_defect_{code}_tokens"] = int(d.get("tokens", 0))
        else:
            out[key] = value
    return out


def _row(out: Path, spec: JobSpec, summary_keys: dict[str, None]) -> dict[str, Any]:
    row: dict[str, Any] = {"job": spec.name, "status": "missing", "error": None}
    row.update(dict(spec.axes))
    d = out / "runs" / spec.name
    if spec.config is None:
        row.update(status="failed", error=spec.error)
    elif is_finished(d, spec):
        conf = json.loads((d / "config.json").read_text())
        summary = flatten_summary(json.loads((d / "summary.json").read_text()))
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
    ``device_tokens, host_tokens`` (resolved pools), every ``summary.json`` field (the L3
    ``storage`` block and ``sglang_defects`` flattened, :func:`flatten_summary`; a column a
    job's run lacks, e.g. the L3 ones of a run without an L3 tier, is empty there), and
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
        # the defect counters last: they are many, and rarely what a reader looks for first
        *sorted(summary_keys, key=lambda k: k.startswith("sglang_defect_")),
        "run_dir",
    ]
    return pd.DataFrame(rows, columns=columns)


def write_results(df: pd.DataFrame, out: Path) -> None:
    """``out/results.parquet`` and ``out/results.csv`` (no index), each written atomically."""
    write_parquet_atomic(df, out / "results.parquet")
    write_csv_atomic(df, out / "results.csv")


__all__ = ["collect_results", "flatten_summary", "write_results"]
