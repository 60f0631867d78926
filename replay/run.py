"""Replay a trace with every write and load done as a real copy; measured vs predicted.

``hicache-sim replay run TRACE``: :class:`~replay.driver.TraceReplayer` sends the requests
through :class:`~hicache.policy.HiRadixCache` (the same code the simulator runs) on a
:class:`~replay.controller.TorchController`, so every backup and load_back moves real bytes
between a device KV tensor and a (pinned) host tensor; compute is not executed. Each op is timed
and set beside what ``hicache.latency`` predicts for it (``op_time`` of ``op_charges``, with
the profile's constants for the backend, uncoupled: the driver never overlaps the two
directions). :func:`run_replay` also measures the plain large-copy peak of the same machine and
reports the large ops' effective bandwidth against it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hicache.latency import OP_DIRECTION, Profile, op_charges, op_time
from hicache.policy import PageAllocator
from hicache.policy.allocator import device_pool
from replay.controller import TorchController
from replay.driver import TraceReplayer, trace_requests
from replay.pools import KVPools, PoolSizing, model_pools
from replay.runtime import Runtime

GiB = 1 << 30
MiB = 1 << 20


# --------------------------------------------------------------------------------- a run -----


@dataclass(frozen=True)
class ReplaySettings:
    """Everything a replay run needs besides the trace, the runtime and the profile."""

    model: str = "llama-3-8b"
    tp: int = 1
    gpu: str = "h100-sxm"
    link: str = "pcie5-x16"
    page_size: int = 64
    device_tokens: int = 0
    """Requested device pool (tokens) before scaling; from the config's ``resolve_pools``."""
    host_tokens: int = 0
    write_policy: str = "write_through"
    eviction: str = "lru"
    outputs: str = "cache"
    load_back_threshold: int = 10
    backend: str = "kernel"
    layout: str = "page_first"
    batch_tokens: int = 16384
    batch_requests: int = 8
    max_requests: int = 0
    device_budget_bytes: int = 2 * GiB
    host_budget_bytes: int = 4 * GiB
    scale: float = 1.0
    num_layers: int | None = None
    token_layer_bytes: int | None = None
    verify: bool = False
    peak_bytes: int = 256 * MiB
    large_op_bytes: int = 64 * MiB
    """Ops at least this large count as "large" for the bandwidth-vs-peak figure."""
    flush_bytes: int = 64 * MiB
    """Scratch memory overwritten where a forward pass would run (before a batch's loads, its
    prefill writes and its finish writes), so ops find the caches as a served batch leaves
    them, not warm with the previous op's buffers: the replay does not execute the model.
    Same meaning as ``BenchConfig.flush_bytes``, which the calibration bench uses; 0 turns it
    off."""
    warmup_pages: int | None = None
    """Untimed ops of 1, 2, 4, ... up to this many pages first, so no timed op pays a first
    staging allocation; None = the longest request's pages (at most the smaller pool), 0 =
    none."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def pools(self) -> PoolSizing:
        sizing = model_pools(
            self.model,
            tp=self.tp,
            page_size=self.page_size,
            device_tokens=self.device_tokens,
            host_tokens=self.host_tokens,
            device_budget_bytes=self.device_budget_bytes,
            host_budget_bytes=self.host_budget_bytes,
            layout=self.layout,
            scale=self.scale,
            num_layers=self.num_layers,
            token_layer_bytes=self.token_layer_bytes,
        )
        if not sizing.spec.host_pages:
            raise ValueError("the replay needs a host tier (cache.enable_host = true)")
        return sizing


def settings_from_config(cfg: Any, **overrides: Any) -> ReplaySettings:
    """:class:`ReplaySettings` from a ``hicache.config.SimConfig`` (pools from ``resolve_pools``,
    io backend and layout from ``link``), then ``overrides`` (``None`` values ignored).

    ``page_first_direct`` (what SGLang uses for direct IO with a page_first pool) is replayed
    as ``layer_first``: per page and layer both copy one contiguous chunk, so the direct copies
    are the same; the substitution is noted. ``page_head`` is not replayed.
    """
    from hicache.config import resolve_pools

    device_tokens, host_tokens, _ = resolve_pools(cfg)
    layout = cfg.link.mem_layout
    notes = []
    if layout == "page_first_direct":
        notes.append("page_first_direct replayed as layer_first (same per-page direct copies)")
        layout = "layer_first"
    backend = overrides.get("backend") or cfg.link.io_backend
    if overrides.get("layout"):
        layout = overrides["layout"]
    elif backend == "direct" and layout == "page_first":
        notes.append("direct IO replays the layer_first layout (page_first needs kernel IO)")
        layout = "layer_first"
    if layout not in ("layer_first", "page_first"):
        raise ValueError(f"link.mem_layout {layout!r} is not replayed; use layer_first/page_first")
    base = ReplaySettings(
        model=cfg.model.name,
        tp=cfg.model.tp,
        gpu=cfg.gpu.name,
        link=cfg.link.name,
        page_size=cfg.cache.page_size,
        device_tokens=device_tokens,
        host_tokens=host_tokens if cfg.cache.enable_host else 0,
        write_policy=cfg.cache.write_policy,
        eviction=cfg.cache.eviction,
        outputs=cfg.workload.outputs,
        load_back_threshold=cfg.cache.load_back_threshold,
        backend=backend,
        layout=layout,
        batch_tokens=cfg.scheduler.max_prefill_tokens,
        max_requests=cfg.workload.max_requests,
        notes=tuple(notes),
    )
    vals = {k: v for k, v in overrides.items() if v is not None and k not in ("backend", "layout")}
    return replace(base, **vals)


def predict(profile: Profile, ops: pd.DataFrame) -> np.ndarray:
    """``hicache.latency``'s seconds for each op row (``kind, backend, nbytes, runs, layers``),
    uncoupled (the replay never overlaps the two directions)."""
    out = np.empty(len(ops))
    for i, (kind, b, nb, runs, layers) in enumerate(
        zip(ops.kind, ops.backend, ops.nbytes, ops.runs, ops.layers, strict=True)
    ):
        link = profile.link(str(b), OP_DIRECTION[str(kind)])
        out[i] = op_time(link, op_charges(str(kind), int(nb), int(runs), int(layers)))
    return out


def _stats(err: np.ndarray) -> dict[str, float]:
    if len(err) == 0:
        return {"n": 0, "median": math.nan, "p90": math.nan}
    return {
        "n": len(err),
        "median": float(np.median(err)),
        "p90": float(np.quantile(err, 0.9)),
        "max": float(err.max()),
    }


def summarize_ops(
    ops: pd.DataFrame, peak_Bps: dict[str, float], large_op_bytes: int
) -> dict[str, Any]:
    """Prediction errors (``|predicted - measured| / measured``: median, p90, per direction and
    overall) and the effective bandwidth of large ops against the plain-copy peak.

    ``large_ops``: ops of at least ``large_op_bytes``, however fragmented (the largest tenth when
    there are none that large). ``large_contiguous_ops``: those of them that are one contiguous
    run (the largest single-run ops when there are none): the copies that *can* reach the peak,
    which the >= 90 % target is about; fragmented ones pay per-run costs by design."""
    out: dict[str, Any] = {"ops": len(ops)}
    if ops.empty:
        return out
    err = ops.rel_err.to_numpy()
    out["error"] = {"all": _stats(err)}
    large: dict[str, Any] = {}
    contiguous: dict[str, Any] = {}

    def bw_row(sel: pd.DataFrame, how: str, d: str) -> dict[str, Any]:
        bw = float((sel.nbytes / sel.duration_s).median())
        return {
            "selection": how,
            "n": len(sel),
            "median_Bps": bw,
            "peak_Bps": peak_Bps.get(d, math.nan),
            "fraction_of_peak": bw / peak_Bps[d] if d in peak_Bps else math.nan,
        }

    for d in ("d2h", "h2d"):
        sel = ops[ops.direction == d]
        out["error"][d] = _stats(sel.rel_err.to_numpy())
        if sel.empty:
            continue
        big = sel[sel.nbytes >= large_op_bytes]
        how = f">= {large_op_bytes:,} B"
        if big.empty:
            # no op that large in this trace: use the largest tenth instead, and say so
            big = sel[sel.nbytes >= sel.nbytes.quantile(0.9)]
            how = f"largest 10% (>= {int(big.nbytes.min()):,} B)"
        large[d] = bw_row(big, how, d)
        one = big[big.runs == 1]
        how1 = f"{how}, one contiguous run"
        if one.empty:
            single = sel[sel.runs == 1]
            if single.empty:
                continue
            one = single[single.nbytes >= single.nbytes.quantile(0.9)]
            how1 = f"largest 10% of the one-run ops (>= {int(one.nbytes.min()):,} B)"
        contiguous[d] = bw_row(one, how1, d)
    out["large_ops"] = large
    out["large_contiguous_ops"] = contiguous
    out["bytes"] = {d: int(ops[ops.direction == d].nbytes.sum()) for d in ("d2h", "h2d")}
    out["count"] = {k: int((ops.kind == k).sum()) for k in ("write", "load")}
    if "issue_cpu_s" in ops.columns:
        # how much of an op's measured time its issuing thread was busy issuing it: near 1,
        # the op is bound by the CPU side (per-run copy calls, host gathers), not the link
        share = (ops.issue_cpu_s / ops.duration_s).to_numpy()
        out["issue_share"] = {
            "median": float(np.median(share)),
            "issue_bound_fraction": float(np.mean(share >= 0.8)),
        }
    return out


def run_replay(
    trace: Any,
    settings: ReplaySettings,
    runtime: Runtime,
    profile: Profile,
    *,
    profile_path: str = "",
    out: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` (see the module docstring); write ``out`` (``ops.parquet``/``.csv``,
    ``summary.json``, ``config.json``) if given; return the summary."""
    from replay.bench import cache_flusher, plain_copy_times
    from replay.outputs import write_json, write_table

    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    sizing = settings.pools()
    spec = sizing.spec
    for note in (*settings.notes, *sizing.notes):
        say(note)
    say(
        f"pools: device {spec.device_pages} pages ({spec.device_bytes / GiB:.3g} GiB), host "
        f"{spec.host_pages} pages ({spec.host_bytes / GiB:.3g} GiB, "
        f"{'pinned' if runtime.pinned else 'pageable'}), {spec.layout}, page {spec.page_bytes:,} B"
    )
    reqs = trace_requests(trace, settings.page_size, settings.max_requests)
    notes = [*settings.notes, *sizing.notes]
    too_big = sum(
        1 for r in reqs if r.input_length + r.output_length + spec.page_size > sizing.device_tokens
    )
    if too_big:
        # such a request can never be served: it only shows up as an OOM, with no copies
        notes.append(
            f"{too_big} of {len(reqs)} requests do not fit the {sizing.device_tokens:,}-token "
            "device pool; raise the device budget or shrink the geometry (--layers, "
            "--token-layer-bytes)"
        )
        say(notes[-1])
    pools = KVPools(spec, runtime)
    # the plain large-copy peak of this very run, the yardstick for the large ops, measured
    # between the pools themselves (a registered host pool and a caching-allocator buffer
    # need not copy at the same rate); the warm-up and the replay overwrite what it leaves
    peak_bytes = max(8, min(settings.peak_bytes, spec.device_bytes, spec.host_bytes) // 8 * 8)
    assert pools.host is not None
    bufs = (pools.device, pools.host)
    peak = {
        d: peak_bytes
        / float(np.median(plain_copy_times(runtime, peak_bytes, d, True, 5, 1, buffers=bufs)))
        for d in ("d2h", "h2d")
    }
    say("plain-copy peak: " + ", ".join(f"{d} {v / 1e9:.2f} GB/s" for d, v in peak.items()))
    device = device_pool(spec.device_pages, spec.page_size)
    host = PageAllocator(spec.host_pages, spec.page_size, "host")
    ctrl = TorchController(device, host, pools, runtime, backend=settings.backend)
    assert ctrl.engine is not None
    largest = min(spec.device_pages, spec.host_pages)
    if settings.warmup_pages is None:
        # a write copies part of one request's KV, a load what one batch reuses: the longest
        # request bounds nearly every op (a merged load of several can exceed it, and then
        # pays its staging allocation inside its time)
        p = spec.page_size
        longest = max((-(-(r.input_length + r.output_length) // p) for r in reqs), default=1)
        warm = min(largest, longest)
    else:
        warm = min(settings.warmup_pages, largest)
    t_warm = time.perf_counter()
    ctrl.engine.warmup(warm)
    say(f"warm-up: ops of 1-{warm} pages, {time.perf_counter() - t_warm:.2f} s (untimed)")
    if settings.verify:
        pools.device.zero_()  # the warm-up copied zeros around, but keep the start state plain
    rp = TraceReplayer(
        ctrl,
        write_policy=settings.write_policy,
        eviction=settings.eviction,
        outputs=settings.outputs,
        load_back_threshold=settings.load_back_threshold,
        verify=settings.verify,
        forward=cache_flusher(runtime, settings.flush_bytes),
    )
    t_replay = time.perf_counter()
    say(f"replaying {len(reqs)} requests ({settings.backend} IO)")
    result = rp.run(reqs, settings.batch_tokens, settings.batch_requests)
    replay_s = time.perf_counter() - t_replay
    ops = pd.DataFrame([r.as_dict() for r in ctrl.records])
    if ops.empty:
        ops = pd.DataFrame(columns=[*OP_COLUMNS])
    ops = ops.sort_values("op_id", kind="stable").reset_index(drop=True)
    ops["predicted_s"] = predict(profile, ops) if len(ops) else []
    ops["rel_err"] = (ops.predicted_s - ops.duration_s).abs() / ops.duration_s
    summary = {
        "trace": str(getattr(trace, "path", "") or ""),
        "requests": len(reqs),
        "device": runtime.kind,
        "machine": runtime.describe(),
        "settings": {k: v for k, v in asdict(settings).items() if k != "notes"},
        "notes": notes,
        "pools": pools.describe(),
        "pool_scale_factor": sizing.factor,
        "profile": {
            "path": profile_path,
            "gpu": profile.gpu,
            "link": profile.link_name,
            "measured": profile.measured,
        },
        "cache": result.as_dict(),
        "peak_bytes": peak_bytes,
        "peak_Bps": peak,
        **summarize_ops(ops, peak, settings.large_op_bytes),
        "replay_s": replay_s,
        "wall_s": time.perf_counter() - t_start,
    }
    pools.close()
    if out is not None:
        write_table(ops, out, "ops")
        write_json(summary["settings"] | {"notes": summary["notes"]}, out / "config.json")
        write_json(summary, out / "summary.json")
    return summary


OP_COLUMNS = (
    "op_id",
    "kind",
    "direction",
    "backend",
    "layout",
    "nbytes",
    "pages",
    "runs",
    "layers",
    "calls",
    "nodes",
    "issue_s",
    "duration_s",
    "host_s",
    "issue_cpu_s",
)


def format_summary(s: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    c = s["cache"]
    lines = [
        f"{s['requests']} requests on {s['device']} ({s['machine'].get('gpu_name', '')}): hit "
        f"rate {c['hit_rate']:.2%}; {s.get('count', {}).get('write', 0)} writes, "
        f"{s.get('count', {}).get('load', 0)} loads; replay {s['replay_s']:.2f} s",
        f"profile: {s['profile']['path'] or 'shipped default'} ({s['profile']['gpu']}, "
        f"measured={s['profile']['measured']})",
    ]
    for d, e in s.get("error", {}).items():
        if e.get("n"):
            lines.append(
                f"  prediction |rel err| {d:>3}: median {e['median']:.1%}, p90 {e['p90']:.1%} "
                f"(n={e['n']})"
            )
    for key, what in (("large_ops", "large"), ("large_contiguous_ops", "large contiguous")):
        for d, v in s.get(key, {}).items():
            lines.append(
                f"  {what} {d} ops ({v['selection']}, n={v['n']}): {v['median_Bps'] / 1e9:.2f} "
                f"GB/s = {v['fraction_of_peak']:.0%} of the plain-copy peak "
                f"{v['peak_Bps'] / 1e9:.2f} GB/s"
            )
    if "issue_share" in s:
        i = s["issue_share"]
        lines.append(
            f"  issuing thread busy for a median {i['median']:.0%} of an op's time; "
            f"{i['issue_bound_fraction']:.0%} of ops issue-bound (>= 80%)"
        )
    return "\n".join(lines)


__all__ = [
    "OP_COLUMNS",
    "ReplaySettings",
    "format_summary",
    "predict",
    "run_replay",
    "settings_from_config",
    "summarize_ops",
]
