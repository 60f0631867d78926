"""The bench's row table: its columns, the collector every sweep adds rows to, and the readable
summary :func:`bench_table` prints (no torch: a saved table can be summarized without it).

One row per timed repeat, columns :data:`COLUMNS` (see :mod:`replay.bench` for what each sweep
fills in); a column a sweep does not set takes its value from :data:`ROW_DEFAULTS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from replay.calibrate import gemm_rate

KiB = 1024
MiB = 1024 * KiB

COLUMNS = (
    "kind",
    "backend",
    "direction",
    "host_memory",
    "layout",
    "bytes",
    "pages",
    "run_pages",
    "runs",
    "layers",
    "n_alpha",
    "n_gamma",
    "calls",
    "flops",
    "repeat",
    "duration_s",
)

#: the value of every column but ``repeat`` and ``duration_s`` when a sweep does not set it
ROW_DEFAULTS: dict[str, Any] = {
    "kind": "",
    "backend": "plain",
    "direction": "",
    "host_memory": "",
    "layout": "",
    "bytes": 0,
    "pages": 0,
    "run_pages": 0,
    "runs": 1,
    "layers": 1,
    "n_alpha": 1,
    "n_gamma": 0,
    "calls": 1,
    "flops": 0.0,
}


@dataclass
class BenchRows:
    """The rows collected so far (dicts keyed by :data:`COLUMNS`)."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, durations: Iterable[float], **cols: Any) -> None:
        """One row per duration (``repeat`` 0, 1, ...), the other columns from ``cols``."""
        base = {
            c: cols.get(c, ROW_DEFAULTS[c]) for c in COLUMNS if c not in ("repeat", "duration_s")
        }
        for i, d in enumerate(durations):
            self.rows.append({**base, "repeat": i, "duration_s": float(d)})


def bench_table(df: pd.DataFrame) -> str:
    """A readable summary: plain-copy bandwidth by size, ``eta`` by size, op bandwidth by
    fragmentation (GB/s = 1e9 B/s, medians over repeats)."""
    med = df.groupby(
        ["kind", "backend", "direction", "host_memory", "layout", "bytes", "run_pages", "layers"],
        as_index=False,
    )["duration_s"].median()
    med["gbps"] = med["bytes"] / med["duration_s"] / 1e9
    plain = med[med.kind == "plain"]
    return "\n".join(
        [
            *_plain_lines(plain),
            *_bidir_lines(med[med.kind == "bidir"], plain),
            *_op_lines(med[med.kind == "op"]),
            *_compute_lines(df),
        ]
    )


def _plain_lines(plain: pd.DataFrame) -> list[str]:
    if not len(plain):
        return []
    cols = sorted({(m, d) for m, d in zip(plain.host_memory, plain.direction, strict=True)})
    lines = [
        "plain copies, GB/s (median):",
        f"{'size':>10} " + " ".join(f"{m[:6] + ' ' + d:>14}" for m, d in cols),
    ]
    for size in sorted(plain["bytes"].unique()):
        cells = []
        for m, d in cols:
            sel = plain[
                (plain["bytes"] == size) & (plain.host_memory == m) & (plain.direction == d)
            ]
            cells.append(f"{sel.gbps.iloc[0]:>14.2f}" if len(sel) else f"{'-':>14}")
        lines.append(f"{_size(int(size)):>10} " + " ".join(cells))
    return lines


def _bidir_lines(bid: pd.DataFrame, plain: pd.DataFrame) -> list[str]:
    if not (len(bid) and len(plain)):
        return []
    lines = ["both directions at once, per-direction GB/s (alone -> together):"]
    for size in sorted(bid["bytes"].unique()):
        cells = []
        for d in ("d2h", "h2d"):
            together = bid[(bid["bytes"] == size) & (bid.direction == d)].gbps
            alone = plain[
                (plain["bytes"] == size)
                & (plain.direction == d)
                & (plain.host_memory == bid.host_memory.iloc[0])
            ].gbps
            if len(together) and len(alone):
                cells.append(f"{d} {alone.iloc[0]:.2f} -> {together.iloc[0]:.2f}")
        lines.append(f"{_size(int(size)):>10}  " + "   ".join(cells))
    return lines


def _op_lines(ops: pd.DataFrame) -> list[str]:
    if not len(ops):
        return []
    lines = ["ops at the largest size per layer count, GB/s by run length (0 = contig.):"]
    for (b, lay, d, _), g in ops.groupby(["backend", "layout", "direction", "layers"]):
        nl = int(g["layers"].iloc[0])  # the group's layer count
        big = g[g["bytes"] == g["bytes"].max()].sort_values("run_pages")
        by_run = " ".join(f"{int(r)}:{v:.2f}" for r, v in zip(big.run_pages, big.gbps, strict=True))
        lines.append(
            f"  {b:>6} {lay:>11} {d} L={nl:<3} {_size(int(big['bytes'].max())):>9}  {by_run}"
        )
    return lines


def _compute_lines(df: pd.DataFrame) -> list[str]:
    lines = []
    g = df[df.kind == "gemm"]
    if len(g):
        per = g.groupby("layout", sort=False).agg(
            flops=("flops", "first"), t=("duration_s", "median")
        )
        each = ", ".join(f"{n} {r.flops / r.t / 1e12:.0f}" for n, r in per.iterrows())
        rate = gemm_rate(df) / 1e12
        lines.append(f"gemm (one layer's linear GEMMs): {rate:.1f} TFLOP/s ({each})")
    hbm = df[df.kind == "hbm"]
    if len(hbm):
        lines.append(f"hbm: {hbm['bytes'].iloc[0] / hbm.duration_s.median() / 1e9:.1f} GB/s")
    return lines


def _size(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:g} MiB"
    if n >= KiB:
        return f"{n / KiB:g} KiB"
    return f"{n} B"


__all__ = ["COLUMNS", "ROW_DEFAULTS", "BenchRows", "bench_table"]
