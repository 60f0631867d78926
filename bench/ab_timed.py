"""A/B of the timed simulator between two checkouts, alternating runs in one session.

    python bench/ab_timed.py ../orig . --rates 0.25,1 --repeat 3 [--set sglang.version=0.5.14]

Each run is a fresh subprocess that imports the simulator from its checkout (the old layout,
``sim.config``, or the new one, ``hicache.config``) and times ``run_simulation`` on the bundled
Mooncake conversation trace with the defaults (trace reading excluded). Prints every run, the
medians and the ratio B / A per rate. The TTFT mean is printed too: equal values mean the two
checkouts made the same decisions.
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
if os.path.isdir(os.path.join(root, "hicache")):
    from hicache.config import load_config
else:
    from sim.config import load_config
import sim.engine
assert sim.engine.__file__.startswith(os.path.realpath(root)), sim.engine.__file__
from traces.io import read_trace
trace = read_trace(os.path.join(root, "traces/data/mooncake/conversation_trace.jsonl"))
cfg = load_config(None, [f"workload.rate_scale={sys.argv[2]}", *sys.argv[3:]])
t0 = time.perf_counter()
s = sim.engine.run_simulation(cfg, trace, None, progress=False)
print(time.perf_counter() - t0, s["ttft_mean_s"])
"""


def run(root: Path, rate: str, sets: list[str]) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root.resolve()), rate, *sets],
        check=True, capture_output=True, text=True, cwd="/",
    )  # fmt: skip
    wall, ttft = out.stdout.split()
    return float(wall), float(ttft)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--rates", default="0.25,1")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config item for both sides (e.g. sglang.version=0.5.14)")  # fmt: skip
    args = ap.parse_args()
    rates = args.rates.split(",")
    walls: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for rate in rates:
            for side, root in (("A", args.a), ("B", args.b)):
                wall, ttft = run(root, rate, args.set)
                walls.setdefault((side, rate), []).append(wall)
                print(f"{side} rate {rate}: {wall:.2f} s (TTFT mean {ttft!r})", flush=True)
    for rate in rates:
        a = statistics.median(walls["A", rate])
        b = statistics.median(walls["B", rate])
        print(f"rate {rate}: A median {a:.2f} s, B median {b:.2f} s, B/A {b / a:.2f}")


if __name__ == "__main__":
    main()
