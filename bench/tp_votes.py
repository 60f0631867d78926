"""What the per-request HiCache TP votes cost (``sim.costs.Costs.tp_sync_s``): the bundled
conversation trace with an L3 store at TP 2, each SGLang version and prefetch policy, with the
all-reduce free, at the profile's 150 us (sglang PR #30511) and at 3.2 ms (a 4-rank gloo
all-reduce on a 2-socket Xeon B200 host, sglang PR #39903). Only the per-request votes vary:
the per-pass checks stay at the profile's value in every column.

    .venv/bin/python bench/tp_votes.py [--requests 3000] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sim.engine
from hicache.config import load_config
from sim.costs import build_costs
from sim.engine import run_simulation
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import read_trace

BASE = ["model.name=qwen3-32b", "model.tp=2", "gpu.name=h200", "storage.backend=mooncake"]
SYNCS = (("free", 0.0), ("profile", None), ("3.2 ms", 0.0032))


def run(trace: Any, sets: list[str], sync: float | None) -> dict[str, Any]:
    cfg = load_config(None, sets)
    costs = build_costs(cfg)
    if sync is not None:
        costs = dataclasses.replace(costs, tp_sync_s=sync)
    real = sim.engine.build_costs
    sim.engine.build_costs = lambda _cfg: costs  # type: ignore[assignment]
    try:
        return run_simulation(cfg, trace, None, progress=False)
    finally:
        sim.engine.build_costs = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--set", action="append", default=[], help="more config overrides")
    args = ap.parse_args()
    trace = read_trace(MOONCAKE_CONVERSATION)
    cols = "free / 150 us / 3.2 ms"
    print(f"| version | policy | votes | TTFT mean: {cols} | TTFT p90: {cols} |")
    print("|---|---|---:|---|---|")
    for version in ("0.5.14", "0.5.23"):
        for policy in ("best_effort", "wait_complete", "timeout"):
            sets = [*BASE, f"sglang.version={version}", f"storage.prefetch_policy={policy}",
                    f"workload.max_requests={args.requests}", *args.set]  # fmt: skip
            got = [run(trace, sets, s) for _, s in SYNCS]
            votes = got[1]["storage"]["prefetch_tp_votes"]
            mean = " / ".join(f"{g['ttft_mean_s']:.3f}" for g in got)
            p90 = " / ".join(f"{g['ttft_p90_s']:.3f}" for g in got)
            print(f"| {version} | {policy} | {votes:,} | {mean} s | {p90} s |", flush=True)


if __name__ == "__main__":
    main()
