"""The fast scheduler against the reference one (``scheduler.engine``), on random workloads.

:func:`random_case` draws a workload and a configuration from a seed: a synthetic trace
(multi-turn chat, agents, shared prefixes) or a slice of the bundled Mooncake trace, open or
closed loop with think times, chunked prefill down to 512, FCFS or LPM, small device pools
(retraction), write_back (stalls), an L3 tier (prefetch), 1-4 instances behind a router, both
SGLang releases. :func:`run_case` runs it under one engine and keeps what must not depend on
the engine: every request's row (arrival, admission, first token, finish, hits, prefill and
stall times) and the summary's counters. :func:`compare` lists where two runs differ
(counts exactly; times within 1e-9 relative, and durations, which are differences of two times,
within 1e-9 of the run's time scale).

``tests/sim/test_reference_differential.py`` runs a slice in ``make test``;
``bench/differential.py`` runs hundreds of seeds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hicache.policy.storage import PREFETCH_POLICIES
from traces.schema import Trace

BUNDLED = Path(__file__).resolve().parents[1] / "traces/data/mooncake/conversation_trace.jsonl"
#: relative tolerance on times: the fast scheduler sums a segment's steps in closed form where
#: the reference adds them one by one
REL = 1e-9
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
ROUTERS = ("round_robin", "least_load", "power_of_two", "session_affinity", "cache_aware",
           "tier_aware")  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One drawn workload: its trace, the config overrides and a one-line description."""

    seed: int
    trace: Trace
    sets: tuple[str, ...]
    what: str


def _trace(rng: random.Random) -> tuple[Trace, str, bool]:
    """A random trace; returns it, its description and whether it records think times."""
    from traces.generate import agentic, multiturn, shared_prefix

    kind = rng.choice(["multiturn", "multiturn", "agentic", "shared_prefix", "mooncake"])
    seed = rng.randrange(1 << 30)
    bs = rng.choice([16, 64, 512])
    if kind == "multiturn":
        t = multiturn(clients=rng.randint(3, 24), rounds=rng.randint(2, 6),
                      request_length=rng.randint(64, 3000), output_length=rng.randint(1, 300),
                      request_rate=rng.uniform(0.5, 20), think_time_ms=rng.uniform(0, 2000),
                      closed_loop=rng.random() < 0.8, block_size=bs, seed=seed)  # fmt: skip
    elif kind == "agentic":
        t = agentic(sessions=rng.randint(2, 10), steps=rng.randint(2, 6),
                    system_length=rng.randint(64, 3000), task_length=rng.randint(32, 800),
                    output_length=rng.randint(1, 200), tool_output_length=rng.randint(32, 1500),
                    tool_time_ms=rng.uniform(0, 1500), session_rate=rng.uniform(0.2, 5),
                    closed_loop=rng.random() < 0.8, block_size=bs, seed=seed)  # fmt: skip
    elif kind == "shared_prefix":
        t = shared_prefix(requests=rng.randint(10, 120), prefixes=rng.randint(1, 6),
                          prefix_length=rng.randint(64, 4000), suffix_length=rng.randint(16, 600),
                          output_length=rng.randint(1, 300), jitter=rng.uniform(0, 0.5),
                          request_rate=rng.uniform(1, 40), block_size=bs, seed=seed)  # fmt: skip
    else:
        from traces.io import read_trace

        full = read_trace(BUNDLED)
        n = rng.randint(20, 150)
        start = rng.randrange(len(full.requests) - n)
        t0 = full.requests[start].timestamp
        reqs = [replace(r, timestamp=r.timestamp - t0) for r in full.requests[start : start + n]]
        t = Trace(requests=reqs, header=full.header)
    closed = any(r.think_time_ms is not None for r in t.requests)
    return t, f"{kind} n={len(t.requests)} bs={t.block_size}", closed


def random_case(seed: int) -> Case:
    """The workload and configuration of ``seed``."""
    rng = random.Random(seed)
    trace, what, closed = _trace(rng)
    ps = rng.choice([1, 16, 64] if trace.block_size >= 64 else [1, 16])
    longest = max(r.input_length + r.output_length for r in trace.requests)
    # device pools from roomy to tight (retraction, eviction), never below the longest request
    device = max(longest + 4 * ps + 64, int(longest * rng.choice([1.3, 2, 4, 16, 64])))
    device = -(-device // ps) * ps
    sets = [
        f"sglang.version={rng.choice(['0.5.14', '0.5.23'])}",
        f"cache.page_size={ps}",
        f"gpu.device_tokens={device}",
        f"cache.hicache_ratio={rng.choice([1.5, 2.0, 4.0])}",
        f"cache.write_policy={rng.choice(WRITE_POLICIES)}",
        f"cache.eviction={rng.choice(['lru', 'lru', 'lfu'])}",
        f"scheduler.policy={rng.choice(['fcfs', 'fcfs', 'lpm'])}",
        f"scheduler.chunked_prefill_size={rng.choice([512, 2048, 8192, -1])}",
        f"workload.rate_scale={rng.choice([0.25, 1.0, 4.0])}",
        # the pools are sized for the scheduler paths, not for a real server's DRAM
        "gpu.allow_host_overcommit=true",
    ]
    if rng.random() < 0.25:
        sets.append(f"scheduler.max_running_requests={rng.randint(1, 12)}")
    if closed and rng.random() < 0.2:
        sets.append("workload.closed_loop=off")
    if rng.random() < 0.3:
        sets.append(f"storage.backend={rng.choice(['mooncake', 'file'])}")
    n = rng.choice([1, 1, 2, 3, 4])
    if n > 1:
        sets += [f"cluster.instances={n}", f"router.policy={rng.choice(ROUTERS)}"]
    # drawn from a stream of its own, so that every other draw of a seed stays as it was
    if random.Random(seed * 7919 + 1).random() < 0.3:
        sets.append("scheduler.enable_mixed_chunk=true")
    # the same for TP (its per-request HiCache votes hold the scheduler) and the prefetch policy
    more = random.Random(seed * 7919 + 2)
    if more.random() < 0.3:
        sets.append("model.tp=2")
    if any(x.startswith("storage.backend=") for x in sets):
        sets.append(f"storage.prefetch_policy={more.choice(PREFETCH_POLICIES)}")
    return Case(seed, trace, tuple(sets), what)


def run_case(case: Case, engine: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``case`` under the scheduler ``engine``; returns its requests table and summary."""
    from hicache.config import load_config
    from sim.engine import run_simulation

    got: dict[str, Any] = {}
    cfg = load_config(None, [*case.sets, *extra, f"scheduler.engine={engine}"])
    summary = run_simulation(cfg, case.trace, None, progress=False, frames_out=got)
    for key in ("wall_time_s", "speed", "scheduler_engine"):
        summary.pop(key, None)
    got["summary"] = summary
    return got


def _close(a: Any, b: Any, scale: float = 0.0) -> bool:
    """Equal, or (floats) within ``REL`` of the larger, or of ``scale``: a duration derived from
    two times (a queue, a TTFT) carries their rounding, relative to the times, not to itself."""
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)
        if math.isnan(fa) and math.isnan(fb):
            return True
        return fa == fb or abs(fa - fb) <= REL * max(abs(fa), abs(fb), scale)
    return bool(a == b)


def _leaves(x: Any, path: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(x, (list, tuple)):
        out = {}
        for i, v in enumerate(x):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out
    return {path: x}


def compare(a: dict[str, Any], b: dict[str, Any], limit: int = 8) -> list[str]:
    """Where runs ``a`` and ``b`` differ: request cells (rid, column, both values), then summary
    leaves; at most ``limit`` lines."""
    diffs: list[str] = []
    ra, rb = a["requests"], b["requests"]
    if len(ra) != len(rb) or list(ra.columns) != list(rb.columns):
        return [f"requests tables differ in shape: {ra.shape} vs {rb.shape}"]
    # the run's time scale: seconds-valued cells are compared within REL of it
    scale = float(ra["finish_s"].abs().max()) if len(ra) else 0.0
    for col in ra.columns:
        tol = scale if col.endswith("_s") else 0.0
        for rid, x, y in zip(ra["rid"], ra[col], rb[col], strict=True):
            if not _close(x, y, tol):
                diffs.append(f"request {rid} {col}: {x!r} vs {y!r}")
                break
        if len(diffs) >= limit:
            return diffs
    la, lb = _leaves(a["summary"]), _leaves(b["summary"])
    for key in sorted(set(la) | set(lb)):
        tol = scale if key.endswith("_s") else 0.0
        if key not in la or key not in lb or not _close(la[key], lb[key], tol):
            diffs.append(f"summary {key}: {la.get(key)!r} vs {lb.get(key)!r}")
            if len(diffs) >= limit:
                break
    return diffs
