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
  compute constants (``mfu``, ``decode_hbm_efficiency``).

Row columns: ``kind, backend, direction, host_memory, layout, bytes, pages, run_pages, runs,
layers, n_alpha, n_gamma, calls, flops, repeat, duration_s``. ``n_alpha`` / ``n_gamma`` are how
many times the latency model charges ``alpha`` / ``gamma`` for the row (the one cost rule,
``hicache.latency.op_charges``: a write pays alpha once and gamma per run and layer, a load
alpha per layer), so the fit is one least-squares problem on ``[n_alpha, n_gamma, bytes]``.
On ``gemm`` rows, ``layout`` names the GEMM (``qkv``, ``o``, ``gate_up``, ``down``).

On the CPU (no CUDA) everything runs on plain tensors: there is no pinned memory (one
``pageable`` sweep), ``bidir`` runs the two directions in two threads, and there is no GEMM row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from replay.calibrate import charge_columns, gemm_rate
from replay.outputs import write_json, write_table
from replay.pools import KVPools, PoolSpec
from replay.runtime import Runtime, code_commit
from replay.transfer import CopyEngine

KiB = 1024
MiB = 1024 * KiB

COLUMNS = (
    "kind",
    "backend",
    "direction",
    "host_memory",
    "layout",
    "bytes",
    "pages",
    "run_pages",
    "runs",
    "layers",
    "n_alpha",
    "n_gamma",
    "calls",
    "flops",
    "repeat",
    "duration_s",
)


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


def model_gemm_shapes(model: str, tp: int = 1) -> tuple[tuple[str, int, int], ...]:
    """One layer's linear GEMMs on one tensor-parallel rank, ``(name, k, n)``: the QKV
    projection ``hidden -> (heads + 2 kv_heads) head_dim``, the output projection, and a SwiGLU
    MLP (``gate_up`` ``hidden -> 2 I``, ``down`` ``I -> hidden``) whose width ``I`` makes the
    layer's weights add up to the preset's ``body_active_params / layers`` (14,336 for
    Llama-3-8B, as its config says). Column-parallel GEMMs split ``n`` by ``tp``, row-parallel
    ones ``k``. The FLOPs these shapes do per token are what ``hicache.latency`` charges as the
    linear part of prefill, so their measured rate is its ``mfu``.

    MoE and MLA presets get the same dense shapes with the active weights (an approximation:
    their experts run as several smaller GEMMs, and MLA projects through a latent)."""
    from hicache.hardware import get_model

    m = get_model(model)
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    h = m.hidden_size
    qkv = (
        (m.num_attention_heads + m.num_kv_heads) * m.head_dim + m.num_kv_heads * m.v_head_dim
    ) // tp
    o = m.num_attention_heads * m.v_head_dim // tp
    per_layer = m.body_active_params / m.num_layers / tp
    mlp = per_layer - h * qkv - o * h
    # 3 matrices of h x I; round I to 128 as model widths are
    width = max(128, round(mlp / (3 * h) / 128) * 128)
    return (("qkv", h, qkv), ("o", o, h), ("gate_up", h, 2 * width), ("down", width, h))


@dataclass
class _Rows:
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, durations: Iterable[float], **cols: Any) -> None:
        base = {c: cols.get(c, _DEFAULTS[c]) for c in COLUMNS if c not in ("repeat", "duration_s")}
        for i, d in enumerate(durations):
            self.rows.append({**base, "repeat": i, "duration_s": float(d)})


_DEFAULTS: dict[str, Any] = {
    "kind": "",
    "backend": "plain",
    "direction": "",
    "host_memory": "",
    "layout": "",
    "bytes": 0,
    "pages": 0,
    "run_pages": 0,
    "runs": 1,
    "layers": 1,
    "n_alpha": 1,
    "n_gamma": 0,
    "calls": 1,
    "flops": 0.0,
}


def _timed(rt: Runtime, stream: str, fn: Callable[[], None]) -> float:
    rt.begin(stream)
    a = rt.mark(stream)
    rt.run(stream, fn)
    b = rt.mark(stream)
    rt.wait(b)
    return rt.seconds_between(a, b)


def plain_copy_times(
    rt: Runtime,
    nbytes: int,
    direction: str,
    pinned: bool,
    repeats: int,
    warmup: int = 1,
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[float]:
    """Seconds of ``repeats`` single copies of ``nbytes`` in ``direction`` (``d2h``/``h2d``)
    between a device tensor and a host tensor (pinned if asked and possible). ``buffers``:
    an existing ``(device, host)`` pair of contiguous tensors to copy between instead (the
    first ``nbytes`` of each; their contents are overwritten), so a peak is measured on the
    very memory the ops use (a registered host pool, say, rather than a fresh allocation)."""
    if buffers is None:
        n = nbytes // 8
        dev = rt.device_empty((n,), torch.int64)
        host = rt.host_empty((n,), torch.int64, pinned=pinned)
        dev.zero_()
        host.zero_()
    else:
        dev, host = (_bytes_of(t, nbytes) for t in buffers)
    dst, src = (host, dev) if direction == "d2h" else (dev, host)

    def copy() -> None:
        dst.copy_(src, non_blocking=True)

    out = [_timed(rt, direction, copy) for _ in range(warmup + repeats)]
    return out[warmup:]


def _bytes_of(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The first ``nbytes`` of contiguous ``t`` as a flat uint8 view."""
    if not t.is_contiguous():
        raise ValueError("copy buffers must be contiguous")
    flat = t.view(-1).view(torch.uint8)
    if flat.numel() < nbytes:
        raise ValueError(f"a {flat.numel():,}-byte buffer cannot hold a {nbytes:,}-byte copy")
    return flat[:nbytes]


def bidir_copy_times(
    rt: Runtime, nbytes: int, repeats: int, warmup: int = 1, depth: int = 4
) -> list[tuple[float, float]]:
    """Per-copy seconds ``(d2h, h2d)`` while both directions copy ``nbytes`` at once.

    Each direction issues ``depth`` back-to-back copies; the first ``depth // 2`` of each are
    timed, so (as long as the two rates are within 2x) the other direction is busy the whole
    time. CUDA: the two streams; CPU: two threads (torch copies release the GIL).
    """
    n = nbytes // 8
    half = max(1, depth // 2)
    d_src = rt.device_empty((n,), torch.int64).zero_()
    d_dst = rt.device_empty((n,), torch.int64)
    h_src = rt.host_empty((n,), torch.int64).zero_()
    h_dst = rt.host_empty((n,), torch.int64)
    out: list[tuple[float, float]] = []

    def write() -> None:
        h_dst.copy_(d_src, non_blocking=True)

    def load() -> None:
        d_dst.copy_(h_src, non_blocking=True)

    for _ in range(warmup + repeats):
        if rt.kind == "cuda":
            rt.begin("d2h")
            rt.begin("h2d")
            a = {s: rt.mark(s) for s in ("d2h", "h2d")}
            b: dict[str, Any] = {}
            for i in range(depth):
                rt.run("d2h", write)
                rt.run("h2d", load)
                if i == half - 1:
                    b = {s: rt.mark(s) for s in ("d2h", "h2d")}
            rt.synchronize()
            w, ld = (rt.seconds_between(a[s], b[s]) / half for s in ("d2h", "h2d"))
        else:
            w, ld = _cpu_bidir(h_dst, d_src, d_dst, h_src, depth, half)
        out.append((w, ld))
    return out[warmup:]


def _cpu_bidir(
    h_dst: torch.Tensor,
    d_src: torch.Tensor,
    d_dst: torch.Tensor,
    h_src: torch.Tensor,
    depth: int,
    half: int,
) -> tuple[float, float]:
    gate = threading.Barrier(2)
    res: dict[str, float] = {}

    def worker(name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        gate.wait()
        t0 = time.perf_counter()
        for i in range(depth):
            dst.copy_(src)
            if i == half - 1:
                res[name] = (time.perf_counter() - t0) / half

    threads = [
        threading.Thread(target=worker, args=("d2h", h_dst, d_src)),
        threading.Thread(target=worker, args=("h2d", d_dst, h_src)),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return res["d2h"], res["h2d"]


def cache_flusher(rt: Runtime, nbytes: int) -> Callable[[], None]:
    """A function that overwrites ``nbytes`` of host scratch memory (and, on CUDA, of device
    scratch memory) and waits for the device, evicting what the caches hold (see
    ``BenchConfig.flush_bytes``); a no-op for ``nbytes`` 0."""
    if nbytes <= 0:
        return lambda: None
    host = torch.empty(nbytes // 8, dtype=torch.int64)
    dev = rt.device_empty((nbytes // 8,), torch.int64) if rt.kind == "cuda" else None
    k = [0]

    def flush() -> None:
        k[0] += 1
        host.fill_(k[0])
        if dev is not None:
            dev.fill_(k[0])
        # wait for the device fill: an op then starts on idle streams, its start mark stamped
        # when it is issued (as in a replay, which synchronizes between ops), not when a fill
        # still queued ahead of it ends, which would hide its CPU-side issue work
        rt.synchronize()

    return flush


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


def op_rows(cfg: BenchConfig, rt: Runtime, rows: _Rows, log: Callable[[str], None]) -> None:
    """Time writes and loads through the copy engine for every backend, layout and plan."""
    combos = []
    for backend in cfg.backends:
        layouts = ("layer_first",) if backend == "direct" else cfg.kernel_layouts
        combos += [(backend, layout) for layout in layouts]
    flush = cache_flusher(rt, cfg.flush_bytes)
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
                            backend=backend,
                            direction=direction,
                            host_memory=mem,
                            layout=layout,
                            bytes=n * spec.page_bytes,
                            pages=n,
                            run_pages=r,
                            runs=runs,
                            layers=layers,
                            **charge_columns(direction, n * spec.page_bytes, runs, layers),
                            calls=calls,
                        )
            pools.close()
            del pools
            rt.synchronize()


def compute_rows(cfg: BenchConfig, rt: Runtime, rows: _Rows) -> None:
    """A layer's linear GEMMs in bf16 (``mfu``; a row per GEMM and repeat, its name in the
    ``layout`` column) and a large device-to-device copy (HBM bandwidth). :func:`run_bench`
    runs these on CUDA only; on CPU tensors they work but say nothing about a GPU."""
    m = cfg.gemm_tokens
    for name, k, n in cfg.gemm_shapes:
        a = torch.randn(m, k, dtype=torch.bfloat16, device=rt.device)
        b = torch.randn(k, n, dtype=torch.bfloat16, device=rt.device)
        c = torch.empty(m, n, dtype=torch.bfloat16, device=rt.device)

        def gemm(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> None:
            torch.mm(a, b, out=c)

        # randn ran on the default stream: order the timed stream after it
        times = [_timed(rt, "h2d", gemm) for _ in range(cfg.warmup + cfg.repeats)]
        rows.add(
            times[cfg.warmup :],
            kind="gemm",
            backend="gemm",
            layout=name,
            flops=2.0 * m * n * k,
            n_alpha=0,
            calls=0,
        )
        del a, b, c
    x = rt.device_empty((cfg.hbm_bytes // 8,), torch.int64).zero_()
    y = torch.empty_like(x)

    def device_copy() -> None:
        y.copy_(x)

    times = [_timed(rt, "h2d", device_copy) for _ in range(cfg.warmup + cfg.repeats)]
    # a device copy reads and writes every byte
    rows.add(times[cfg.warmup :], kind="hbm", backend="hbm", bytes=2 * cfg.hbm_bytes, n_alpha=0)


def run_bench(
    cfg: BenchConfig, rt: Runtime, log: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """Every sweep of ``cfg`` on ``rt``; one row per timed repeat (columns :data:`COLUMNS`)."""
    say = log or (lambda _msg: None)
    rows = _Rows()
    mems = [True, False] if (rt.pinned and cfg.pageable) else [rt.pinned]
    say(f"plain copies: {len(cfg.plain_sizes)} sizes x 2 directions x {len(mems)} memory kinds")
    for pinned in mems:
        mem = "pinned" if pinned else "pageable"
        for size in cfg.plain_sizes:
            for direction in ("d2h", "h2d"):
                times = plain_copy_times(rt, size, direction, pinned, cfg.repeats, cfg.warmup)
                rows.add(times, kind="plain", direction=direction, host_memory=mem, bytes=size)
    if cfg.bidir_sizes:
        say(f"both directions at once: {len(cfg.bidir_sizes)} sizes")
        mem = "pinned" if rt.pinned else "pageable"
        for size in cfg.bidir_sizes:
            pairs = bidir_copy_times(rt, size, cfg.repeats, cfg.warmup)
            for i, direction in enumerate(("d2h", "h2d")):
                rows.add(
                    [p[i] for p in pairs],
                    kind="bidir",
                    direction=direction,
                    host_memory=mem,
                    bytes=size,
                )
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


def bench_table(df: pd.DataFrame) -> str:
    """A readable summary: plain-copy bandwidth by size, ``eta`` by size, op bandwidth by
    fragmentation (GB/s = 1e9 B/s, medians over repeats)."""
    lines: list[str] = []
    med = df.groupby(
        ["kind", "backend", "direction", "host_memory", "layout", "bytes", "run_pages", "layers"],
        as_index=False,
    )["duration_s"].median()
    med["gbps"] = med["bytes"] / med["duration_s"] / 1e9
    plain = med[med.kind == "plain"]
    if len(plain):
        cols = sorted({(m, d) for m, d in zip(plain.host_memory, plain.direction, strict=True)})
        lines.append("plain copies, GB/s (median):")
        lines.append(f"{'size':>10} " + " ".join(f"{m[:6] + ' ' + d:>14}" for m, d in cols))
        for size in sorted(plain["bytes"].unique()):
            cells = []
            for m, d in cols:
                sel = plain[
                    (plain["bytes"] == size) & (plain.host_memory == m) & (plain.direction == d)
                ]
                cells.append(f"{sel.gbps.iloc[0]:>14.2f}" if len(sel) else f"{'-':>14}")
            lines.append(f"{_size(int(size)):>10} " + " ".join(cells))
    bid = med[med.kind == "bidir"]
    if len(bid) and len(plain):
        lines.append("both directions at once, per-direction GB/s (alone -> together):")
        for size in sorted(bid["bytes"].unique()):
            cells = []
            for d in ("d2h", "h2d"):
                together = bid[(bid["bytes"] == size) & (bid.direction == d)].gbps
                alone = plain[
                    (plain["bytes"] == size)
                    & (plain.direction == d)
                    & (plain.host_memory == bid.host_memory.iloc[0])
                ].gbps
                if len(together) and len(alone):
                    cells.append(f"{d} {alone.iloc[0]:.2f} -> {together.iloc[0]:.2f}")
            lines.append(f"{_size(int(size)):>10}  " + "   ".join(cells))
    ops = med[med.kind == "op"]
    if len(ops):
        lines.append("ops at the largest size per layer count, GB/s by run length (0 = contig.):")
        for (b, lay, d, nl), g in ops.groupby(["backend", "layout", "direction", "layers"]):
            big = g[g["bytes"] == g["bytes"].max()].sort_values("run_pages")
            by_run = " ".join(
                f"{int(r)}:{v:.2f}" for r, v in zip(big.run_pages, big.gbps, strict=True)
            )
            lines.append(
                f"  {b:>6} {lay:>11} {d} L={int(nl):<3} {_size(int(big['bytes'].max())):>9}"
                f"  {by_run}"
            )
    g = df[df.kind == "gemm"]
    if len(g):
        per = g.groupby("layout", sort=False).agg(
            flops=("flops", "first"), t=("duration_s", "median")
        )
        each = ", ".join(f"{n} {r.flops / r.t / 1e12:.0f}" for n, r in per.iterrows())
        rate = gemm_rate(df) / 1e12
        lines.append(f"gemm (one layer's linear GEMMs): {rate:.1f} TFLOP/s ({each})")
    hbm = df[df.kind == "hbm"]
    if len(hbm):
        lines.append(f"hbm: {hbm['bytes'].iloc[0] / hbm.duration_s.median() / 1e9:.1f} GB/s")
    return "\n".join(lines)


def _size(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:g} MiB"
    if n >= KiB:
        return f"{n / KiB:g} KiB"
    return f"{n} B"


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
