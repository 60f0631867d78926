"""Cluster speed (issue 16): the whole bundled Mooncake conversation trace at its recorded rate
on ``--instances`` copies of the default server behind each ``--routers`` policy.

    .venv/bin/python bench/cluster_run.py [--instances 16] [--routers cache_aware] [--repeat 3]

Each run is a fresh subprocess (its own peak RSS), timed from config to summary with the
trace read excluded. Prints per router: median wall time, requests/s, whether the fleet was
overloaded, the load imbalance, the hit rates and TTFT p50/p90.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts' shared runner
from sim_run import TRACE, child_json

CHILD = r"""
import json, resource, sys, time
from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace
n, router = int(sys.argv[1]), sys.argv[2]
trace = read_trace(sys.argv[3])
cfg = load_config(None, [f"cluster.instances={n}", f"router.policy={router}"])
t0 = time.perf_counter()
s = run_simulation(cfg, trace, None, progress=False)
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
keys = ("requests", "overloaded", "imbalance_requests", "hit_rate", "device_hit_rate",
        "host_hit_rate", "ttft_p50_s", "ttft_p90_s")
print(json.dumps({"wall": wall, "rss_mb": rss, **{k: s.get(k) for k in keys}}))
"""


def run_child(n: int, router: str) -> dict[str, Any]:
    return child_json(CHILD, n, router, TRACE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--routers", default="cache_aware")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for router in args.routers.split(","):
        runs = [run_child(args.instances, router) for _ in range(args.repeat)]
        walls = [r["wall"] for r in runs]
        med = statistics.median(walls)
        r = runs[0]
        print(
            f"{router}: {args.instances} instances, {r['requests']} requests, median "
            f"{med:.2f}s ({r['requests'] / med:,.0f} req/s) runs={[round(w, 2) for w in walls]} "
            f"peak_rss={max(x['rss_mb'] for x in runs):.0f}MB overloaded={r['overloaded']} "
            f"imbalance={r['imbalance_requests']:.2f} hit={r['hit_rate']:.3f} "
            f"(device {r['device_hit_rate']:.3f}, host {r['host_hit_rate']:.3f}) "
            f"ttft_p50={r['ttft_p50_s'] * 1e3:.0f}ms p90={r['ttft_p90_s'] * 1e3:.0f}ms"
        )


if __name__ == "__main__":
    main()
