"""Timed-simulator speed and memory: the bundled Mooncake conversation trace with the defaults
(llama-3-8b, h100-sxm, pcie5-x16, page 64, write_through, LRU).

    .venv/bin/python bench/sim_run.py [--repeat 3] [--profile]

Each run is a fresh subprocess so its peak RSS is its own. Reports the median wall time,
requests/s, simulated seconds and the peak RSS for the first half and for the whole trace
(memory must grow with the trace, not with the number of events). ``--profile`` prints the
top functions of one run (cProfile).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces/data/mooncake/conversation_trace.jsonl"

CHILD = r"""
import json, resource, sys, time
from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace
n, rate = int(sys.argv[1]), float(sys.argv[2])
trace = read_trace(sys.argv[3])
cfg = load_config(None, [f"workload.max_requests={n}", f"workload.rate_scale={rate}"])
t0 = time.perf_counter()
s = run_simulation(cfg, trace, None, progress=False)
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "sim": s["sim_duration_s"], "n": s["requests"], "rss_mb": rss}))
"""


def child_json(code: str, *args: object) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (``sys.argv[1:]`` = ``args``) from the repository
    root; the JSON object on its last line of output. The bench scripts' one child runner."""
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def run_child(n: int, rate: float) -> dict[str, Any]:
    return child_json(CHILD, n, rate, TRACE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    for n in (6000, 0):
        runs = [run_child(n, args.rate_scale) for _ in range(args.repeat)]
        walls = [r["wall"] for r in runs]
        med = statistics.median(walls)
        r0 = runs[0]
        print(
            f"requests={r0['n']} rate_scale={args.rate_scale} median {med:.2f}s "
            f"({r0['n'] / med:,.0f} req/s) runs={[round(w, 2) for w in walls]} "
            f"simulated={r0['sim']:.0f}s peak_rss={max(r['rss_mb'] for r in runs):.0f}MB"
        )
    if args.profile:
        import cProfile
        import pstats

        from hicache.config import load_config
        from sim.engine import run_simulation
        from traces.io import read_trace

        trace = read_trace(TRACE)
        cfg = load_config(None, [f"workload.rate_scale={args.rate_scale}"])
        prof = cProfile.Profile()
        prof.runcall(run_simulation, cfg, trace, None, progress=False)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
