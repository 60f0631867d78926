"""Fixtures for the replay tests: tiny pools on CPU tensors (no CUDA needed).

Every test module here needs torch except ``test_replay_imports.py``; without torch they are not
collected (the replay is an optional extra).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None
collect_ignore_glob = [] if HAVE_TORCH else ["test_[!r]*.py"]

if HAVE_TORCH:
    import torch

    # one intra-op thread: the tensors here are tiny, and on a busy CI box OpenMP workers
    # spinning against other processes make small index ops 10x slower
    torch.set_num_threads(1)

    from hicache.policy import PageAllocator
    from hicache.policy.allocator import device_pool
    from replay.controller import TorchController
    from replay.pools import KVPools, PoolSpec
    from replay.runtime import CpuRuntime

    #: (layout, backend) pairs the copy engine supports
    COMBOS = [("layer_first", "direct"), ("layer_first", "kernel"), ("page_first", "kernel")]

    def tiny_spec(layout: str = "page_first", **kw: int) -> PoolSpec:
        """3 layers x 64 B per token (K, V of 32 B: 4 int64), 4-token pages."""
        args = dict(num_layers=3, token_layer_bytes=64, page_size=4, device_pages=32, host_pages=64)
        args.update(kw)
        return PoolSpec(layout=layout, **args)

    @pytest.fixture
    def make_ctrl() -> Callable[..., TorchController]:
        """``make_ctrl(layout, backend, defer=False, **spec)``: a TorchController on CPU tensors
        whose allocators cover the whole pools."""

        def make(
            layout: str = "page_first", backend: str = "kernel", defer: bool = False, **kw: int
        ) -> TorchController:
            spec = tiny_spec(layout, **kw)
            rt = CpuRuntime(defer=defer)
            pools = KVPools(spec, rt)
            dev = device_pool(spec.device_pages, spec.page_size)
            host = PageAllocator(spec.host_pages, spec.page_size, "host")
            return TorchController(dev, host, pools, rt, backend=backend)

        return make

    class CudaLikeRuntime(CpuRuntime):
        """CPU tensors on deferred streams that report CUDA: runs the CUDA-only branches (pinned
        and pageable sweeps, both directions timed by marks on two streams, device flushes, a
        measured profile) on a machine without a GPU. Timings are meaningless; the code paths
        are what is checked."""

        kind = "cuda"

        def __init__(self, gpu_name: str = "NVIDIA H200") -> None:
            super().__init__(defer=True)
            self.pinned = True
            self.gpu_name = gpu_name

        def host_empty(
            self, shape: Sequence[int], dtype: torch.dtype, pinned: bool = True
        ) -> torch.Tensor:
            return torch.empty(tuple(shape), dtype=dtype)  # the CPU build cannot pin

        def describe(self) -> dict[str, str]:
            info = CpuRuntime().describe()
            return {**info, "device": "cuda", "gpu_name": self.gpu_name, "driver": "fake"}
