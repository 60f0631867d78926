"""Timed-simulator wall time over a grid of chunked-prefill sizes × load × trace length
(issue 14: "no pathological settings"; wall time should grow at most linearly in requests).

    .venv/bin/python bench/chunk_grid.py [--chunks 512,2048,8192,16384] [--rates 0.25,1,4]
                                         [--requests 3000,12031] [--set KEY=VALUE ...]

Each cell is one fresh subprocess on the bundled Mooncake conversation trace (defaults
otherwise), timed from config to summary with the trace read excluded. Prints one line per
cell and, per (chunk, rate), the wall-time ratio between the longest and shortest request
count next to the request ratio (linear growth: the two are equal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench scripts' shared runner
from sim_run import TRACE, child_json

CHILD = r"""
import json, sys, time
from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace
chunk, rate, n = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
trace = read_trace(sys.argv[4])
cfg = load_config(None, [f"scheduler.chunked_prefill_size={chunk}",
                         f"workload.rate_scale={rate}", f"workload.max_requests={n}",
                         *sys.argv[5:]])
t0 = time.perf_counter()
s = run_simulation(cfg, trace, None, progress=False)
print(json.dumps({"wall": time.perf_counter() - t0, "requests": s["requests"]}))
"""


def cell(chunk: int, rate: float, n: int, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    return child_json(CHILD, chunk, rate, n, TRACE, *sets)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", default="512,2048,8192,16384")
    ap.add_argument("--rates", default="0.25,1,4")
    ap.add_argument("--requests", default="3000,12031")
    ap.add_argument("--set", action="append", default=[], help="more config overrides")
    args = ap.parse_args()
    sizes = [int(x) for x in args.requests.split(",")]
    for chunk in (int(x) for x in args.chunks.split(",")):
        for rate in (float(x) for x in args.rates.split(",")):
            walls = []
            for n in sizes:
                r = cell(chunk, rate, n, tuple(args.set))
                walls.append(r["wall"])
                print(f"chunk={chunk} rate={rate} requests={r['requests']} wall={r['wall']:.2f}s",
                      flush=True)  # fmt: skip
            if len(sizes) > 1:
                print(f"  chunk={chunk} rate={rate}: wall x{walls[-1] / walls[0]:.2f} for "
                      f"requests x{sizes[-1] / sizes[0]:.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
