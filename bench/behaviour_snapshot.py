"""Snapshot every decision-bearing output of the CLI, to show a refactor changed no behaviour.

Runs, through the installed ``hicache-sim`` command (so it works across module moves):

* ``hitrate`` over several configurations (write policies, evictions incl. oracle, page sizes,
  with and without a host tier);
* ``demo`` (its four timed runs and its cache-only grid);
* ``sweep examples/quick.toml`` (24 timed runs);
* extra timed runs through the scheduler paths the demo does not reach (chunked prefill, LPM,
  retraction under a tiny pool, closed-loop sessions, outputs=skip);
* ``replay run`` on CPU tensors (the cache counters only: op times are measured).

Every ``summary.json`` field is kept except wall-clock ones. ``--save FILE`` writes the
snapshot; ``--compare FILE`` recomputes it and lists every difference (exit 1 if any).

    python bench/behaviour_snapshot.py --save bench/baselines/behaviour.json
    python bench/behaviour_snapshot.py --compare bench/baselines/behaviour.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONV = ROOT / "traces/data/mooncake/conversation_trace.jsonl"
MULTI = ROOT / "traces/data/synthetic/multiturn.jsonl"
SHARED = ROOT / "traces/data/synthetic/shared-prefix.jsonl"
LONG = Path("<long>")  # generated: see snapshot()
# wall-clock fields: the only ones allowed to differ
WALL = {"wall_s", "wall_time_s", "sim_wall_s", "replay_s", "elapsed_s", "requests_per_s"}

HITRATE = [
    (CONV, ["--device-tokens", "1000000,4000000", "--hicache-ratio", "2", "--page-size", "64",
            "--eviction", "lru,lfu", "--write-policy",
            "write_through,write_through_selective,write_back"]),
    (CONV, ["--device-tokens", "2000000", "--host-tokens", "0,6000000", "--page-size", "64",
            "--eviction", "oracle,fifo,mru,filo,priority"]),
    (MULTI, ["--device-tokens", "4096,16384", "--hicache-ratio", "2", "--page-size", "16",
             "--eviction", "lru,lfu", "--write-policy", "write_through,write_back",
             "--outputs", "skip"]),
    (MULTI, ["--device-tokens", "4096", "--hicache-ratio", "2", "--page-size", "1",
             "--eviction", "lru,slru", "--write-policy", "write_through_selective,write_back"]),
    (SHARED, ["--device-tokens", "8192", "--hicache-ratio", "4", "--page-size", "16",
              "--eviction", "lru,oracle"]),
]  # fmt: skip

RUNS = {
    "chunk512": (CONV, ["workload.max_requests=1500", "scheduler.chunked_prefill_size=512",
                        "workload.rate_scale=0.25"]),
    "lpm_wb": (CONV, ["workload.max_requests=1500", "scheduler.policy=lpm",
                      "cache.write_policy=write_back", "workload.rate_scale=0.5"]),
    "small_wb": (MULTI, ["gpu.device_tokens=4096", "cache.write_policy=write_back",
                         "cache.eviction=lfu"]),
    "small_chunked": (MULTI, ["gpu.device_tokens=3072", "cache.hicache_ratio=4",
                              "scheduler.chunked_prefill_size=1024"]),
    # long outputs under a small pool: the decode memory check retracts (~25 retractions)
    "retract": (LONG, ["gpu.device_tokens=16384", "scheduler.max_running_requests=64"]),
    "retract_wb_lpm": (LONG, ["gpu.device_tokens=32768", "scheduler.max_running_requests=64",
                              "cache.write_policy=write_back", "scheduler.policy=lpm"]),
    "open_loop_skip": (SHARED, ["gpu.device_tokens=16384", "workload.closed_loop=off",
                                "workload.outputs=skip"]),
    "no_host": (MULTI, ["gpu.device_tokens=8192", "cache.enable_host=false"]),
    "selective": (MULTI, ["gpu.device_tokens=8192", "cache.write_policy=write_through_selective",
                          "cache.page_size=16"]),
    # issue 14 (speed): the whole conversation trace with the defaults at three loads, and
    # the settings whose fast paths differ (a running-request cap, chunks, LFU, an L3 tier)
    "full_r025": (CONV, ["workload.rate_scale=0.25"]),
    "full_r1": (CONV, ["workload.rate_scale=1"]),
    "full_r4": (CONV, ["workload.rate_scale=4"]),
    "maxrun_r1": (CONV, ["workload.max_requests=3000", "scheduler.max_running_requests=16"]),
    "chunk2048_r1": (CONV, ["workload.max_requests=3000", "scheduler.chunked_prefill_size=2048"]),
    "lfu_wb_r1": (CONV, ["workload.max_requests=3000", "cache.eviction=lfu",
                         "cache.write_policy=write_back"]),
    "l3_r025": (CONV, ["workload.max_requests=3000", "storage.backend=mooncake",
                       "workload.rate_scale=0.25"]),
}  # fmt: skip


CLI: list[str] = []  # the command (``--cli``); default: the installed hicache-sim
CWD: str | None = None
#: the SGLang release every command runs (``--sglang-version``; "" = the CLI's default). The
#: saved baseline was made with 0.5.14 (the default until issue 24 made it 0.5.23)
VERSION = "0.5.14"


def _version(flag: bool = True) -> list[str]:
    """The version as a command flag (``--sglang-version V``) or a ``--set`` item."""
    if not VERSION:
        return []
    return ["--sglang-version", VERSION] if flag else ["--set", f"sglang.version={VERSION}"]


def _cli(*args: str) -> None:
    exe = CLI or [shutil.which("hicache-sim") or str(Path(sys.executable).parent / "hicache-sim")]
    r = subprocess.run([*exe, *args], capture_output=True, text=True, cwd=CWD)
    if r.returncode != 0:
        raise SystemExit(f"hicache-sim {' '.join(args)} failed:\n{r.stderr[-3000:]}")


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in sorted(obj.items()) if k not in WALL}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return "nan"
    return obj


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k not in WALL} for row in csv.DictReader(f)]


def _summaries(folder: Path) -> dict[str, Any]:
    """Every summary.json below ``folder``, plus a digest of each run's per-request table
    (every decision shows in some request's times or hit counts)."""
    import pandas as pd

    out = {}
    for p in sorted(folder.rglob("summary.json")):
        s = _clean(json.loads(p.read_text()))
        req = p.parent / "requests.parquet"
        if req.exists():
            df = pd.read_parquet(req)
            if "instance" in df and not df["instance"].any():
                # a one-instance run's server column (issue 16) is all 0: not a decision
                df = df.drop(columns="instance")
            text = df.round(9).to_csv(index=False).encode()
            s["requests_table_sha256"] = hashlib.sha256(text).hexdigest()
        # a sweep job folder's name ends in a hash of its resolved config, which changes
        # whenever a config key is added: a job is identified by its axes instead
        job = p.parent / "job.json"
        name = str(p.parent.relative_to(folder))
        if job.exists():
            axes = json.loads(job.read_text())["axes"]
            name = "job:" + ",".join(f"{k}={axes[k]}" for k in sorted(axes))
        out[name] = s
    return out


def snapshot(tmp: Path) -> dict[str, Any]:
    snap: dict[str, Any] = {}
    for i, (trace, args) in enumerate(HITRATE):
        out = tmp / f"hitrate{i}.csv"
        _cli("hitrate", str(trace), *args, "--csv", str(out), "--jobs", "2", *_version())
        snap[f"hitrate{i}"] = _csv_rows(out)
    _cli("demo", "--out", str(tmp / "demo"), "--jobs", "2", *_version())
    snap["demo"] = _summaries(tmp / "demo")
    snap["demo_hitrate"] = _csv_rows(tmp / "demo/hitrate.csv")
    _cli("sweep", str(ROOT / "examples/quick.toml"), "--out", str(tmp / "quick"), "--jobs", "2",
         *_version())  # fmt: skip
    snap["quick"] = _summaries(tmp / "quick")
    long = tmp / "long.jsonl"
    _cli("trace", "gen", "multiturn", "--clients", "32", "--rounds", "3", "--output-length",
         "1500", "--request-length", "256", "--request-rate", "50", "--no-closed-loop",
         "--out", str(long))  # fmt: skip
    for name, (trace, sets) in RUNS.items():
        out = tmp / "runs" / name
        _cli(
            "run",
            str(long if trace == LONG else trace),
            "--out",
            str(out),
            *[a for s in sets for a in ("--set", s)],
            *_version(flag=False),
        )
        snap[f"run:{name}"] = _summaries(out)
    try:
        import torch  # noqa: F401
    except ImportError:
        snap["replay"] = "skipped: no torch"
    else:
        out = tmp / "replay"
        _cli("replay", "run", str(MULTI), "--device", "cpu", "--out", str(out),
             "--device-mem-gb", "0.05", "--host-mem-gb", "0.2", "--layers", "2",
             "--flush-mib", "0", *_version())  # fmt: skip
        snap["replay"] = _clean(json.loads((out / "summary.json").read_text())["cache"])
    return snap


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'new' if k in b else 'saved'}")
            else:
                _diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: saved {a!r} != new {b!r}")


def main() -> int:
    global CWD, VERSION
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", type=Path)
    g.add_argument("--compare", type=Path)
    ap.add_argument("--cli", help="the command to run instead of hicache-sim, e.g. to snapshot "
                    "an older checkout: --cli 'python -m sim.cli' --cwd ../old")  # fmt: skip
    ap.add_argument("--cwd", help="folder to run the command in")
    ap.add_argument("--allow-added", default="", help="comma-separated keys that may be new")
    ap.add_argument("--show", type=int, default=200, help="differences printed (default 200)")
    ap.add_argument("--sglang-version", default=VERSION,
                    help=f"the release every command runs (default {VERSION}, the baseline's; "
                    "'' = the CLI's default)")  # fmt: skip
    args = ap.parse_args()
    VERSION = args.sglang_version
    CLI[:] = shlex.split(args.cli) if args.cli else []
    CWD = args.cwd
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        snap = snapshot(Path(d))
    # paths under the temp folder differ run to run; the structure is what matters
    text = json.dumps(snap, indent=1, sort_keys=True).replace(d, "<tmp>")
    print(f"snapshot in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(text + "\n")
        return 0
    saved = json.loads(args.compare.read_text())
    diffs: list[str] = []
    _diff(saved, json.loads(text), "", diffs)
    allowed = {k for k in args.allow_added.split(",") if k}
    added = [
        d for d in diffs if d.endswith(": only in new") and d.rsplit("/", 1)[-1][:-13] in allowed
    ]
    if added:
        print(f"{len(added)} allowed additions ({', '.join(sorted(allowed))})")
        diffs = [d for d in diffs if d not in added]
    for line in diffs[: args.show]:
        print(line)
    print(f"{len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
