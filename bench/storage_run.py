"""What an L3 tier costs the timed simulator: the bundled conversation trace with the defaults,
without a store and with each backend preset, interleaved, in fresh subprocesses.

    .venv/bin/python bench/storage_run.py [--repeat 5] [--rate-scale 0.25] [--backends file,...]

Prints, per configuration, the median wall time of ``run_simulation`` (trace loading not
included), the ratio of the medians to the run without a store, the median of the per-round
ratios (each round runs every configuration once, back to back, so machine noise cancels
better), peak RSS, and the run's hit rates. The issue's target: every ratio <= 1.5.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_run import TRACE, child_json

CHILD = r"""
import json, resource, sys, time
from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace
backend, rate = sys.argv[1], float(sys.argv[2])
trace = read_trace(sys.argv[3])
cfg = load_config(None, [f"storage.backend={backend}", f"workload.rate_scale={rate}"])
t0 = time.perf_counter()
s = run_simulation(cfg, trace, None, progress=False)
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "rss_mb": rss, "hit": s["hit_rate"],
                  "l3": s["storage_hit_rate"], "ttft": s["ttft_mean_s"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rate-scale", type=float, default=0.25)
    ap.add_argument("--backends", default="file,3fs,mooncake")
    args = ap.parse_args()
    configs = ["none", *args.backends.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for i in range(args.repeat):
        for c in configs:
            runs[c].append(child_json(CHILD, c, args.rate_scale, TRACE))
        walls = ", ".join(f"{c} {runs[c][-1]['wall']:.2f}s" for c in configs)
        print(f"round {i + 1}/{args.repeat}: {walls}", flush=True)
    base = statistics.median(r["wall"] for r in runs["none"])
    print(f"\nrate scale {args.rate_scale}, {args.repeat} rounds")
    print(f"{'backend':>9} {'median s':>9} {'ratio':>6} {'ratio/round':>11} {'RSS MB':>7} "
          f"{'hit':>7} {'L3':>7} {'TTFT s':>7}")  # fmt: skip
    for c in configs:
        rs = runs[c]
        med = statistics.median(r["wall"] for r in rs)
        per_round = statistics.median(
            r["wall"] / b["wall"] for r, b in zip(rs, runs["none"], strict=True)
        )
        last = rs[-1]
        print(f"{c:>9} {med:>9.2f} {med / base:>6.2f} {per_round:>11.2f} "
              f"{statistics.median(r['rss_mb'] for r in rs):>7.0f} {last['hit']:>7.4f} "
              f"{last['l3']:>7.4f} {last['ttft']:>7.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
