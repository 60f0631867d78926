"""Run metrics: plain lists during the run, tables and a summary at the end.

Three tables per run (Parquet): ``requests`` (one row per request), ``timeline`` (sampled at
state changes, thinned to a bounded number of rows) and ``transfers`` (one row per copy op).
``summary.json`` holds the headline figures.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REQUEST_COLUMNS = (
    "rid",
    "arrival_s",
    "admitted_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "queue_s",
    "prefill_s",
    "load_stall_s",
    "prompt_tokens",
    "output_tokens",
    "device_hit_tokens",
    "host_hit_tokens",
    "host_hit_recomputed_tokens",
    "computed_tokens",
    "retractions",
)
TIMELINE_COLUMNS = (
    "t_s",
    "device_free_tokens",
    "device_evictable_tokens",
    "device_protected_tokens",
    "device_request_tokens",
    "host_used_tokens",
    "waiting",
    "running",
    "d2h_busy_s",
    "h2d_busy_s",
)
TRANSFER_COLUMNS = ("direction", "kind", "bytes", "pages", "runs", "enqueue_s", "start_s", "end_s")


@dataclass
class Recorder:
    """Collects rows as tuples; builds DataFrames once at the end."""

    timeline_max_rows: int = 20_000
    requests: list[tuple[Any, ...]] = field(default_factory=list)
    timeline: list[tuple[Any, ...]] = field(default_factory=list)
    transfers: list[tuple[Any, ...]] = field(default_factory=list)
    _stride: int = 1
    _skip: int = 0

    def add_request(self, row: tuple[Any, ...]) -> None:
        self.requests.append(row)

    def add_transfer(self, row: tuple[Any, ...]) -> None:
        self.transfers.append(row)

    def sample(self, row: tuple[Any, ...]) -> None:
        """Keep every ``stride``-th sample; when the table is full, drop every other row and
        double the stride (memory stays bounded whatever the run length)."""
        self._skip += 1
        if self._skip < self._stride:
            return
        self._skip = 0
        self.timeline.append(row)
        if len(self.timeline) >= self.timeline_max_rows:
            self.timeline = self.timeline[::2]
            self._stride *= 2

    # --------------------------------------------------------------------------- outputs --
    def frames(self) -> dict[str, Any]:
        import pandas as pd

        return {
            "requests": pd.DataFrame(self.requests, columns=list(REQUEST_COLUMNS)),
            "timeline": pd.DataFrame(self.timeline, columns=list(TIMELINE_COLUMNS)),
            "transfers": pd.DataFrame(self.transfers, columns=list(TRANSFER_COLUMNS)),
        }


def summarize(frames: dict[str, Any], sim_duration_s: float, wall_time_s: float) -> dict[str, Any]:
    """The headline figures of a run (``summary.json``)."""
    req = frames["requests"]
    tr = frames["transfers"]
    done = req[req["finish_s"] >= 0]
    prompt = int(done["prompt_tokens"].sum())
    dev = int(done["device_hit_tokens"].sum())
    host = int(done["host_hit_tokens"].sum())

    def q(col: str, p: float) -> float:
        s = done[col].dropna()
        return float(s.quantile(p)) if len(s) else float("nan")

    def mean(col: str) -> float:
        s = done[col].dropna()
        return float(s.mean()) if len(s) else float("nan")

    out_tokens = int(done["output_tokens"].sum())
    bytes_d2h = int(tr.loc[tr["direction"] == "d2h", "bytes"].sum()) if len(tr) else 0
    bytes_h2d = int(tr.loc[tr["direction"] == "h2d", "bytes"].sum()) if len(tr) else 0
    return {
        "requests": len(req),
        "finished_requests": len(done),
        "rejected_requests": int(len(req) - len(done)),
        "prompt_tokens": prompt,
        "hit_rate": (dev + host) / prompt if prompt else 0.0,
        "device_hit_rate": dev / prompt if prompt else 0.0,
        "host_hit_rate": host / prompt if prompt else 0.0,
        "host_hit_recomputed_tokens": int(done["host_hit_recomputed_tokens"].sum()),
        "ttft_mean_s": mean("ttft_s"),
        "ttft_p50_s": q("ttft_s", 0.5),
        "ttft_p90_s": q("ttft_s", 0.9),
        "ttft_p99_s": q("ttft_s", 0.99),
        "tpot_mean_s": mean("tpot_s"),
        "e2e_mean_s": mean("e2e_s"),
        "queue_mean_s": mean("queue_s"),
        "load_stall_mean_s": mean("load_stall_s"),
        "throughput_output_tok_s": out_tokens / sim_duration_s if sim_duration_s > 0 else 0.0,
        "retractions": int(req["retractions"].sum()),
        "bytes_d2h": bytes_d2h,
        "bytes_h2d": bytes_h2d,
        "sim_duration_s": sim_duration_s,
        "wall_time_s": wall_time_s,
    }


def write_json_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, allow_nan=True)
        f.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared
    os.replace(tmp, path)


def write_parquet_atomic(df: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    df.to_parquet(tmp, index=False)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared
    os.replace(tmp, path)
