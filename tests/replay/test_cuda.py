"""CUDA twins of the CPU tests: real streams, events and pinned memory. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from hicache.policy import PageAllocator
from hicache.policy.allocator import device_pool
from replay.bench import BenchConfig, run_bench
from replay.controller import TorchController
from replay.pools import KVPools
from replay.runtime import CudaRuntime, cuda_available
from replay.transfer import CopyEngine
from tests.replay.conftest import COMBOS, tiny_spec

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device (torch sees none)"),
]


def test_pools_are_on_the_device_and_pinned() -> None:
    rt = CudaRuntime()
    pools = KVPools(tiny_spec(), rt)
    assert pools.device.is_cuda
    assert pools.host is not None and pools.host.is_pinned() and pools.host_pinned
    rt.close()


@pytest.mark.parametrize(("layout", "backend"), COMBOS)
def test_round_trip_on_cuda(layout: str, backend: str) -> None:
    rt = CudaRuntime()
    pools = KVPools(tiny_spec(layout), rt)
    pools.fill_pattern()
    eng = CopyEngine(pools, rt, backend)
    dev, host = [0, 1, 2, 5, 9], [60, 61, 3, 4, 20]
    before = pools.device_pages_view(dev).cpu()
    eng.wait(eng.d2h(dev, host))
    assert torch.equal(pools.host_pages_view(host), before)
    ld = eng.h2d([20, 21, 22, 23, 24], host)
    eng.wait(ld)
    assert torch.equal(pools.device_pages_view([20, 21, 22, 23, 24]).cpu(), before)
    assert ld.duration_s is not None and ld.duration_s > 0
    rt.close()


def test_controller_acks_on_cuda() -> None:
    rt = CudaRuntime()
    spec = tiny_spec()
    pools = KVPools(spec, rt)
    ctrl = TorchController(
        device_pool(spec.device_pages, spec.page_size),
        PageAllocator(spec.host_pages, spec.page_size),
        pools,
        rt,
    )
    for i in range(5):
        ctrl.write([i], node_id=i)
    assert ctrl.wait_writes() == [0, 1, 2, 3, 4]
    ctrl.load([0], node_id=9)
    h = ctrl.start_loading()
    ctrl.wait_layer(h, spec.num_layers - 1)
    assert ctrl.pop_completed_loads() == [[9]]
    rt.close()


def test_quick_bench_on_cuda() -> None:
    rt = CudaRuntime()
    df = run_bench(
        BenchConfig.quick(
            repeats=2,
            gemm=True,
            gemm_tokens=256,
            gemm_shapes=(("qkv", 256, 384), ("down", 512, 256)),
            hbm_bytes=1 << 20,
        ),
        rt,
    )
    assert {"plain", "bidir", "op", "gemm", "hbm"} <= set(df.kind)
    assert {"pinned", "pageable"} <= set(df.host_memory)
    assert (df.duration_s > 0).all()
    rt.close()
