"""A/B of the cache-only replay between two checkouts, alternating runs in one session.

    python bench/ab_cache_only.py ../orig . [--version 0.5.23] [--repeat 5]

Each run is a fresh subprocess importing ``sim.hitrate`` from its checkout and timing the replay
of the bundled conversation trace at 1 M : 4 M tokens, page 64, LRU (trace reading excluded),
per write policy. Prints the medians, B / A and the host hit tokens (equal: the same decisions).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys, time
root = sys.argv[1]
sys.path.insert(0, root)
import sim.hitrate
assert sim.hitrate.__file__.startswith(os.path.realpath(root)), sim.hitrate.__file__
from sim.hitrate import HitRateConfig, replay, requests_for
from traces.io import read_trace
trace = read_trace(os.path.join(root, "traces/data/mooncake/conversation_trace.jsonl"))
reqs = requests_for(trace, 64)
cfg = HitRateConfig(device_tokens=999_936, host_tokens=4_000_000, page_size=64,
                    write_policy=sys.argv[2], sglang_version=sys.argv[3])
t0 = time.perf_counter()
r = replay(reqs, cfg)
print(time.perf_counter() - t0, r.host_hit_tokens)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--version", default="0.5.23")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policies", default="write_through,write_back")
    args = ap.parse_args()
    for wp in args.policies.split(","):
        walls: dict[str, list[float]] = {"A": [], "B": []}
        hits: dict[str, str] = {}
        for _ in range(args.repeat):
            for side, root in (("A", args.a), ("B", args.b)):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(Path(root).resolve()), wp, args.version],
                    capture_output=True, text=True, cwd="/", check=True,
                ).stdout.split()  # fmt: skip
                walls[side].append(float(out[0]))
                hits[side] = out[1]
        a, b = statistics.median(walls["A"]), statistics.median(walls["B"])
        print(f"{wp}: A {a:.2f} s, B {b:.2f} s, B/A {b / a:.2f}; host hit tokens {hits}")


if __name__ == "__main__":
    main()
