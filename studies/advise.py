"""``advise``: the questions operators ask about HiCache (REFERENCES.md §U), answered for one
trace and one configuration, each answer with the run that backs it.

1. Will HiCache help? The trace's working set (its distinct KV, per rank) against the device
   pool, and the cache-only hit rate with and without a host tier: HiCache helps when the
   working set is larger than HBM and the infinite-capacity hit rate is well above what HBM
   alone reaches (``sgl-project/sglang#7059``: a working set that fits in HBM gains nothing).
2. The host pool per rank that fits the server: its DRAM, less SGLang's 10 GiB reserve, over
   every rank of a full server (:func:`hicache.config.host_memory`), and no larger than the
   working set needs.
3. The write policy: the cache-only hit rates of write_through, write_through_selective and
   write_back at that host pool, and the device-to-host bytes each writes.
4. L3 against recompute: the cache-only gain of an unbounded L3 store, and per prompt length
   what loading a prefix from the store takes against recomputing it on this GPU.
5. What enabling HiCache costs when nothing hits: the per-step HiCache checks of the SGLang
   version (:func:`hicache.forward.hicache_checks`) against a decode step and a prefill pass.
6. The router: for one instance there is none; with several the timed run's balance.
7. The per-tier hits under SGLang's own metric names (``sglang:cached_tokens_total{cache_source=
   "device" | "host" | "storage"}``, 0.5.23 ``observability/metrics_collector.py``).

Then two timed runs, without a host tier and with the chosen policy and host pool, give TTFT
with and without HiCache. Every number comes from the simulator's own runs; nothing is
looked up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from traces.schema import Trace

__all__ = ["Advice", "Answer", "advise"]

#: A host tier "helps" when it adds at least this much hit rate (points) in the cache-only replay.
HELPS_POINTS = 0.02
#: Prompt lengths (tokens) at which L3 loading is set against recompute.
L3_PROMPTS = (1024, 8192, 32768)


@dataclass
class Answer:
    """One question, its answer (a sentence), and the run or figure that backs it."""

    question: str
    answer: str
    backing: str
    verdict: str = ""
    """A one-word lead: ``yes`` / ``no`` / a policy name / a size."""


@dataclass
class Advice:
    """Every answer, and the figures behind them (``facts``: JSON-ready)."""

    setup: str
    answers: list[Answer]
    facts: dict[str, Any] = field(default_factory=dict)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.1f} GB"


def _host_fit(cfg: SimConfig, footprint_tokens: int, bpt: int) -> tuple[float, float, str]:
    """(largest host pool per rank that fits a full server, bytes; what the working set needs
    per rank, bytes; how the fit was found)."""
    from hicache.config import server_for
    from hicache.config.pools import HOST_MEMORY_RESERVE_BYTES

    server = server_for(cfg)
    need = footprint_tokens * bpt
    if cfg.gpu.host_memory_gb > 0:
        per_rank = (cfg.gpu.host_memory_gb * 1e9 - HOST_MEMORY_RESERVE_BYTES) / cfg.model.tp
        return per_rank, need, f"gpu.host_memory_gb {cfg.gpu.host_memory_gb:g} GB per instance"
    if not math.isfinite(server.dram_bytes):
        return math.inf, need, f"server {server.name} has no DRAM figure"
    ranks = max(1, server.gpus // cfg.model.tp) * cfg.model.tp
    per_rank = (server.dram_bytes - HOST_MEMORY_RESERVE_BYTES) / ranks
    how = (f"{server.name}: {_gb(server.dram_bytes)} of DRAM, less SGLang's 10 GiB reserve, over "
           f"{ranks} ranks of a full server")  # fmt: skip
    return per_rank, need, how


def advise(cfg: SimConfig, trace: Trace, jobs: int = 0, timed: bool = True) -> Advice:
    """Answer the operator's questions for ``cfg`` on ``trace`` (module docstring)."""
    from hicache.config import resolve_pools, server_for
    from sim.hitrate import HitRateConfig
    from studies.sweep.hitrate import run_hitrate_grid
    from traces.stats import trace_stats

    limit = cfg.workload.max_requests or None
    trace = replace(trace, requests=trace.requests[:limit])
    ps = cfg.cache.page_size
    stats = trace_stats(trace, ps, reuse=False)
    inf = float(stats["prefix_cache"]["infinite_capacity_hit_rate"][str(ps)])
    if cfg.workload.output_reuse != "none":  # earlier answers count as cached too
        from hicache.output_keys import infinite_capacity_hit_rate_reusing_outputs

        inf = infinite_capacity_hit_rate_reusing_outputs(trace, ps)
    footprint = int(stats["blocks"]["unique_footprint_tokens"])
    device, _, bpt = resolve_pools(replace(cfg, cache=replace(cfg.cache, enable_host=False)))
    fit, need, how = _host_fit(cfg, footprint, bpt)
    host_bytes = min(fit, max(need, 2 * device * bpt))  # no smaller than SGLang's default 2x
    host_tokens = int(host_bytes // bpt) // ps * ps
    host_gb = math.floor(host_tokens * bpt / 1e9)
    host_tokens = int(host_gb * 1e9 // bpt) // ps * ps if host_gb >= 1 else host_tokens

    def hr(host: int, wp: str = "write_through", l3: bool = False) -> HitRateConfig:
        return HitRateConfig(device, host, ps, cfg.cache.eviction if cfg.cache.eviction != "oracle"
                             else "lru", wp, outputs=cfg.workload.outputs, storage=l3,
                             sglang_version=cfg.sglang.version,
                             output_reuse=cfg.workload.output_reuse)  # fmt: skip

    policies = ("write_through", "write_through_selective", "write_back")
    grid = [hr(0), *(hr(host_tokens, wp) for wp in policies), hr(host_tokens, l3=True)]
    rows = run_hitrate_grid(trace, grid, jobs=jobs, progress=False)
    none, by_policy, l3 = rows[0], dict(zip(policies, rows[1:4], strict=True)), rows[4]
    best = max(policies, key=lambda p: (round(by_policy[p]["hit_rate"], 3), p == "write_through"))
    server = server_for(cfg)
    setup = (f"{cfg.model.spec.name} on {cfg.gpu.name} x TP{cfg.model.tp} ({server.name}), "
             f"SGLang {cfg.sglang.version}, page {ps}, {len(trace.requests):,} requests; "
             f"device pool {device:,} tokens ({_gb(device * bpt)} per rank)")  # fmt: skip
    facts: dict[str, Any] = {
        "device_tokens": device, "kv_bytes_per_token_per_rank": bpt,
        "working_set_tokens": footprint, "infinite_capacity_hit_rate": inf,
        "host_fit_bytes_per_rank": fit, "host_tokens": host_tokens, "host_gb_per_rank": host_gb,
        "cache_only": {"no host tier": none, **by_policy, "write_through + L3": l3},
    }  # fmt: skip
    answers = [
        _will_it_help(none, by_policy[best], inf, footprint, device, bpt),
        _host_size(fit, need, how, host_gb, host_tokens, cfg),
        _write_policy(by_policy, best, host_tokens),
        _l3(cfg, l3, by_policy["write_through"], bpt),
        _all_miss_cost(cfg),
        _router(cfg),
    ]
    if timed:
        facts["timed"] = _timed(cfg, trace, best, host_gb)
        answers.append(_ttft(facts["timed"], best, host_gb))
    answers.append(_metrics(facts.get("timed", {}).get("hicache") or by_policy[best]))
    return Advice(setup, answers, facts)


def _will_it_help(
    none: dict[str, Any], best: dict[str, Any], inf: float, footprint: int, device: int, bpt: int
) -> Answer:
    gain = best["hit_rate"] - none["hit_rate"]
    fits = footprint <= device
    times = "fits in the device pool" if fits else f"is {footprint / device:,.1f}x the device pool"
    size = (f"the trace's working set ({footprint:,} tokens, {_gb(footprint * bpt)} per rank) "
            f"{times} ({device:,} tokens)")  # fmt: skip
    split = (f"HBM alone serves {none['hit_rate']:.1%} of prompt tokens from cache, with a host "
             f"tier {best['hit_rate']:.1%} (device {best['device_hit_rate']:.1%}, host "
             f"{best['host_hit_rate']:.1%}; {gain * 100:+.1f} points), of the {inf:.1%} an "
             "infinite cache would")  # fmt: skip
    verdict = "no" if fits or gain < HELPS_POINTS else "yes"
    if verdict == "yes":
        text = f"yes: {size}; {split}"
    elif fits:
        text = f"no: {size}: {split}"
    else:
        text = f"no: {size}, but what the trace reuses already stays in HBM: {split}"
    return Answer("Will HiCache help?", text, "cache-only replay (hicache-sim hitrate), "
                  "trace stats (working set, infinite-capacity hit rate)", verdict)  # fmt: skip


def _host_size(
    fit: float, need: float, how: str, host_gb: int, host_tokens: int, cfg: SimConfig
) -> Answer:
    cap = "no DRAM limit" if not math.isfinite(fit) else f"at most {_gb(fit)} per rank fits"
    text = (f"--hicache-size {host_gb} ({host_tokens:,} tokens per rank): {cap} ({how}); the "
            f"working set needs {_gb(need)} per rank")  # fmt: skip
    if cfg.sglang.version != "0.5.14":
        text += (f"; SGLang {cfg.sglang.version} without --hicache-size or --hicache-ratio sizes "
                 "the host pool to fit by itself (--hicache-host-memory-fraction 0.8)")  # fmt: skip
    return Answer("How big a host pool per rank fits the server?", text,
                  "hicache.config.host_memory (the DRAM check run, sweep and plan apply)",
                  f"{host_gb} GB/rank")  # fmt: skip


def _write_policy(by: dict[str, dict[str, Any]], best: str, host_tokens: int) -> Answer:
    parts = [f"{p} {r['hit_rate']:.1%} ({r['tokens_written']:,} tokens written to host)"
             for p, r in by.items()]  # fmt: skip
    text = f"{best}: at {host_tokens:,} host tokens per rank, " + "; ".join(parts)
    return Answer("Which write policy?", text, "cache-only replay, the three policies at that "
                  "host pool", best)  # fmt: skip


def _l3(cfg: SimConfig, l3: dict[str, Any], wt: dict[str, Any], bpt: int) -> Answer:
    from hicache.storage_backends import get_backend
    from sim.costs import build_costs

    backend = get_backend(cfg.storage.backend if cfg.storage.enabled else "mooncake")
    costs = build_costs(replace(cfg, cache=replace(cfg.cache, enable_host=True)))
    ps, tp = cfg.cache.page_size, cfg.model.tp
    rows = []
    for n in L3_PROMPTS:
        load = backend.call_seconds("read", n // ps, ps * bpt, tp) + costs.op_time(
            "load", n * bpt, max(1, n // ps)
        )
        recompute = costs.prefill_time([(n, 0)])
        rows.append((n, load, recompute))
    gain = l3["hit_rate"] - wt["hit_rate"]
    faster = [n for n, load, rec in rows if load < rec]
    lines = ", ".join(f"{n:,} tokens: load {load * 1e3:.0f} ms vs recompute {rec * 1e3:.0f} ms"
                      for n, load, rec in rows)  # fmt: skip
    verdict = "yes" if gain >= HELPS_POINTS and faster else "no"
    what = (
        f"an unbounded {backend.name} store adds {gain * 100:+.1f} points (L3 "
        f"{l3['storage_hit_rate']:.1%} of prompt tokens)"
    )
    if not faster:
        text = f"no: on this hardware an L3 hit is no faster than recomputing it ({lines}); {what}"
    elif verdict == "no":
        text = (
            f"no gain: loading from the store beats recomputing ({lines}), but {what}: the "
            "trace reuses nothing that the host pool has not kept"
        )
    else:
        text = f"yes: {what}; from the store {lines}"
    return Answer("Is L3 faster than recompute here?", text,
                  f"cache-only replay with L3; the {backend.name} preset's read cost and the "
                  "GPU's prefill cost model", verdict)  # fmt: skip


def _all_miss_cost(cfg: SimConfig) -> Answer:
    from hicache.forward import forward_model, hicache_checks
    from hicache.hardware import get_gpu
    from hicache.latency import load_profile

    gpu = get_gpu(cfg.gpu.name)
    prof = load_profile(cfg.run.profile or None, cfg.gpu.name, cfg.link.name)
    checks = hicache_checks(cfg.sglang.version, cfg.model.tp, True, cfg.storage.enabled)
    fm = forward_model(cfg.model.spec, gpu, cfg.model.tp, prof, checks, ep=cfg.model.ep)
    step = fm.decode_time(32, 32 * 4096)
    prefill = fm.prefill_time([(4096, 0)])
    per_step, per_pass = fm.decode_checks_s / step, fm.prefill_checks_s / prefill
    writes = ("plus the device-to-host writes of write-through, which overlap compute (they "
              "take PCIe, not GPU time)")  # fmt: skip
    if not fm.decode_checks_s and not fm.prefill_checks_s:
        text = (f"almost nothing: at TP{cfg.model.tp} SGLang {cfg.sglang.version} runs no "
                "per-step HiCache checks (they are TP all-reduces, only with TP > 1); "
                f"{writes}")  # fmt: skip
    else:
        text = (
            f"{fm.decode_checks_s * 1e6:.0f} us per decode step ({per_step:.1%} of a "
            f"32-request step at 4K context, {step * 1e3:.1f} ms) and "
            f"{fm.prefill_checks_s * 1e6:.0f} us per prefill pass ({per_pass:.2%} of a "
            f"4K-token prefill) for SGLang {cfg.sglang.version}'s HiCache checks at "
            f"TP{cfg.model.tp} ({checks[0]} per pass, {checks[1]} per step), {writes}"
        )
    return Answer("What does enabling HiCache cost when nothing hits?", text,
                  "hicache.forward (per-version HiCache checks, FIDELITY.md)",
                  f"{fm.decode_checks_s / step:.1%}/step")  # fmt: skip


def _router(cfg: SimConfig) -> Answer:
    if cfg.cluster.instances <= 1:
        return Answer("Which router?", "one instance: none is needed; `hicache-sim plan --router "
                      "cache_aware,round_robin` compares them for a fleet", "-", "n/a")  # fmt: skip
    return Answer("Which router?", f"{cfg.router.policy} over {cfg.cluster.instances} instances: "
                  "see the timed runs' balance below; plan --router compares policies",
                  "timed runs", cfg.router.policy)  # fmt: skip


def _timed(cfg: SimConfig, trace: Trace, best: str, host_gb: int) -> dict[str, Any]:
    from hicache.config import with_overrides
    from sim.engine import run_simulation

    off = with_overrides(cfg, ["cache.enable_host=false"])
    on = with_overrides(cfg, ["cache.enable_host=true", f"cache.write_policy={best}",
                              f"cache.hicache_size_gb={host_gb}"])  # fmt: skip
    return {"no_host": run_simulation(off, trace, None, False),
            "hicache": run_simulation(on, trace, None, False)}  # fmt: skip


def _ttft(timed: dict[str, Any], best: str, host_gb: int) -> Answer:
    from studies.plan.targets import format_seconds as sec

    a, b = timed["no_host"], timed["hicache"]
    text = (f"TTFT p50 {sec(a['ttft_p50_s'])} -> {sec(b['ttft_p50_s'])}, p90 "
            f"{sec(a['ttft_p90_s'])} -> {sec(b['ttft_p90_s'])}, hit rate {a['hit_rate']:.1%} -> "
            f"{b['hit_rate']:.1%} (timed, with {best} and {host_gb} GB per rank)")  # fmt: skip
    change = (b["ttft_p90_s"] - a["ttft_p90_s"]) / max(a["ttft_p90_s"], 1e-9)
    verdict = "faster" if change < -0.02 else "slower" if change > 0.02 else "the same"
    if a.get("overloaded") or b.get("overloaded"):
        verdict = "overloaded"
        text += (". One instance cannot keep up with this trace at this rate (" +
                 (b.get("overload_message") or a.get("overload_message", "")).removeprefix(
                     "overloaded: ") + "): size the fleet with hicache-sim plan")  # fmt: skip
    return Answer("What does it change for TTFT?", text, "two timed runs (hicache-sim run), "
                  "without and with the host tier", verdict)  # fmt: skip


def _metrics(row: dict[str, Any]) -> Answer:
    prompt = row.get("prompt_tokens") or 0
    shares = {k: row.get(f"{k}_hit_rate", 0.0) for k in ("device", "host", "storage")}
    parts = [
        f'sglang:cached_tokens_total{{cache_source="{k}"}} {v:.1%} of sglang:prompt_tokens_total'
        for k, v in shares.items()
        if v or k != "storage"
    ]
    text = "; ".join(parts) + (f" ({prompt:,} prompt tokens)" if prompt else "")
    return Answer("What will SGLang's own metrics show?", text, "the HiCache run's per-tier "
                  "hits, named as SGLang 0.5.23 exports them", "")  # fmt: skip
