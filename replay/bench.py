"""Copy microbenchmarks: the measurements the calibration fits (``hicache-sim replay bench``).

Four sweeps, each row one timed repeat (after ``warmup`` untimed ones):

* ``plain``: one ``copy_`` of 4 KiB-256 MiB between a device tensor and a host tensor, each
  direction alone, pinned and pageable host memory. The large pinned copies are the link's
  peak; the small ones its fixed cost.
* ``bidir``: both directions at once (4 back-to-back copies per direction on the two streams;
  the first two of each are timed, while the other direction is surely still busy), for the
  coupling factor ``eta``.
* ``op``: writes and loads through :class:`~replay.transfer.CopyEngine` on pools of the model's
  page geometry, for each backend (and host layout), contiguous and fragmented into runs of 1, 4,
  16, 64 pages, with 1 layer (small ops, down to one page) and optionally the model's layer
  count (the shape of real HiCache ops).
* ``gemm`` / ``hbm`` (CUDA only): one layer's linear GEMMs in the model's shapes (QKV, O,
  gate+up, down; :func:`model_gemm_shapes`) in bf16 and a large device-to-device copy, for the
  compute constants (``gemm_scale``, ``decode_hbm_efficiency``).

Row columns: ``kind, backend, direction, host_memory, layout, bytes, pages, run_pages, runs,
layers, n_alpha, n_gamma, calls, flops, repeat, duration_s``. ``n_alpha`` / ``n_gamma`` are how
many times the latency model charges ``alpha`` / ``gamma`` for the row (the one cost rule,
``hicache.latency.op_charges``: a write pays alpha once and gamma per run and layer, a load
alpha per layer), so the fit is one least-squares problem on ``[n_alpha, n_gamma, bytes]``.
On ``gemm`` rows, ``layout`` names the GEMM (``qkv``, ``o``, ``gate_up``, ``down``).

On the CPU (no CUDA) everything runs on plain tensors: there is no pinned memory (one
``pageable`` sweep), ``bidir`` runs the two directions in two threads, and there is no GEMM row.

This module holds the config, the ``op`` sweep and :func:`run_bench`; the ``plain`` and
``bidir`` sweeps are :mod:`replay.bench_copies`, the ``gemm`` / ``hbm`` rows
:mod:`replay.bench_compute`, the row table :mod:`replay.bench_rows` (their public names are
re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from replay.bench_compute import compute_rows, model_gemm_shapes
from replay.bench_copies import (
    bidir_copy_times,
    bidir_rows,
    cache_flusher,
    plain_copy_times,
    plain_rows,
)
from replay.bench_rows import COLUMNS, ROW_DEFAULTS, BenchRows, bench_table
from replay.fit import charge_columns
from replay.outputs import write_json, write_table
from replay.pools import KVPools, PoolSpec
from replay.runtime import Runtime, code_commit
from replay.transfer import CopyEngine

KiB = 1024
MiB = 1024 * KiB

# the names the tests know the row collector and the column defaults by
_Rows = BenchRows
_DEFAULTS = ROW_DEFAULTS


@dataclass(frozen=True)
class BenchConfig:
    """What to sweep. Defaults fit an H100/H200 run in about a minute or two."""

    # 4 KiB .. 256 MiB by x4: spans the fixed-cost-bound and the bandwidth-bound regimes
    plain_sizes: tuple[int, ...] = tuple(4 * KiB * 4**k for k in range(9))
    # sizes where a copy lasts long enough for the two directions to overlap well
    bidir_sizes: tuple[int, ...] = (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
    # pageable vs pinned is a question users ask; pageable rows are not used by the fit
    pageable: bool = True
    backends: tuple[str, ...] = ("direct", "kernel")
    # page_first is SGLang 0.5.14's default (kernel IO); direct IO always uses layer_first
    kernel_layouts: tuple[str, ...] = ("page_first", "layer_first")
    # 1 layer gives small ops; the model's layer count gives the shape of real HiCache ops
    op_layers: tuple[int, ...] = (1, 32)
    op_pages: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)
    # 0 = contiguous; the issue's fragmentation levels
    run_pages: tuple[int, ...] = (0, 1, 4, 16, 64)
    # Llama-3-8B's geometry at SGLang's usual HiCache page: 64 tokens x 4 KiB per layer
    page_size: int = 64
    token_layer_bytes: int = 4096
    parts: int = 2
    max_op_bytes: int = 256 * MiB
    # a fragmented direct op issuing more copies than this takes too long to be worth timing
    max_calls: int = 4096
    # op pools span at least this many bytes per side, and each repeat of an op uses pages
    # the previous ones did not touch: a replay's ops hit cold memory spread over large pools,
    # and an op timed on the same few hot pages (in the CPU's last-level cache, or the GPU's
    # L2) would be predicted too fast. ~4x a server CPU's L3 and 8x an H100/H200's L2.
    op_pool_bytes: int = 512 * MiB
    # before every timed op, write this much scratch memory on the host (and on the device):
    # it evicts the CPU's last-level cache and the GPU's L2, where the previous repeat left the
    # op's staging buffers and index tensors; in a replay, the work between two ops (policy,
    # forward pass) has evicted them too. 0 turns it off.
    flush_bytes: int = 64 * MiB
    repeats: int = 5
    warmup: int = 1
    gemm: bool = True
    # one transformer layer's linear GEMMs (CUDA only), each ``(name, k, n)`` timed as
    # ``(gemm_tokens x k) @ (k x n)`` in bf16; default Llama-3-8B's (see model_gemm_shapes)
    gemm_tokens: int = 4096
    gemm_shapes: tuple[tuple[str, int, int], ...] = (
        ("qkv", 4096, 6144),
        ("o", 4096, 4096),
        ("gate_up", 4096, 28672),
        ("down", 14336, 4096),
    )
    hbm_bytes: int = 1024 * MiB

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        for s in (*self.plain_sizes, *self.bidir_sizes):
            if s < 8 or s % 8:
                raise ValueError(f"copy sizes must be positive multiples of 8 bytes, got {s}")

    @classmethod
    def for_model(cls, model: str, tp: int = 1, page_size: int = 64, **kw: Any) -> BenchConfig:
        """Defaults with the op geometry (bytes per token per layer, layers, parts) of a
        ``hicache.hardware`` model preset."""
        from hicache.hardware import get_model, kv_bytes_per_token

        m = get_model(model)
        tlb = kv_bytes_per_token(m, tp) // m.num_layers
        base = cls(
            page_size=page_size,
            token_layer_bytes=tlb,
            parts=1 if m.mla else 2,
            op_layers=(1, m.num_layers),
            gemm_shapes=model_gemm_shapes(model, tp),
        )
        return replace(base, **kw)

    @classmethod
    def quick(cls, **kw: Any) -> BenchConfig:
        """A small sweep (seconds on a CPU): for tests and CPU smoke runs."""
        base = cls(
            plain_sizes=(4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB),
            bidir_sizes=(1 * MiB, 4 * MiB),
            op_layers=(1, 4),
            op_pages=(1, 4, 16, 64),
            run_pages=(0, 1, 4),
            page_size=16,
            token_layer_bytes=1024,
            max_op_bytes=4 * MiB,
            repeats=3,
            gemm=False,
            op_pool_bytes=128 * MiB,
        )
        return replace(base, **kw)


def op_pool_pages(cfg: BenchConfig, layers: int, span: int) -> int:
    """Pages per side of the op pools at ``layers`` layers: at least ``span`` (the largest
    op's page-id span) and at least ``cfg.op_pool_bytes`` (see :class:`BenchConfig`)."""
    page = cfg.page_size * cfg.token_layer_bytes * layers
    return max(span, -(-cfg.op_pool_bytes // page))


def rotated(pages: list[int], span: int, pool_pages: int, i: int) -> list[int]:
    """``pages`` (ids below ``span``) moved to the ``i``-th of the ``pool_pages // span`` disjoint
    windows of the pool, round robin: consecutive repeats touch different memory."""
    windows = max(1, pool_pages // span)
    base = (i % windows) * span
    return [p + base for p in pages]


def fragmented_pages(n: int, run: int) -> tuple[list[int], list[int]]:
    """Device and host page lists of ``n`` pages in runs of ``run`` pages (0 or >= n:
    contiguous). Consecutive runs are ``run`` pages apart on both sides, so every run boundary
    breaks contiguity: ``count_runs == ceil(n / run)``. Page ids stay below ``2 n + run``."""
    if run <= 0 or run >= n:
        return list(range(n)), list(range(n))
    dev: list[int] = []
    host: list[int] = []
    k = 0
    while len(dev) < n:
        m = min(run, n - len(dev))
        base = 2 * k * run
        dev += range(base, base + m)
        host += range(base + run, base + run + m)
        k += 1
    return dev, host


def _op_plan(cfg: BenchConfig, layers: int) -> list[tuple[int, int]]:
    """(pages, run_pages) pairs to time at ``layers`` layers."""
    layer_page = cfg.page_size * cfg.token_layer_bytes
    plan = []
    for n in cfg.op_pages:
        if n * layer_page * layers > cfg.max_op_bytes:
            continue
        for r in cfg.run_pages:
            if r and r >= n:
                continue  # same as contiguous
            runs = 1 if not r else -(-n // r)
            if cfg.parts * layers * runs > cfg.max_calls:
                continue
            plan.append((n, r))
    return plan


def op_rows(cfg: BenchConfig, rt: Runtime, rows: BenchRows, log: Callable[[str], None]) -> None:
    """Time writes and loads through the copy engine for every backend, layout and plan."""
    combos = []
    for backend in cfg.backends:
        layouts = ("layer_first",) if backend == "direct" else cfg.kernel_layouts
        combos += [(backend, layout) for layout in layouts]
    flush = cache_flusher(rt, cfg.flush_bytes)  # this module's name: tests replace it
    for layers in cfg.op_layers:
        plan = _op_plan(cfg, layers)
        if not plan:
            continue
        pages = op_pool_pages(cfg, layers, max(2 * n + r for n, r in plan))
        for layout in dict.fromkeys(lay for _, lay in combos):
            spec = PoolSpec(
                layers, cfg.token_layer_bytes, cfg.page_size, pages, pages, layout, cfg.parts
            )
            pools = KVPools(spec, rt)
            pools.device.zero_()
            assert pools.host is not None
            pools.host.zero_()
            mem = "pinned" if pools.host_pinned else "pageable"
            for backend in [b for b, lay in combos if lay == layout]:
                log(f"ops: {backend}/{layout}, {layers} layer(s), {len(plan)} shapes")
                eng = CopyEngine(pools, rt, backend)
                _time_ops(cfg, eng, plan, mem, rows, flush)
            pools.close()
            del pools
            rt.synchronize()


def _time_ops(
    cfg: BenchConfig,
    eng: CopyEngine,
    plan: list[tuple[int, int]],
    mem: str,
    rows: BenchRows,
    flush: Callable[[], None],
) -> None:
    """Rows of every ``(pages, run_pages)`` shape of ``plan`` in both directions through
    ``eng`` (its pools' host memory is ``mem``): each repeat after a cache flush, on pages
    the previous one did not touch (:func:`rotated`)."""
    spec = eng.pools.spec
    pages = spec.device_pages
    for n, r in plan:
        dev, host = fragmented_pages(n, r)
        span = 2 * n + r
        for direction in ("d2h", "h2d"):
            issue = eng.d2h if direction == "d2h" else eng.h2d
            times = []
            calls = runs = 0
            for i in range(cfg.warmup + cfg.repeats):
                flush()
                t = issue(rotated(dev, span, pages, i), rotated(host, span, pages, i))
                eng.wait(t)
                assert t.duration_s is not None
                times.append(t.duration_s)
                calls, runs = t.calls, t.runs
            rows.add(
                times[cfg.warmup :],
                kind="op",
                backend=eng.backend,
                direction=direction,
                host_memory=mem,
                layout=spec.layout,
                bytes=n * spec.page_bytes,
                pages=n,
                run_pages=r,
                runs=runs,
                layers=spec.num_layers,
                **charge_columns(direction, n * spec.page_bytes, runs, spec.num_layers),
                calls=calls,
            )


def run_bench(
    cfg: BenchConfig, rt: Runtime, log: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """Every sweep of ``cfg`` on ``rt``; one row per timed repeat (columns :data:`COLUMNS`)."""
    say = log or (lambda _msg: None)
    rows = BenchRows()
    plain_rows(cfg, rt, rows, say)
    bidir_rows(cfg, rt, rows, say)
    op_rows(cfg, rt, rows, say)
    if cfg.gemm and rt.kind == "cuda":
        say("compute: GEMM and HBM copy")
        compute_rows(cfg, rt, rows)
    return pd.DataFrame(rows.rows, columns=list(COLUMNS))


def write_bench(
    df: pd.DataFrame, cfg: BenchConfig, rt: Runtime, out: Path, wall_s: float, **extra: Any
) -> dict[str, Any]:
    """``out/bench.parquet`` + ``bench.csv`` and ``out/meta.json`` (machine, config, wall time);
    returns the meta dict."""
    write_table(df, out, "bench")
    meta = {
        "format": "hicache-replay-bench",
        "version": 1,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": rt.describe(),
        "host_pinned": rt.pinned,
        "config": asdict(cfg),
        "rows": len(df),
        "code_commit": code_commit(),
        "wall_s": round(wall_s, 3),
        **extra,
    }
    write_json(meta, out / "meta.json")
    return meta


__all__ = [
    "COLUMNS",
    "BenchConfig",
    "bench_table",
    "bidir_copy_times",
    "cache_flusher",
    "compute_rows",
    "fragmented_pages",
    "model_gemm_shapes",
    "op_pool_pages",
    "op_rows",
    "plain_copy_times",
    "rotated",
    "run_bench",
    "write_bench",
]
