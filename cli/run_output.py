"""What ``hicache-sim run`` prints: the resolved setup, the summary (hit rates, TTFT/TPOT, PCIe
per rank, L3 per instance, the fleet, defects, warm-up and context limit), and the ``--seeds``
intervals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_seeds(block: dict[str, Any]) -> str:
    """The ``seeds`` block as a table: per figure the median and the 90 % interval."""
    runs = block["runs"]
    seeds = [r["seed"] for r in runs]
    lo, hi = (round(q * 100) for q in block["interval"])
    names = {
        "hit_rate": "hit rate", "device_hit_rate": "device hit rate",
        "host_hit_rate": "host hit rate", "storage_hit_rate": "L3 hit rate",
        "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "ttft_p99_s": "TTFT p99",
        "tpot_mean_s": "TPOT mean", "throughput_output_tok_s": "output tok/s",
    }  # fmt: skip

    def show(key: str, v: float) -> str:
        if key.endswith("hit_rate"):
            return f"{v:.2%}"
        if key.endswith("_s") and not key.endswith("tok_s"):
            return duration(v)
        return f"{v:,.0f}"

    lines = [
        f"seeds: {len(runs)} runs (run.seed {seeds[0]}-{seeds[-1]}; {block['method']}); "
        f"median and {hi - lo}% interval (p{lo} - p{hi})"
    ]
    for key, iv in block["intervals"].items():
        if key == "storage_hit_rate" and not any(r.get(key) for r in runs):
            continue  # no L3 tier
        lines.append(
            f"  {names.get(key, key):<16} {show(key, iv['median']):>10}   "
            f"{show(key, iv['lo'])} - {show(key, iv['hi'])}"
        )
    over = [r["seed"] for r in runs if r.get("overloaded")]
    if over:
        lines.append(f"  overloaded in {len(over)} of {len(runs)} runs (seeds {_seeds(over)})")
    return "\n".join(lines)


def _seeds(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds[:8])) + (", ..." if len(seeds) > 8 else "")


def format_setup(cfg: Any, trace: Any) -> str:
    """What a run is about to simulate, resolved: model, GPU, TP and server; the pools in
    tokens and GB per rank (the unit of ``--hicache-size``); and how arrivals are replayed."""
    from hicache.config import resolve_pools, server_for
    from sim.engine import resolve_closed_loop

    device, host, bpt = resolve_pools(cfg)
    tp, server = cfg.model.tp, server_for(cfg)
    policy = cfg.cache.write_policy if cfg.cache.enable_host else "no host tier"
    lines = [
        f"setup: {cfg.model.spec.name} on {cfg.gpu.name} x TP{tp} (server {server.name}), "
        f"SGLang {cfg.sglang.version}, {policy}"
    ]
    pools = f"pools: device {device:,} tokens ({device * bpt / 1e9:,.1f} GB per rank)"
    if cfg.cache.enable_host:
        pools += (
            f", host {host:,} tokens ({host * bpt / 1e9:,.1f} GB per rank, "
            f"{host * bpt * tp / 1e9:,.1f} GB per instance)"
        )
    lines.append(pools)
    n = cfg.workload.max_requests or len(trace.requests)
    if resolve_closed_loop(cfg.workload.closed_loop, trace, n):
        lines.append(
            "arrivals: closed loop (the trace records think times: each turn arrives its think "
            "time after the previous turn finished; workload.closed_loop=off replays the "
            "timestamps)"
        )
    elif cfg.workload.rate_scale != 1:
        lines.append(
            f"arrivals: open loop (the trace's timestamps, {cfg.workload.rate_scale:g}x as fast)"
        )
    else:
        lines.append("arrivals: open loop (the trace's timestamps)")
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """A latency in the unit a reader takes in: ms below 1 s, s below 10 min, then min or h."""
    if seconds != seconds:  # NaN: no request had one
        return "n/a"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 600.0:
        return f"{seconds:.2f} s"
    if seconds < 7200.0:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _context_lines(s: dict[str, Any]) -> list[str]:
    """What the context limit (``workload.max_context``) did, when one is set."""
    if "context_aborted" not in s:
        return []
    return [
        f"context limit: {s['context_aborted']:,} prompts too long aborted (of the rejected), "
        f"{s['context_truncated']:,} cut (auto-truncate), {s['context_capped_outputs']:,} "
        "outputs capped to fit"
    ]


def format_summary(s: dict[str, Any]) -> str:
    ttft = "  ".join(
        f"{name} {duration(s[key])}"
        for name, key in (("mean", "ttft_mean_s"), ("p50", "ttft_p50_s"), ("p90", "ttft_p90_s"),
                          ("p99", "ttft_p99_s"))
    )  # fmt: skip
    storage = s.get("storage")
    l3 = f", L3 storage {s.get('storage_hit_rate', 0.0):.2%}" if storage else ""
    lines = [
        f"requests {s['requests']:,} ({s['rejected_requests']} rejected)  "
        f"simulated {s['sim_duration_s']:.1f} s in {s['wall_time_s']:.1f} s",
        *_warmup_lines(s),
        *_context_lines(s),
        f"hit rate {s['hit_rate']:.2%} (device {s['device_hit_rate']:.2%}, host "
        f"{s['host_hit_rate']:.2%}{l3})",
        f"TTFT {ttft}",
        f"TPOT mean {duration(s['tpot_mean_s'])}  E2E mean {duration(s['e2e_mean_s'])}  "
        f"output {s['throughput_output_tok_s']:.0f} tok/s",
        f"PCIe per rank: D2H {s['bytes_d2h'] / 1e9:.1f} GB  H2D {s['bytes_h2d'] / 1e9:.1f} GB  "
        f"retractions {s['retractions']}",
    ]
    if storage:
        lines.append(l3_line(storage))
    defects = defects_line(s)
    if defects:
        lines.append(defects)
    if "per_instance" in s:
        lines.append(fleet_line(s))
    if s.get("overloaded"):
        lines.append(f"WARNING: {s['overload_message']}")
    return "\n".join(lines)


def _warmup_lines(s: dict[str, Any]) -> list[str]:
    """What a warm-up window left out (``workload.warmup_s``); none without a window."""
    if "warmup_requests" not in s:
        return []
    lines = [
        f"warm-up: {s['warmup_requests']:,} requests arriving before {s['warmup_end_s']:.1f} s "
        f"ran but count in no figure below (PCIe: copies from {s['warmup_end_s']:.1f} s on)"
    ]
    if not s["requests"]:
        lines.append(
            f"WARNING: workload.warmup_s={s['warmup_s']:g} covers every arrival: nothing was "
            "measured; shorten the window"
        )
    return lines


def l3_line(st: dict[str, Any]) -> str:
    """One line of a run's L3 traffic and prefetches (its summary's ``storage`` block)."""
    wait = st.get("prefetch_wait_mean_s", 0.0)
    p90 = st.get("prefetch_wait_p90_s", 0.0)
    return (
        f"L3 {st.get('backend', '?')}: per instance read "
        f"{st.get('bytes_read', 0) / 1e9:,.1f} GB  written "
        f"{st.get('bytes_written', 0) / 1e9:,.1f} GB  prefetches {st.get('prefetches_issued', 0):,}"
        f" ({st.get('prefetches_terminated', 0):,} terminated, "
        f"{st.get('prefetches_revoked', 0):,} revoked)  wait mean {duration(wait)} p90 "
        f"{duration(p90)}  {st.get('requests_with_l3_hit', 0):,} requests hit L3"
    )


def defects_line(s: dict[str, Any]) -> str:
    """``"SGLang 0.5.14 defects this run would hit: D5 x51 (614,400 tokens); ..."`` for the
    nonzero counters of the summary's ``sglang_defects`` (0.5.23: the one it reproduces); ""
    when none (or no counters)."""
    hit = [(code, d) for code, d in (s.get("sglang_defects") or {}).items() if d.get("count", 0)]
    if not hit:
        return ""
    parts = [
        f"{code} x{d['count']:,}" + (f" ({d['tokens']:,} tokens)" if d.get("tokens") else "")
        for code, d in hit
    ]
    version = s.get("sglang_version", "0.5.14")
    if version != "0.5.14":
        return (
            f"SGLang {version} defects this run meets (reproduced, as SGLang behaves; "
            f"sglang_defects in summary.json): {'; '.join(parts)}"
        )
    return (
        f"SGLang 0.5.14 defects this run would hit (what the simulator does instead: "
        f"sglang_defects in summary.json): {'; '.join(parts)}"
    )


def fleet_line(s: dict[str, Any]) -> str:
    """One line for a cluster: the router, how evenly it loaded the instances (idle ones
    named), and the spread of their hit rates and TTFT p90 over the instances that served."""
    per = [p for p in s["per_instance"] if p["requests"]]
    hits = [p["hit_rate"] for p in per]
    p90 = [p["ttft_p90_s"] for p in per if p["ttft_p90_s"] == p["ttft_p90_s"]]
    spread = f"TTFT p90 {duration(min(p90))} - {duration(max(p90))}" if p90 else "no TTFT"
    n, idle = s["instances"], s.get("idle_instances", [])
    line = (
        f"instances {n} ({s['router']}): load imbalance {s['imbalance_requests']:.2f}x "
        f"requests, {s['imbalance_prompt_tokens']:.2f}x prompt tokens (1 = even, {n} = one "
        f"instance took all)"
    )
    if hits:
        line += f"; hit rate {min(hits):.1%} - {max(hits):.1%}; {spread}"
    if idle:
        shown = ", ".join(map(str, idle[:8])) + (", ..." if len(idle) > 8 else "")
        line += (
            f"\nwarning: {len(idle)} of {n} instances got no request ({shown}): the "
            f"{s['router']} router used {n - len(idle)}; adding instances changes nothing for it"
        )
    return line


__all__ = ["defects_line", "duration", "fleet_line", "format_seeds", "format_setup",
           "format_summary", "l3_line"]  # fmt: skip
