"""Memory across runs in one process (a sweep or plan worker runs job after job): six
``run_simulation`` calls on 3,000 conversation requests, max RSS after each. Flat after the
first two when no run outlives itself (BENCHMARKS.md, session 9).

    python bench/leak_check.py          # HICACHE_NATIVE=require to hold the compiled build
"""

from __future__ import annotations

import gc
import resource

import hicache.policy.v0523.tree as tree
from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace


def main() -> None:
    print("compiled" if tree.__file__.endswith(".so") else "interpreted")
    trace = read_trace("traces/data/mooncake/conversation_trace.jsonl")
    cfg = load_config(None, ["workload.max_requests=3000", "workload.rate_scale=0.25"])
    for i in range(6):
        run_simulation(cfg, trace)
        gc.collect()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"run {i + 1}: {rss:.0f} MB max RSS")


if __name__ == "__main__":
    main()
