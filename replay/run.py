"""Replay a trace with every write and load done as a real copy; measured vs predicted.

``hicache-sim replay run TRACE``: :class:`~replay.driver.TraceReplayer` sends the requests
through :class:`~hicache.policy.HiRadixCache` (the same code the simulator runs) on a
:class:`~replay.controller.TorchController`, so every backup and load_back moves real bytes
between a device KV tensor and a (pinned) host tensor; compute is not executed. Each op is timed
and set beside what ``hicache.latency`` predicts for it (``op_time`` of ``op_charges``, with
the profile's constants for the backend, uncoupled: the driver never overlaps the two
directions). :func:`run_replay` also measures the plain large-copy peak of the same machine and
reports the large ops' effective bandwidth against it. The figures of the op table (each op's
prediction, the error summary, the terminal lines) are :mod:`replay.run_summary`'s, re-exported
here.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hicache.latency import Profile
from hicache.lifecycle import PagedRequest
from hicache.policy import PageAllocator
from hicache.policy.allocator import device_pool
from replay.bench_copies import cache_flusher, plain_copy_times
from replay.controller import TorchController
from replay.driver import ReplayResult, TraceReplayer, trace_requests
from replay.outputs import write_json, write_table
from replay.pools import KVPools, PoolSizing, PoolSpec, model_pools
from replay.run_summary import OP_COLUMNS, format_summary, predict, summarize_ops
from replay.runtime import Runtime

GiB = 1 << 30
MiB = 1 << 20


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
    sglang_version: str = "0.5.14"
    """Whose cache decides (``sglang.version``)."""
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
        sglang_version=cfg.sglang.version,
        backend=backend,
        layout=layout,
        batch_tokens=cfg.scheduler.max_prefill_tokens,
        max_requests=cfg.workload.max_requests,
        notes=tuple(notes),
    )
    vals = {k: v for k, v in overrides.items() if v is not None and k not in ("backend", "layout")}
    return replace(base, **vals)


def run_replay(
    trace: Any,
    settings: ReplaySettings,
    runtime: Runtime,
    profile: Profile,
    *,
    profile_path: str = "",
    out: Path | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool | None = False,
) -> dict[str, Any]:
    """Replay ``trace`` (see the module docstring); write ``out`` (``ops.parquet``/``.csv``,
    ``summary.json``, ``config.json``) if given; return the summary. ``progress``: a bar over
    the requests on stderr (None: only on a terminal)."""
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
    too_big = _unservable_note(reqs, sizing)
    if too_big:
        notes.append(too_big)
        say(too_big)
    pools = KVPools(spec, runtime)
    peak_bytes, peak = _copy_peak(runtime, pools, settings.peak_bytes)
    say("plain-copy peak: " + ", ".join(f"{d} {v / 1e9:.2f} GB/s" for d, v in peak.items()))
    ctrl = TorchController(
        device_pool(spec.device_pages, spec.page_size),
        PageAllocator(spec.host_pages, spec.page_size, "host"),
        pools,
        runtime,
        backend=settings.backend,
    )
    _warm_up(ctrl, _warmup_pages(settings, spec, reqs), say)
    if settings.verify:
        pools.device.zero_()  # the warm-up copied zeros around, but keep the start state plain
    result, replay_s = _replay(ctrl, runtime, settings, reqs, say, progress)
    ops = _op_table(ctrl, profile)
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


class BudgetError(ValueError):
    """The memory a default budget may take cannot hold most of the trace's requests."""


#: :func:`fit_budgets` sizes the device budget so that this share of the requests fits...
FIT_SHARE = 0.95
#: ... with room for this many of such a request (so a request can hit another's prefix).
FIT_ROOM = 2
#: More than this share of unservable requests is refused (their hits would all be zero, so
#: the hit rate and the op mix would describe a fraction of the trace).
MAX_UNSERVABLE = 0.25


def _pages_needed(reqs: Sequence[PagedRequest], page: int) -> list[int]:
    """Device pages each request needs to be served (prompt + outputs + one page), sorted."""
    return sorted(-(-(r.input_length + r.output_length + page) // page) for r in reqs)


def fit_budgets(
    trace: Any,
    settings: ReplaySettings,
    cap_device_bytes: int,
    cap_host_bytes: int,
    *,
    host_budget_fixed: bool = False,
) -> tuple[int, int, str | None]:
    """Default memory budgets sized from ``trace``: ``(device, host, note)``.

    The device budget grows from ``settings.device_budget_bytes`` until :data:`FIT_SHARE` of
    the requests fit :data:`FIT_ROOM` times (prompt + outputs + a page, in the replay's
    geometry), at most ``cap_device_bytes``; the host budget keeps the config's host/device
    ratio (at most ``cap_host_bytes``; unchanged with ``host_budget_fixed``). ``note`` says what
    was chosen, or warns of requests that still do not fit. :class:`BudgetError` when more
    than :data:`MAX_UNSERVABLE` of them would not fit even so, with what to do instead.
    """
    reqs = trace_requests(trace, settings.page_size, settings.max_requests)
    dev0, host0 = settings.device_budget_bytes, settings.host_budget_bytes
    if not reqs:
        return dev0, host0, None
    big = replace(settings, device_budget_bytes=1 << 62, host_budget_bytes=1 << 62)
    full = big.pools().spec  # the requested pools, unscaled: no memory is allocated
    page_bytes, page = full.page_bytes, full.page_size
    need = _pages_needed(reqs, page)
    want_pages = need[max(0, math.ceil(FIT_SHARE * len(need)) - 1)] * FIT_ROOM
    dev = min(max(dev0, want_pages * page_bytes), max(dev0, cap_device_bytes))
    host = host0
    if not host_budget_fixed:
        ratio = full.host_pages / full.device_pages
        host = min(max(host0, int(dev * ratio) + 2 * page_bytes), max(host0, cap_host_bytes))
    sized = replace(settings, device_budget_bytes=dev, host_budget_bytes=host).pools().spec
    unfit = len(need) - bisect_right(need, sized.device_pages)
    gib = f"{dev / GiB:.3g} GiB device, {host / GiB:.3g} GiB host"
    if unfit > MAX_UNSERVABLE * len(need) and sized.device_pages < full.device_pages:
        layers = full.num_layers
        room = cap_device_bytes // (want_pages * page * full.token_layer_bytes)
        advice = (
            f"--layers {min(room, layers - 1)} (each op keeps its shape, with fewer layers)"
            if room >= 1 and layers > 1
            else "--layers 1 --token-layer-bytes N (smaller ops)"
        )
        raise BudgetError(
            f"{unfit:,} of {len(need):,} requests would not fit the device pool that the "
            f"default budget allows on this machine ({sized.device_pages * page:,} tokens in "
            f"{gib}), so they would only count as out-of-memory; use {advice}, or give more "
            f"memory with --device-mem-gb {want_pages * page_bytes / GiB:.2g} (and --host-mem-gb)"
        )
    note = None
    if (dev, host) != (dev0, host0):
        share = 1 - unfit / len(need)
        note = f"budgets sized from the trace: {gib} ({share:.0%} of its requests fit)"
    return dev, host, note


def _unservable_note(reqs: Sequence[PagedRequest], sizing: PoolSizing) -> str | None:
    """A note when some requests cannot fit the device pool, else None. Such a request can
    never be served: it only shows up as an OOM, with no copies."""
    page = sizing.spec.page_size
    too_big = sum(1 for r in reqs if r.input_length + r.output_length + page > sizing.device_tokens)
    if not too_big:
        return None
    return (
        f"{too_big} of {len(reqs)} requests do not fit the {sizing.device_tokens:,}-token "
        "device pool; raise the device budget or shrink the geometry (--layers, "
        "--token-layer-bytes)"
    )


def _copy_peak(runtime: Runtime, pools: KVPools, peak_bytes: int) -> tuple[int, dict[str, float]]:
    """The plain large-copy peak of this very run per direction (B/s), the yardstick for the
    large ops, and the copy size it used (``peak_bytes``, at most either pool). Measured
    between the pools themselves (a registered host pool and a caching-allocator buffer need
    not copy at the same rate); the warm-up and the replay overwrite what it leaves."""
    spec = pools.spec
    nbytes = max(8, min(peak_bytes, spec.device_bytes, spec.host_bytes) // 8 * 8)
    assert pools.host is not None
    bufs = (pools.device, pools.host)
    peak = {
        d: nbytes / float(np.median(plain_copy_times(runtime, nbytes, d, True, 5, 1, buffers=bufs)))
        for d in ("d2h", "h2d")
    }
    return nbytes, peak


def _warmup_pages(settings: ReplaySettings, spec: PoolSpec, reqs: Sequence[PagedRequest]) -> int:
    """The largest warm-up op in pages (``settings.warmup_pages``; at most the smaller pool)."""
    largest = min(spec.device_pages, spec.host_pages)
    if settings.warmup_pages is not None:
        return min(settings.warmup_pages, largest)
    # a write copies part of one request's KV, a load what one batch reuses: the longest
    # request bounds nearly every op (a merged load of several can exceed it, and then
    # pays its staging allocation inside its time)
    p = spec.page_size
    longest = max((-(-(r.input_length + r.output_length) // p) for r in reqs), default=1)
    return min(largest, longest)


def _warm_up(ctrl: TorchController, pages: int, say: Callable[[str], None]) -> None:
    """Untimed ops of 1, 2, 4, ... up to ``pages`` pages through the controller's engine."""
    assert ctrl.engine is not None
    t_warm = time.perf_counter()
    ctrl.engine.warmup(pages)
    say(f"warm-up: ops of 1-{pages} pages, {time.perf_counter() - t_warm:.2f} s (untimed)")


def _replay(
    ctrl: TorchController,
    runtime: Runtime,
    settings: ReplaySettings,
    reqs: Sequence[PagedRequest],
    say: Callable[[str], None],
    progress: bool | None = False,
) -> tuple[ReplayResult, float]:
    """``reqs`` through the policy core on ``ctrl`` (a cache flush where a forward pass would
    run); the cache figures and the replay's seconds."""
    rp = TraceReplayer(
        ctrl,
        write_policy=settings.write_policy,
        eviction=settings.eviction,
        outputs=settings.outputs,
        load_back_threshold=settings.load_back_threshold,
        verify=settings.verify,
        forward=cache_flusher(runtime, settings.flush_bytes),
        sglang_version=settings.sglang_version,
    )
    t_replay = time.perf_counter()
    say(f"replaying {len(reqs)} requests ({settings.backend} IO)")
    result = rp.run(reqs, settings.batch_tokens, settings.batch_requests, progress=progress)
    return result, time.perf_counter() - t_replay


def _op_table(ctrl: TorchController, profile: Profile) -> pd.DataFrame:
    """The controller's op records in issue order, with ``predicted_s`` and ``rel_err``."""
    ops = pd.DataFrame([r.as_dict() for r in ctrl.records])
    if ops.empty:
        ops = pd.DataFrame(columns=[*OP_COLUMNS])
    ops = ops.sort_values("op_id", kind="stable").reset_index(drop=True)
    ops["predicted_s"] = predict(profile, ops) if len(ops) else []
    ops["rel_err"] = (ops.predicted_s - ops.duration_s).abs() / ops.duration_s
    return ops


__all__ = [
    "FIT_SHARE",
    "OP_COLUMNS",
    "BudgetError",
    "ReplaySettings",
    "fit_budgets",
    "format_summary",
    "predict",
    "run_replay",
    "settings_from_config",
    "summarize_ops",
]
