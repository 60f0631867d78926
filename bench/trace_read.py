"""Time reading the bundled Mooncake conversation trace and computing its page keys.

Usage: .venv/bin/python bench/trace_read.py [--runs N] [--file PATH]

Prints the median (and min/max) over N runs of: `read_trace` on the JSONL file, the same
trace as Parquet (written once to a temporary directory), `page_symbols` over all
requests at page sizes 1 and 64, `infinite_capacity_hit_rate` at page size 1 and
`trace_stats`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import read_trace, write_trace
from traces.keys import page_symbols
from traces.schema import Trace
from traces.stats import infinite_capacity_hit_rate, trace_stats


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _row(label: str, times: list[float], extra: str = "") -> None:
    med = statistics.median(times)
    print(
        f"{label:<34} median {1000 * med:8.1f} ms   "
        f"(min {1000 * min(times):.1f}, max {1000 * max(times):.1f}){extra}"
    )


def _symbols(trace: Trace, page_size: int) -> int:
    bs = trace.block_size
    return sum(len(page_symbols(r, page_size, bs)) for r in trace.requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--file", type=Path, default=MOONCAKE_CONVERSATION)
    args = parser.parse_args()

    print(f"python {platform.python_version()} on {platform.machine()}, {args.runs} runs")
    trace = read_trace(args.file)
    size_mb = args.file.stat().st_size / 1e6
    print(f"file {args.file.name}: {len(trace):,} requests, {size_mb:.1f} MB")
    _row("read_trace (JSONL)", _time(lambda: read_trace(args.file), args.runs))
    with tempfile.TemporaryDirectory() as tmp:
        pq_path = Path(tmp) / "trace.parquet"
        write_trace(trace, pq_path)
        _row("read_trace (Parquet)", _time(lambda: read_trace(pq_path), args.runs))
    for page_size in (1, 64):
        n = _symbols(trace, page_size)
        _row(
            f"page_symbols, page_size {page_size}",
            _time(lambda ps=page_size: _symbols(trace, ps), args.runs),  # type: ignore[misc]
            f"  {n:,} symbols",
        )
    _row(
        "infinite_capacity_hit_rate, page 1",
        _time(lambda: infinite_capacity_hit_rate(trace, 1), args.runs),
    )
    _row("trace_stats (all figures)", _time(lambda: trace_stats(trace), args.runs))


if __name__ == "__main__":
    main()
