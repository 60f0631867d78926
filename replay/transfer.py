"""One HiCache write or load as real copies between :class:`~replay.pools.KVPools` tensors.

What an op issues (POLICY_CORE.md §4.3b and §5: writes copy all layers of a node in one op,
loads go layer by layer with one event per layer):

``direct`` (SGLang's ``cudaMemcpyAsync`` path; ``layer_first`` host layout only, the layout
SGLang's direct IO reads per layer):
  * write: one copy per contiguous run, per part (K, V) and per layer, all on the write stream;
  * load: for each layer, one copy per run and part, then that layer's mark.

``kernel``-like (SGLang's gather/scatter kernels, emulated with torch index ops):
  * write: one ``index_select`` of all layers on the device into a staging tensor already in
    the host layout, **one** device->host copy into a pinned staging buffer, then a CPU
    ``index_copy_`` into the host pool once the copy has completed (:meth:`CopyEngine.complete`).
  * load, ``layer_first``: for each layer, a CPU ``index_select`` of the layer's pages into a
    pinned staging buffer, one host->device copy, an ``index_copy_`` into the device pool, the
    layer's mark. ``page_first`` (a page's layers are one host block): one CPU gather of whole
    pages and one copy, then per layer an ``index_copy_`` from the staged block and the layer's
    mark.

Why the host side runs on the CPU: torch cannot run an index kernel on pinned host memory, which
is what SGLang's kernels do (zero-copy over PCIe). The CPU gather/scatter costs host memory
bandwidth and is timed with the op, so a calibration of this backend measures *this* emulation:
one op, one bulk copy, no per-run cost. The provenance of a profile says so.

Timing: a mark before the first copy and one after the last (CUDA events, or wall clock on the
CPU); the span includes CPU work done between them while the stream is idle (index uploads, the
load gathers), as a real issuing thread would. The write's host scatter runs after the copy and
is added to its duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from replay.pools import KVPools, count_runs, split_runs
from replay.runtime import Runtime

BACKENDS = ("kernel", "direct")


@dataclass(eq=False)
class Transfer:
    """One issued write (``d2h``) or load (``h2d``) and, once complete, its measured time."""

    direction: str
    backend: str
    device_pages: list[int]
    host_pages: list[int]
    nbytes: int
    runs: int
    layers: int
    calls: int
    """Copies across the link this op issued (the unit SGLang's direct IO pays a call for)."""
    issue_s: float
    """``perf_counter()`` when the op was issued."""
    start: Any = None
    end: Any = None
    layer_marks: list[Any] = field(default_factory=list)
    finalize: Callable[[], None] | None = None
    keep: list[torch.Tensor] = field(default_factory=list)
    host_s: float = 0.0
    """CPU seconds of host-side work done after the copy (kernel write scatter)."""
    issue_cpu_s: float = 0.0
    """CPU seconds the issuing call took (index uploads, per-run copy calls, the kernel load's
    gathers): next to ``duration_s`` it shows whether an op was bound by its issuing thread
    (the two close) or by the link (``duration_s`` well above)."""
    duration_s: float | None = None
    """Measured seconds (set by :meth:`CopyEngine.complete`)."""

    @property
    def pages(self) -> int:
        return len(self.device_pages)

    @property
    def done(self) -> bool:
        return self.duration_s is not None


class CopyEngine:
    """Issues :class:`Transfer` s for one pool pair, backend and runtime (see the module
    docstring). Not thread-safe; one engine per controller or benchmark."""

    def __init__(self, pools: KVPools, runtime: Runtime, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"io backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if pools.host is None:
            raise ValueError("a copy engine needs a host pool")
        if backend == "direct" and pools.spec.layout != "layer_first":
            raise ValueError(
                "the direct backend needs the layer_first host layout (SGLang pairs direct IO "
                "with layer_first or page_first_direct; page_first needs the kernel backend)"
            )
        self.pools = pools
        self.rt = runtime
        self.backend = backend

    # ------------------------------------------------------------------------------ issue --
    def _new(self, direction: str, dev: Sequence[int], host: Sequence[int]) -> Transfer:
        s = self.pools.spec
        if len(dev) != len(host):
            raise ValueError(f"{len(dev)} device pages vs {len(host)} host pages")
        if not dev:
            raise ValueError("empty transfer")
        return Transfer(
            direction=direction,
            backend=self.backend,
            device_pages=list(dev),
            host_pages=list(host),
            nbytes=len(dev) * s.page_bytes,
            runs=count_runs(dev, host),
            layers=s.num_layers,
            calls=0,
            issue_s=time.perf_counter(),
        )

    def d2h(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> Transfer:
        """Issue a write of ``device_pages`` to ``host_pages`` (all layers) on the write stream."""
        t = self._new("d2h", device_pages, host_pages)
        rt = self.rt
        rt.begin("d2h")
        t.start = rt.mark("d2h")
        if self.backend == "direct":
            self._d2h_direct(t)
        else:
            self._d2h_kernel(t)
        t.end = rt.mark("d2h")
        t.issue_cpu_s = time.perf_counter() - t.issue_s
        return t

    def h2d(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> Transfer:
        """Issue a load of ``host_pages`` into ``device_pages``, layer by layer, on the load
        stream, with one mark per layer (``layer_marks``)."""
        t = self._new("h2d", device_pages, host_pages)
        rt = self.rt
        rt.begin("h2d")
        t.start = rt.mark("h2d")
        if self.backend == "direct":
            self._h2d_direct(t)
        else:
            self._h2d_kernel(t)
        t.end = t.layer_marks[-1]
        t.issue_cpu_s = time.perf_counter() - t.issue_s
        return t

    # -- direct -----------------------------------------------------------------------------
    def _d2h_direct(self, t: Transfer) -> None:
        runs = split_runs(t.device_pages, t.host_pages)
        dv, hv = self.pools.device_views, self.pools.host_views
        s = self.pools.spec

        def work() -> None:
            for part in range(s.parts):
                for layer in range(s.num_layers):
                    d, h = dv[part][layer], hv[part][layer]
                    for d0, h0, n in runs:
                        h[h0 : h0 + n].copy_(d[d0 : d0 + n], non_blocking=True)

        t.calls = s.parts * s.num_layers * len(runs)
        self.rt.run("d2h", work)

    def _h2d_direct(self, t: Transfer) -> None:
        runs = split_runs(t.device_pages, t.host_pages)
        dv, hv = self.pools.device_views, self.pools.host_views
        s = self.pools.spec
        for layer in range(s.num_layers):

            def work(layer: int = layer) -> None:
                for part in range(s.parts):
                    d, h = dv[part][layer], hv[part][layer]
                    for d0, h0, n in runs:
                        d[d0 : d0 + n].copy_(h[h0 : h0 + n], non_blocking=True)

            self.rt.run("h2d", work)
            t.layer_marks.append(self.rt.mark("h2d"))
        t.calls = s.parts * s.num_layers * len(runs)

    # -- kernel-like ------------------------------------------------------------------------
    def _d2h_kernel(self, t: Transfer) -> None:
        pools, rt, s = self.pools, self.rt, self.pools.spec
        host = pools.host
        assert host is not None
        n = t.pages
        flat = (s.parts, s.num_layers, n, s.page_size * s.elems)
        box: dict[str, torch.Tensor] = {}

        def work() -> None:
            idx = rt.index(t.device_pages)
            g = rt.staging(flat, s.dtype, "device")
            torch.index_select(pools.device, 2, idx, out=g)
            t.keep.append(g)
            if s.layout == "page_first":
                # the host block of a page is (page_size, layers, e): reorder on the device,
                # where it costs HBM bandwidth, not link or host bandwidth
                shape = (s.parts, n, s.page_size, s.num_layers, s.elems)
                pf = rt.staging(shape, s.dtype, "device")
                pf.copy_(
                    g.view(s.parts, s.num_layers, n, s.page_size, s.elems).permute(0, 2, 3, 1, 4)
                )
                t.keep.append(pf)
                g = pf
            staged = rt.staging(g.shape, s.dtype, "host")
            staged.copy_(g, non_blocking=True)
            t.keep.append(staged)
            box["staged"] = staged

        rt.run("d2h", work)
        t.calls = 1

        def scatter() -> None:
            staged = box["staged"]
            hidx = torch.tensor(t.host_pages, dtype=torch.int64)
            if s.layout == "page_first":
                for part in range(s.parts):
                    host[part].view(s.host_pages, -1).index_copy_(0, hidx, staged[part].view(n, -1))
            else:
                for part in range(s.parts):
                    for layer in range(s.num_layers):
                        host[part, layer].index_copy_(0, hidx, staged[part, layer])

        t.finalize = scatter

    def _h2d_kernel(self, t: Transfer) -> None:
        pools, rt, s = self.pools, self.rt, self.pools.spec
        host = pools.host
        assert host is not None
        n = t.pages
        hidx = torch.tensor(t.host_pages, dtype=torch.int64)
        box: dict[str, torch.Tensor] = {}

        def upload() -> None:
            box["idx"] = rt.index(t.device_pages)

        rt.run("h2d", upload)
        if s.layout == "page_first":
            # one gather of whole pages (all layers) and one copy; the per-layer step is the
            # device-side scatter, each followed by its layer's mark
            shape = (s.parts, n, s.page_size, s.num_layers, s.elems)

            def bulk() -> None:
                staged = rt.staging(shape, s.dtype, "host")
                for part in range(s.parts):
                    torch.index_select(
                        host[part].view(s.host_pages, -1), 0, hidx, out=staged[part].view(n, -1)
                    )
                dev = rt.staging(shape, s.dtype, "device")
                dev.copy_(staged, non_blocking=True)
                box["staged"] = dev
                t.keep += [staged, dev]

            rt.run("h2d", bulk)
            for layer in range(s.num_layers):

                def scatter(layer: int = layer) -> None:
                    staged = box["staged"]
                    for part in range(s.parts):
                        dst = pools.device_views[part][layer].view(-1, s.page_size, s.elems)
                        dst.index_copy_(0, box["idx"], staged[part, :, :, layer, :])

                rt.run("h2d", scatter)
                t.layer_marks.append(rt.mark("h2d"))
            t.calls = 1
            return
        for layer in range(s.num_layers):

            def step(layer: int = layer) -> None:
                shape = (s.parts, n, s.page_size * s.elems)
                staged = rt.staging(shape, s.dtype, "host")
                for part in range(s.parts):
                    torch.index_select(pools.host_views[part][layer], 0, hidx, out=staged[part])
                dev = rt.staging(shape, s.dtype, "device")
                dev.copy_(staged, non_blocking=True)
                for part in range(s.parts):
                    pools.device_views[part][layer].index_copy_(0, box["idx"], dev[part])
                # held until the op completes (then recycled): on CUDA the copy reads `staged`
                # asynchronously
                t.keep += [staged, dev]

            rt.run("h2d", step)
            t.layer_marks.append(rt.mark("h2d"))
        t.calls = s.num_layers

    def warmup(self, max_pages: int, in_flight: int = 2) -> None:
        """``in_flight`` writes, then as many loads, of 1, 2, 4, ... ``max_pages`` pages (pages
        ``0..n-1`` on both sides, so their contents are overwritten), waiting after each group:
        afterwards the staging allocators hold ``in_flight`` buffers of every power-of-two size
        class up to ``max_pages``, and no timed op pays a first allocation (a fresh pinned or
        CPU buffer costs page faults or a ``cudaHostAlloc``, milliseconds to seconds for large
        ones), even with a few ops of one size in flight."""
        k = 1
        while max_pages > 0:
            n = min(k, max_pages)
            pages = list(range(n))
            for issue in (self.d2h, self.h2d):
                group = [issue(pages, pages) for _ in range(max(1, in_flight))]
                for t in group:
                    self.wait(t)
            if n == max_pages:
                break
            k *= 2

    # --------------------------------------------------------------------------- complete --
    def complete(self, t: Transfer) -> bool:
        """If ``t``'s last mark has completed, finish it (host-side scatter, measured duration)
        and return True; False while it is in flight. Idempotent."""
        if t.done:
            return True
        if not self.rt.is_done(t.end):
            return False
        self._finish(t)
        return True

    def wait(self, t: Transfer) -> None:
        """Block until ``t`` has completed, then finish it as :meth:`complete` does."""
        if t.done:
            return
        self.rt.wait(t.end)
        self._finish(t)

    def layer_done(self, t: Transfer, layer: int) -> bool:
        """Whether layer ``layer`` of load ``t`` has arrived (SGLang's per-layer event)."""
        return t.done or self.rt.is_done(t.layer_marks[layer])

    def wait_layer(self, t: Transfer, layer: int) -> None:
        if not t.done:
            self.rt.wait(t.layer_marks[layer])

    def _finish(self, t: Transfer) -> None:
        span = self.rt.seconds_between(t.start, t.end)
        if t.finalize is not None:
            t0 = time.perf_counter()
            t.finalize()
            t.host_s = time.perf_counter() - t0
            t.finalize = None
        self.rt.recycle(t.keep)
        t.keep.clear()
        t.duration_s = span + t.host_s


__all__ = ["BACKENDS", "CopyEngine", "Transfer"]
