"""Two in-order copy streams with timing marks, on CUDA or on the CPU.

SGLang's HiCacheController owns a *write stream* (device->host) and a *load stream*
(host->device); copies on one stream run in issue order, the two streams run concurrently, and
completion is observed by querying CUDA events. :class:`Runtime` is that much of CUDA:

* ``run(stream, fn)`` lets ``fn`` enqueue work on ``stream`` (CUDA: inside
  ``torch.cuda.stream(...)``; the CPU runs ``fn`` now, or later when deferred);
* ``mark(stream)`` records a point on the stream (a CUDA event with timing; on the CPU a
  wall-clock stamp taken when the stream reaches it);
* ``is_done(mark)``, ``wait(mark)``, ``seconds_between(a, b)``, ``synchronize()``.

:class:`CpuRuntime` runs the very same copy code on plain CPU tensors, so the whole replay path is
tested without a GPU. With ``defer=True`` work is queued per stream and only runs when a test
calls :meth:`CpuRuntime.step` (or something waits on it), which is how the tests observe
in-flight copies, FIFO acks and per-layer events. Timings from a deferred runtime are
meaningless (they include the test's own pauses).

Streams are named by direction: ``"d2h"`` (the write stream) and ``"h2d"`` (the load stream).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from replay.presets import gpu_preset_for

STREAMS = ("d2h", "h2d")


def cuda_available() -> bool:
    """True when torch was built with CUDA and sees a device."""
    return bool(torch.cuda.is_available())


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; ``"cuda"`` without CUDA raises
    ``ValueError`` (one line, for the CLI); ``"cpu"`` stays."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise ValueError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda or 'none'}); use --device cpu"
        )
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, got {device!r}")
    return device


class Runtime:
    """The interface the copy code talks to (see the module docstring)."""

    kind: str = "?"
    device: torch.device
    pinned: bool
    """Whether host buffers are page-locked (only with CUDA)."""
    notes: list[str]
    """What did not go as planned (e.g. a pinning fallback), for a run's provenance."""

    def run(self, stream: str, fn: Callable[[], None]) -> None:
        raise NotImplementedError

    def mark(self, stream: str) -> Any:
        raise NotImplementedError

    def is_done(self, mark: Any) -> bool:
        raise NotImplementedError

    def wait(self, mark: Any) -> None:
        raise NotImplementedError

    def seconds_between(self, start: Any, end: Any) -> float:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def begin(self, stream: str) -> None:
        """Order what is issued next on ``stream`` after the work already on the default stream
        (SGLang records a start event on the scheduler stream for the same reason: the KV a
        write reads was produced by the forward pass)."""

    # -- memory -----------------------------------------------------------------------------
    def device_empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def host_empty(
        self, shape: Sequence[int], dtype: torch.dtype, pinned: bool = True
    ) -> torch.Tensor:
        """A host buffer, page-locked when ``pinned`` and this runtime can pin (CUDA only: on
        the CPU build ``pin_memory`` raises, and there is no DMA to speed up anyway)."""
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=pinned and self.pinned)

    def host_pool(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A large, long-lived host buffer (the host KV pool), pinned when possible."""
        return self.host_empty(shape, dtype)

    def free_host_pool(self, pool: torch.Tensor) -> None:
        """Release a :meth:`host_pool` buffer's page lock before the buffer is dropped."""

    def staging(self, shape: Sequence[int], dtype: torch.dtype, side: str) -> torch.Tensor:
        """A short-lived buffer for one op (``side`` ``"host"``: pinned when possible;
        ``"device"``), handed back with :meth:`recycle` once the op has completed. CUDA: torch's
        caching allocators already reuse freed blocks safely (they record stream events)."""
        if side == "host":
            return self.host_empty(shape, dtype)
        return self.device_empty(shape, dtype)

    def recycle(self, tensors: Sequence[torch.Tensor]) -> None:
        """Take back :meth:`staging` buffers of a completed op."""

    def index(self, values: Sequence[int]) -> torch.Tensor:
        """An int64 index tensor on the device (the kernel backend's index upload)."""
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def close(self) -> None:
        """Release what the runtime holds beyond plain tensors (pinned registrations)."""

    def describe(self) -> dict[str, str]:
        """Machine facts for provenance: device name, torch / CUDA / driver versions."""
        return machine_info(self.kind)


# ---------------------------------------------------------------------------------- CPU ------


@dataclass(eq=False)
class CpuMark:
    """A point on a CPU stream; ``t`` is the wall-clock stamp once the stream has reached it."""

    stream: str
    t: float | None = None


class CpuRuntime(Runtime):
    """Plain CPU tensors on both sides; ``perf_counter`` timing.

    ``defer=False``: ``run`` executes at once and marks are stamped at once, so a mark after a
    copy measures exactly that copy. ``defer=True``: work and marks queue per stream and run in
    order when :meth:`step`, :meth:`wait` or :meth:`synchronize` drive them.
    """

    kind = "cpu"

    def __init__(self, defer: bool = False) -> None:
        self.device = torch.device("cpu")
        self.pinned = False
        self.notes = []
        self.defer = defer
        self._queues: dict[str, deque[Callable[[], None] | CpuMark]] = {s: deque() for s in STREAMS}
        # staging buffers by (capacity, dtype): a fresh CPU allocation of a few MiB is a fresh
        # mmap whose first touch page-faults, which would be timed as copy time
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self._lent: dict[int, torch.Tensor] = {}

    def staging(self, shape: Sequence[int], dtype: torch.dtype, side: str) -> torch.Tensor:
        numel = 1
        for d in shape:
            numel *= d
        cap = 1 << max(0, (numel - 1).bit_length())
        free = self._free.get((cap, dtype))
        buf = free.pop() if free else torch.zeros(cap, dtype=dtype)
        view = buf[:numel].view(tuple(shape))
        self._lent[id(view)] = buf
        return view

    def recycle(self, tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            buf = self._lent.pop(id(t), None)
            if buf is not None:
                free = self._free.setdefault((buf.numel(), buf.dtype), [])
                if len(free) < 8:  # bound what an unusual burst of ops leaves cached
                    free.append(buf)

    def run(self, stream: str, fn: Callable[[], None]) -> None:
        if self.defer:
            self._queues[stream].append(fn)
        else:
            fn()

    def mark(self, stream: str) -> CpuMark:
        m = CpuMark(stream)
        q = self._queues[stream]
        if self.defer and q:
            q.append(m)
        else:
            # an idle stream reaches a new mark at once, as a CUDA event on an idle stream does
            m.t = time.perf_counter()
        return m

    def pending(self, stream: str) -> int:
        """Work items (not marks) still queued on ``stream``."""
        return sum(1 for x in self._queues[stream] if not isinstance(x, CpuMark))

    def step(self, stream: str, n: int = 1) -> int:
        """Run up to ``n`` queued work items of ``stream`` in order, stamping every mark reached
        on the way (including marks right after the last item run); returns items run."""
        q = self._queues[stream]
        done = 0
        while q:
            head = q[0]
            if isinstance(head, CpuMark):
                q.popleft()
                head.t = time.perf_counter()
                continue
            if done == n:
                break
            q.popleft()
            head()
            done += 1
        return done

    def is_done(self, mark: CpuMark) -> bool:
        return mark.t is not None

    def wait(self, mark: CpuMark) -> None:
        while mark.t is None:
            if not self.step(mark.stream) and mark.t is None:
                raise AssertionError("waiting on a CPU mark that is not queued")

    def seconds_between(self, start: CpuMark, end: CpuMark) -> float:
        if start.t is None or end.t is None:
            raise AssertionError("seconds_between on an incomplete mark")
        return end.t - start.t

    def synchronize(self) -> None:
        for s in STREAMS:
            self.step(s, n=1 << 62)


# --------------------------------------------------------------------------------- CUDA ------


class CudaRuntime(Runtime):
    """A CUDA device: one side stream per direction, CUDA events (with timing) as marks, and a
    page-locked host pool (``cudaHostRegister`` of a plain allocation, so a 12 GiB pool costs
    12 GiB and not the 16 GiB the caching host allocator's power-of-two rounding would take)."""

    kind = "cuda"

    def __init__(self, index: int = 0) -> None:
        if not cuda_available():
            raise ValueError("CUDA is not available")
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        self.pinned = True
        self._streams: dict[str, torch.cuda.Stream] = {}
        for s in STREAMS:
            self._streams[s] = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        self._registered: list[torch.Tensor] = []
        self.notes = []

    def run(self, stream: str, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self._streams[stream]):
            fn()

    def begin(self, stream: str) -> None:
        self._streams[stream].wait_stream(torch.cuda.current_stream(self.device))

    def mark(self, stream: str) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ev.record(self._streams[stream])
        return ev

    def is_done(self, mark: torch.cuda.Event) -> bool:
        return bool(mark.query())  # type: ignore[no-untyped-call]

    def wait(self, mark: torch.cuda.Event) -> None:
        mark.synchronize()

    def seconds_between(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end)) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def host_pool(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(tuple(shape), dtype=dtype)
        nbytes = t.numel() * t.element_size()
        try:
            # flag 0 = cudaHostRegisterDefault: one device (torch's _pin_memory_utils passes
            # 1, portable, for memory shared by several GPUs)
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            rc = int(cudart.cudaHostRegister(t.data_ptr(), nbytes, 0))
        except (AttributeError, AssertionError, RuntimeError):
            rc = -1
        if rc == 0:
            self._registered.append(t)
            return t
        # A failed cudaHostRegister leaves its error as the runtime's "last error", which the
        # next kernel launch check would raise as its own: clear it before going on.
        if rc > 0 and not _clear_cuda_error():
            raise RuntimeError(
                f"cudaHostRegister of a {nbytes / 2**30:.2f} GiB host pool failed (cudaError "
                f"{rc}) and the error could not be cleared; lower the host budget or raise the "
                "locked-memory limit (ulimit -l)"
            )
        self.notes.append(
            f"cudaHostRegister failed (cudaError {rc}): host pool from the caching host "
            "allocator (pinned, size rounded up to a power of two)"
        )
        del t
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)

    def free_host_pool(self, pool: torch.Tensor) -> None:
        for i, t in enumerate(self._registered):
            if t is pool:
                # copies may still read it: unlock only once the device is idle
                self.synchronize()
                torch.cuda.cudart().cudaHostUnregister(t.data_ptr())  # type: ignore[no-untyped-call]
                del self._registered[i]
                return

    def index(self, values: Sequence[int]) -> torch.Tensor:
        # pinned source so the upload is an async copy ordered on the current (side) stream
        cpu = torch.tensor(values, dtype=torch.int64).pin_memory()
        return cpu.to(self.device, non_blocking=True)

    def close(self) -> None:
        self.synchronize()
        for t in self._registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())  # type: ignore[no-untyped-call]
        self._registered.clear()


def _clear_cuda_error() -> bool:
    """Call ``cudaGetLastError`` of the CUDA runtime library torch loaded (torch binds no such
    function) to reset the runtime's last error; False when the library is not found."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {
                line.split()[-1] for line in f if "libcudart.so" in line and "/" in line.split()[-1]
            }
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            ctypes.CDLL(path).cudaGetLastError()
            return True
        except (OSError, AttributeError):
            continue
    return False


def make_runtime(device: str, defer: bool = False) -> Runtime:
    """A :class:`CudaRuntime` for ``"cuda"``, a :class:`CpuRuntime` for ``"cpu"`` (``"auto"``
    picks); ``ValueError`` for CUDA without CUDA."""
    kind = resolve_device(device)
    return CudaRuntime() if kind == "cuda" else CpuRuntime(defer=defer)


# ----------------------------------------------------------------------- provenance ----------


def _driver_version() -> str:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
            if out:
                return out.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        v = int(torch._C._cuda_getDriverVersion())  # type: ignore[attr-defined]  # CUDA driver API version, e.g. 12040
        return f"CUDA driver API {v // 1000}.{v % 1000 // 10}"
    except (AttributeError, RuntimeError):
        return "unknown"


def code_commit() -> str:
    """The hicache-sim commit a measurement ran (provenance): ``$HICACHE_COMMIT`` when set (a
    machine that got the working tree without ``.git``), else ``git rev-parse HEAD`` of this
    checkout with ``-dirty`` when it has changes, else ``"unknown"``."""
    import subprocess
    from pathlib import Path

    env = os.environ.get("HICACHE_COMMIT", "").strip()
    if env:
        return env
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head or "unknown"


def machine_info(kind: str) -> dict[str, str]:
    """Strings describing the machine a measurement ran on (for profile provenance)."""
    import platform

    info = {
        "device": kind,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda or "none"),
        "host": platform.node() or "unknown",
        "cpu": platform.processor() or platform.machine() or "unknown",
        "cpu_count": str(os.cpu_count() or 0),
        "torch_threads": str(torch.get_num_threads()),
    }
    if kind == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name()
        info["driver"] = _driver_version()
    else:
        info["gpu_name"] = "none (CPU tensors)"
        info["driver"] = "none"
    return info


__all__ = [
    "STREAMS",
    "CpuMark",
    "CpuRuntime",
    "CudaRuntime",
    "Runtime",
    "code_commit",
    "cuda_available",
    "gpu_preset_for",
    "machine_info",
    "make_runtime",
    "resolve_device",
]
