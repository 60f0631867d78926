"""Replay speed and copy bandwidth on this machine (CPU tensors unless CUDA is there).

    .venv/bin/python bench/replay_copy.py [--device auto|cpu|cuda] [--repeat 3] [--requests 200]
        [--threads N]

Reports (1) plain-copy bandwidth by size, each direction (median of the repeats), and (2) the
trace replay's own speed: the bundled shared-prefix trace through the policy core with real
copies, in requests/s and copy ops/s, for both IO backends, next to the cache-only replay
(``sim.hitrate``, no copies) with the same pools. Tiny per-token geometry (4 layers x 1 KiB,
16-token pages), so the figures measure the replay machinery, not the memory system. Results
go to BENCHMARKS.md by hand, labelled with the device.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from replay.bench import plain_copy_times
from replay.driver import TraceReplayer, trace_requests
from replay.run import ReplaySettings
from replay.runtime import make_runtime
from sim.hitrate import HitRateConfig, replay, requests_for
from traces.bundled import synthetic_path
from traces.io import read_trace

KiB, MiB = 1024, 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rt = make_runtime(args.device)
    print(f"device: {rt.kind} ({rt.describe()['gpu_name']}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("plain copies (GB/s, median):")
    for size in (64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB):
        cells = []
        for d in ("d2h", "h2d"):
            t = statistics.median(plain_copy_times(rt, size, d, True, max(3, args.repeat)))
            cells.append(f"{d} {size / t / 1e9:6.2f}")
        print(f"  {size // KiB:>7} KiB  " + "  ".join(cells))

    trace = read_trace(synthetic_path("shared-prefix"))
    # 1,024 device pages and 3x that on the host: small enough that hits need loads back
    page, dev_tokens, host_tokens = 16, 16_384, 49_152
    t0 = time.perf_counter()
    ref = replay(
        requests_for(trace, page)[: args.requests],
        HitRateConfig(dev_tokens, host_tokens, page),
    )
    cache_only = time.perf_counter() - t0
    print(f"cache-only replay: {args.requests / cache_only:,.0f} req/s "
          f"(hit rate {ref.hit_rate:.1%})")  # fmt: skip
    for backend, layout in (("direct", "layer_first"), ("kernel", "page_first")):
        s = ReplaySettings(page_size=page, device_tokens=dev_tokens, host_tokens=host_tokens,
                           backend=backend, layout=layout, num_layers=4, token_layer_bytes=1024,
                           device_budget_bytes=1 << 30, host_budget_bytes=1 << 30)  # fmt: skip
        walls, n_ops = [], 0
        for _ in range(args.repeat):
            from hicache.policy import PageAllocator
            from hicache.policy.allocator import device_pool
            from replay.controller import TorchController
            from replay.pools import KVPools

            spec = s.pools().spec
            pools = KVPools(spec, rt)
            ctrl = TorchController(device_pool(spec.device_pages, page),
                                   PageAllocator(spec.host_pages, page, "host"), pools, rt,
                                   backend=backend)  # fmt: skip
            rp = TraceReplayer(ctrl)
            reqs = trace_requests(trace, page, args.requests)
            t0 = time.perf_counter()
            rp.run(reqs, max_tokens=0, max_requests=1)
            walls.append(time.perf_counter() - t0)
            n_ops = len(ctrl.records)
            pools.close()
        w = statistics.median(walls)
        print(f"replay {backend:>6}/{layout:<11}: {args.requests / w:,.0f} req/s, "
              f"{n_ops / w:,.0f} copy ops/s ({n_ops} ops, {w:.2f} s)")  # fmt: skip
    rt.close()


if __name__ == "__main__":
    main()
