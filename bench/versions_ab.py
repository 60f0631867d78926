"""Cost per SGLang version, measured in one run (issue 24: 0.5.23 within 1.3x of 0.5.14).

    python bench/versions_ab.py [TRACE] [--repeat 3] [--inner 1] [--timed] [--max-requests N] [--l3]

Medians of ``--repeat`` runs per version, alternating, for each write policy; prints seconds and
the 0.5.23 / 0.5.14 ratio. Cache-only (default): the replay at 1 M : 4 M tokens, page 64, LRU.
``--timed``: ``run_simulation`` with the defaults (llama-3-8b, h100-sxm, page 64) at the demo's
rate (0.25 x the trace's), the trace read excluded. ``--l3``: with an L3 store (cache-only: an
unlimited one, timeout policy; timed: ``storage.backend=mooncake``). ``--inner K``: each
cache-only sample times K replays back to back and reports one replay's share (a short trace's
0.2 s replays are too short for one sample on a noisy machine).

Each sample starts after a ``gc.collect()`` (outside its timer). A 0.5.14 replay leaves its
tree behind as cyclic garbage (about 4,000 objects on the synthetic trace) that only a full
collection frees, and without the collection here each full collection lands in whichever
later sample trips the collector's threshold, of either version. Measured in session 10
(BENCHMARKS.md): on the synthetic trace, after the other two policies, two full collections
(338 ms) fell in 0.5.23's write_back samples: ratio 1.40, against 1.14 with the collection.
``--no-collect``: samples as before that change.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from sim.hitrate import HitRateConfig, replay, requests_for
from traces.io import read_trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default="traces/data/mooncake/synthetic_trace.jsonl")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inner", type=int, default=1, help="replays per cache-only sample")
    ap.add_argument("--timed", action="store_true", help="time run_simulation, not the replay")
    ap.add_argument("--max-requests", type=int, default=0)
    ap.add_argument("--l3", action="store_true", help="with an L3 store behind the host tier")
    ap.add_argument("--no-collect", action="store_true", help="no gc.collect() before a sample")
    args = ap.parse_args()
    if args.timed:
        timed(args)
        return
    reqs = requests_for(read_trace(args.trace), 64)
    for wp in ("write_through", "write_through_selective", "write_back"):
        times: dict[str, list[float]] = {"0.5.14": [], "0.5.23": []}
        for _ in range(args.repeat):
            for v in times:
                cfg = HitRateConfig(device_tokens=999_936, host_tokens=4_000_000, page_size=64,
                                    write_policy=wp, sglang_version=v,
                                    storage=args.l3)  # fmt: skip
                if not args.no_collect:
                    gc.collect()
                t0 = time.perf_counter()
                for _ in range(args.inner):
                    replay(reqs, cfg)
                times[v].append((time.perf_counter() - t0) / args.inner)
        a, b = statistics.median(times["0.5.14"]), statistics.median(times["0.5.23"])
        print(f"{wp:>24}  0.5.14 {a:6.2f} s   0.5.23 {b:6.2f} s   ratio {b / a:4.2f}")


def timed(args: argparse.Namespace) -> None:
    from hicache.config import load_config
    from sim.engine import run_simulation

    trace = read_trace(args.trace)
    for wp in ("write_through", "write_through_selective", "write_back"):
        times: dict[str, list[float]] = {"0.5.14": [], "0.5.23": []}
        for _ in range(args.repeat):
            for v in times:
                sets = [f"cache.write_policy={wp}", f"sglang.version={v}",
                        "workload.rate_scale=0.25"]  # fmt: skip
                if args.max_requests:
                    sets.append(f"workload.max_requests={args.max_requests}")
                if args.l3:
                    sets.append("storage.backend=mooncake")
                cfg = load_config(None, sets)
                if not args.no_collect:
                    gc.collect()
                t0 = time.perf_counter()
                run_simulation(cfg, trace, None, progress=False)
                times[v].append(time.perf_counter() - t0)
        a, b = statistics.median(times["0.5.14"]), statistics.median(times["0.5.23"])
        print(f"{wp:>24}  0.5.14 {a:6.2f} s   0.5.23 {b:6.2f} s   ratio {b / a:4.2f}", flush=True)


if __name__ == "__main__":
    main()
