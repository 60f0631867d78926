"""REFERENCES.md E3 rebuilt (sgl-project/sglang#26227): PD with decode-side HiCache, per-round
prompts growing 4K -> 64K; TTFT per round, its average and P99 and the TPOT change, decode
radix cache (with its host tier) off and on, printed beside the reference's figures.

Assumed (the thread states no hardware): Qwen3-32B on H200s, TP 2 on each role, one prefill
and one decode server, RDMA at the ``pd`` defaults, page 64, the simulator's default pools.
The workload (an estimate of the thread's): ``--sessions`` closed-loop conversations of six
rounds, round k's prompt = round k-1's prompt + its new part (4K, 16K, 28K, 40K, 52K, 64K
tokens), 256 output tokens, 1 s think time, sessions starting 0.5 s apart. Decode-side L3 is
not modelled (sim.pd.decode_cache): the "on" run is L1 + L2 only. Not tuned to match.

    .venv/bin/python bench/pd_decode_cache.py [--sessions 24]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace

ROUNDS = [4096, 16384, 28672, 40960, 53248, 65536]
# E3's figures: TTFT (s) per round without / with decode radix (L2 + L3), averages, TPOT
REF_OFF = [2.29, 7.25, 12.72, 18.01, 23.40, 28.50]
REF_ON = [1.59, 5.56, 9.19, 11.93, 12.52, 15.18]
REF_AVG, REF_P99, REF_TPOT = (15.36, 9.33), (48.87, 23.51), 0.025
BASE = ["model.name=qwen3-32b", "gpu.name=h200", "model.tp=2", "cache.page_size=64",
        "pd.enabled=true"]  # fmt: skip
BLOCK = 512


def write_trace(path: Path, sessions: int) -> None:
    lines = []
    for s in range(sessions):
        first = s * 1000
        for k, n in enumerate(ROUNDS):
            req = {"timestamp": s * 500, "input_length": n, "output_length": 256,
                   "hash_ids": list(range(first, first + n // BLOCK)),
                   "session_id": f"s{s}", "turn": k, "think_time_ms": 1000}  # fmt: skip
            lines.append(json.dumps(req))
    path.write_text("\n".join(lines) + "\n")


def run(trace_path: Path, on: bool) -> tuple[dict, object]:
    cfg = load_config(None, [*BASE, f"pd.decode_radix_cache={str(on).lower()}"])
    frames: dict = {}
    s = run_simulation(cfg, read_trace(trace_path), frames_out=frames)
    return s, frames["requests"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=24)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "e3.jsonl"
        write_trace(path, args.sessions)
        (s_off, off), (s_on, on) = run(path, False), run(path, True)
    n = len(ROUNDS)
    print(f"E3 rebuild: {args.sessions} sessions x {n} rounds, Qwen3-32B, H200, TP 2 per role")
    print("round  prompt  TTFT off / on (s)   ref off / on   decode hit rate (device+host)")
    for k in range(n):
        a, b = off[off["rid"] % n == k], on[on["rid"] % n == k]
        ta = float((a["first_token_s"] - a["arrival_s"]).mean())
        tb = float((b["first_token_s"] - b["arrival_s"]).mean())
        hit = float((b["decode_device_hit_tokens"] + b["decode_host_hit_tokens"]).sum()) / float(
            b["prompt_tokens"].sum()
        )
        print(f"{k + 1:5d}  {ROUNDS[k]:6d}  {ta:8.2f} / {tb:6.2f}    {REF_OFF[k]:6.2f} / "
              f"{REF_ON[k]:5.2f}   {hit:.2f}")  # fmt: skip

    def p99(df: object) -> float:
        t = df["first_token_s"] - df["arrival_s"]  # type: ignore[index]
        return float(np.quantile(t, 0.99))

    cut = 1 - s_on["ttft_mean_s"] / s_off["ttft_mean_s"]
    ref_cut = 1 - REF_AVG[1] / REF_AVG[0]
    tpot = s_on["tpot_mean_s"] / s_off["tpot_mean_s"] - 1
    print(f"TTFT mean {s_off['ttft_mean_s']:.2f} -> {s_on['ttft_mean_s']:.2f} s (cut {cut:.1%}; "
          f"ref {REF_AVG[0]} -> {REF_AVG[1]} s, cut {ref_cut:.1%})")  # fmt: skip
    print(f"TTFT p99 {p99(off):.2f} -> {p99(on):.2f} s (ref {REF_P99[0]} -> {REF_P99[1]} s)")
    print(f"TPOT {s_off['tpot_mean_s'] * 1e3:.2f} -> {s_on['tpot_mean_s'] * 1e3:.2f} ms "
          f"({tpot:+.1%}; ref {REF_TPOT:+.1%})")  # fmt: skip
    dec = s_on["roles"]["decode"]
    print(f"decode hits: device {dec['device_hit_rate']:.2%}, host {dec['host_hit_rate']:.2%}; "
          f"transfer saved {s_on['transfer_bytes_saved_share']:.1%} of the bytes")  # fmt: skip


if __name__ == "__main__":
    main()
