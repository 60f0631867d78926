"""A trace ten times as long: wall time and peak memory against the single trace (issue 14).

    .venv/bin/python bench/long_trace.py [--copies 10] [--rate-scale 1] [--repeat 1]

Builds the bundled Mooncake conversation trace repeated ``--copies`` times into a temporary
JSONL file: copy ``c`` is shifted by ``c`` times the trace's span (plus one second) and its
hash ids by ``c`` times (the largest id + 1), so no copy shares a prefix with another (a fresh
set of conversations, as fresh session ids would be in a session trace). Then times
``run_simulation`` with the defaults on the single trace and on the long one, each in a fresh
subprocess (trace reading excluded from the wall time, included in the peak RSS, as a user's
``hicache-sim run`` pays it), and prints the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_run import TRACE, child_json

CHILD = r"""
import json, resource, sys, time
from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace
trace = read_trace(sys.argv[1])
cfg = load_config(None, [f"workload.rate_scale={sys.argv[2]}"])
t0 = time.perf_counter()
s = run_simulation(cfg, trace, None, progress=False)
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "n": s["requests"], "rss_mb": rss, "hit": s["hit_rate"]}))
"""


def repeat_trace(src: Path, dst: Path, copies: int) -> int:
    """Write ``copies`` shifted copies of ``src`` (Mooncake JSONL) to ``dst``; returns the
    number of requests written."""
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    span = max(r["timestamp"] for r in rows) - min(r["timestamp"] for r in rows) + 1000
    top = max(h for r in rows for h in r["hash_ids"]) + 1
    with open(dst, "w") as f:
        for c in range(copies):
            for r in rows:
                out = dict(r, timestamp=r["timestamp"] + c * span,
                           hash_ids=[h + c * top for h in r["hash_ids"]])  # fmt: skip
                f.write(json.dumps(out) + "\n")
    return copies * len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        long = Path(d) / f"conversation_x{args.copies}.jsonl"
        n = repeat_trace(TRACE, long, args.copies)
        print(f"long trace: {n:,} requests ({args.copies} copies)")
        res = {}
        for name, path in (("single", TRACE), (f"x{args.copies}", long)):
            runs = [child_json(CHILD, path, args.rate_scale) for _ in range(args.repeat)]
            wall = statistics.median(r["wall"] for r in runs)
            rss = max(r["rss_mb"] for r in runs)
            res[name] = (wall, rss)
            print(f"{name}: {runs[0]['n']:,} requests, median {wall:.2f} s "
                  f"(runs {[round(r['wall'], 2) for r in runs]}), peak RSS {rss:.0f} MB, "
                  f"hit rate {runs[0]['hit']:.4f}")  # fmt: skip
        (w1, m1), (wn, mn) = res["single"], res[f"x{args.copies}"]
        print(f"ratio x{args.copies} / single: wall {wn / w1:.2f}x (target <= "
              f"{args.copies + 1}x), peak RSS {mn / m1:.2f}x (target < 2x)")  # fmt: skip


if __name__ == "__main__":
    main()
