"""Timed plain copies, the link's own figures: one ``copy_`` in one direction (the ``plain``
sweep: peak and fixed cost) and both directions at once (the ``bidir`` sweep: the coupling
``eta``), plus the cache flush that precedes every timed op of the bench and every forward
pass of a replay. :func:`plain_rows` and :func:`bidir_rows` are the two sweeps of
:func:`replay.bench.run_bench`; the replay measures its large-copy peak with
:func:`plain_copy_times` between its own pools.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from replay.bench_rows import BenchRows
from replay.runtime import Runtime

if TYPE_CHECKING:
    from replay.bench import BenchConfig


def timed(rt: Runtime, stream: str, fn: Callable[[], None]) -> float:
    """Seconds ``fn`` takes on ``stream``, between two marks (waits for it to finish)."""
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

    out = [timed(rt, direction, copy) for _ in range(warmup + repeats)]
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


def plain_rows(cfg: BenchConfig, rt: Runtime, rows: BenchRows, log: Callable[[str], None]) -> None:
    """The ``plain`` sweep: every size, both directions, in pinned and (if ``cfg.pageable``)
    pageable host memory where the runtime can pin, else in pageable memory only."""
    mems = [True, False] if (rt.pinned and cfg.pageable) else [rt.pinned]
    log(f"plain copies: {len(cfg.plain_sizes)} sizes x 2 directions x {len(mems)} memory kinds")
    for pinned in mems:
        mem = "pinned" if pinned else "pageable"
        for size in cfg.plain_sizes:
            for direction in ("d2h", "h2d"):
                times = plain_copy_times(rt, size, direction, pinned, cfg.repeats, cfg.warmup)
                rows.add(times, kind="plain", direction=direction, host_memory=mem, bytes=size)


def bidir_rows(cfg: BenchConfig, rt: Runtime, rows: BenchRows, log: Callable[[str], None]) -> None:
    """The ``bidir`` sweep: both directions at once at every size of ``cfg.bidir_sizes`` (none
    when it is empty)."""
    if not cfg.bidir_sizes:
        return
    log(f"both directions at once: {len(cfg.bidir_sizes)} sizes")
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


__all__ = [
    "bidir_copy_times",
    "bidir_rows",
    "cache_flusher",
    "plain_copy_times",
    "plain_rows",
    "timed",
]
