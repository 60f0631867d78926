"""Policy-core speed: the bundled Mooncake conversation trace through match -> load_back ->
insert -> evict with a small device pool (cache-only replay, one request at a time).

    .venv/bin/python bench/policy_ops.py [--repeat 3] [--page-sizes 64,1]

Reports requests/s and policy operations/s (match + insert + evict + evict_host + load_back
calls) per page size; the median over ``--repeat`` runs. Results go to BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sim.hitrate import CacheReplay, HitRateConfig, requests_for
from traces.io import read_trace

TRACE = Path(__file__).resolve().parent.parent / "traces/data/mooncake/conversation_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--page-sizes", default="64,1")
    ap.add_argument("--device-tokens", type=int, default=1_000_000)
    ap.add_argument("--host-ratio", type=float, default=2.0)
    args = ap.parse_args()
    trace = read_trace(TRACE)
    for p in (int(x) for x in args.page_sizes.split(",")):
        reqs = requests_for(trace, p)
        dev = args.device_tokens // p * p
        cfg = HitRateConfig(
            device_tokens=dev, host_tokens=int(dev * args.host_ratio) // p * p, page_size=p
        )
        times, ops = [], 0
        for _ in range(args.repeat):
            rp = CacheReplay(cfg)
            t0 = time.perf_counter()
            for r in reqs:
                rp.step(r)
            times.append(time.perf_counter() - t0)
            res = rp.finish()
            st = rp.cache.stats
            ops = (
                st.match_calls
                + st.insert_calls
                + st.evict_calls
                + st.evict_host_calls
                + st.load_back_calls
            )
        t = statistics.median(times)
        print(
            f"page_size={p} device={dev} host={cfg.host_tokens} requests={len(reqs)} "
            f"median {t:.2f}s ({len(reqs) / t:,.0f} req/s, {ops / t:,.0f} policy ops/s, "
            f"{ops} ops) runs={[round(x, 2) for x in times]} hit_rate={res.hit_rate:.4f} "
            f"device={res.device_hit_rate:.4f} host={res.host_hit_rate:.4f} "
            f"dev_evicted={res.device_evicted_tokens} host_evicted={res.host_evicted_tokens}"
        )


if __name__ == "__main__":
    main()
