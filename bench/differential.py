"""The fast scheduler against the reference one on many random workloads (sim/differential.py).

    python bench/differential.py --seeds 300            # seeds 0..299
    python bench/differential.py --seeds 20 --start 1000

Prints one line per seed that differs (its workload, config and first differences) and a
total; exit status 1 if any differs. Also reports both engines' wall times (medians of the
per-seed ratio) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.differential import compare, random_case, run_case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=300)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--show", type=int, default=4, help="differences shown per seed")
    args = ap.parse_args()
    bad, ratios = 0, []
    fast_s = ref_s = 0.0
    for seed in range(args.start, args.start + args.seeds):
        case = random_case(seed)
        t0 = time.perf_counter()
        fast = run_case(case, "fast")
        t1 = time.perf_counter()
        ref = run_case(case, "reference")
        t2 = time.perf_counter()
        fast_s += t1 - t0
        ref_s += t2 - t1
        ratios.append((t2 - t1) / max(t1 - t0, 1e-9))
        diffs = compare(ref, fast, limit=args.show)
        if diffs:
            bad += 1
            print(f"seed {seed}: {case.what} {' '.join(case.sets)}", flush=True)
            for d in diffs:
                print(f"    {d}", flush=True)
    n = args.seeds
    print(f"{n - bad}/{n} seeds equal; wall fast {fast_s:.1f} s, reference {ref_s:.1f} s, "
          f"median reference/fast {statistics.median(ratios):.2f}x")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
