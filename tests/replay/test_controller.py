"""TorchController: FIFO acks on real copies, the load ring, per-layer events, and the policy
core driving it (pins held until the copy is seen complete)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hicache.policy import HiRadixCache, PageKey
from replay.controller import TorchController
from replay.runtime import CpuRuntime
from tests.replay.conftest import COMBOS

Make = Callable[..., TorchController]


def _rt(ctrl: TorchController) -> CpuRuntime:
    assert isinstance(ctrl.runtime, CpuRuntime)
    return ctrl.runtime


def test_write_acks_are_fifo_and_only_after_completion(make_ctrl: Make) -> None:
    ctrl = make_ctrl(defer=True)
    rt = _rt(ctrl)
    ctrl.pools.fill_pattern()
    h1 = ctrl.write([0, 1], node_id=11)
    h2 = ctrl.write([2], node_id=12)
    h3 = ctrl.write([3, 4, 5], node_id=13)
    assert h1 is not None and h2 is not None and h3 is not None
    assert ctrl.pop_completed_writes() == [] and ctrl.writes_in_flight == 3
    rt.step("d2h")  # the first op's copy ran
    assert ctrl.pop_completed_writes() == [11]
    rt.step("d2h", 2)
    assert ctrl.pop_completed_writes() == [12, 13]
    assert [r.op_id for r in ctrl.records] == [1, 2, 3]
    assert torch.equal(ctrl.pools.host_pages_view(h3), ctrl.pools.device_pages_view([3, 4, 5]))


def test_wait_writes_blocks_for_all(make_ctrl: Make) -> None:
    ctrl = make_ctrl(defer=True)
    for i in range(4):
        ctrl.write([i], node_id=100 + i)
    assert ctrl.wait_writes() == [100, 101, 102, 103]
    assert ctrl.writes_in_flight == 0 and len(ctrl.records) == 4
    assert _rt(ctrl).pending("d2h") == 0


def test_loads_merge_per_batch_and_ack_after_the_last_layer(make_ctrl: Make) -> None:
    ctrl = make_ctrl(defer=True)
    rt = _rt(ctrl)
    ctrl.pools.fill_pattern()
    host = ctrl.write([7, 8, 9], node_id=1)
    ctrl.wait_writes()
    assert host is not None
    a = ctrl.load(host[:2], node_id=21)
    b = ctrl.load(host[2:], node_id=22)
    assert a is not None and b is not None
    handle = ctrl.start_loading()
    assert ctrl.start_loading() == -1  # nothing queued any more
    assert ctrl.pop_completed_loads() == []
    layers = ctrl.pools.spec.num_layers
    for layer in range(layers):
        assert not ctrl.layer_done(handle, layer)
    ctrl.wait_layer(handle, 0)
    assert ctrl.layer_done(handle, 0) and not ctrl.layer_done(handle, layers - 1)
    assert ctrl.pop_completed_loads() == []
    rt.synchronize()
    assert ctrl.pop_completed_loads() == [[21, 22]]
    rec = ctrl.records[-1]
    assert (rec.kind, rec.direction, rec.pages, rec.nodes, rec.layers) == (
        "load",
        "h2d",
        3,
        2,
        layers,
    )
    assert torch.equal(ctrl.pools.device_pages_view(a + b), ctrl.pools.device_pages_view([7, 8, 9]))


def test_the_load_ring_holds_three_batches(make_ctrl: Make) -> None:
    ctrl = make_ctrl(defer=True)
    rt = _rt(ctrl)
    handles = []
    for i in range(4):
        assert ctrl.load([i], node_id=i) is not None
        handles.append(ctrl.start_loading())
    # starting the 4th waited for the 1st: it is done, the others are not
    assert ctrl.layer_done(handles[0], 2)
    assert not ctrl.layer_done(handles[1], 0)
    assert ctrl.pop_completed_loads() == [[0]]
    rt.synchronize()
    assert ctrl.pop_completed_loads() == [[1], [2], [3]]


@pytest.mark.parametrize(("layout", "backend"), COMBOS)
def test_records_describe_each_op(make_ctrl: Make, layout: str, backend: str) -> None:
    ctrl = make_ctrl(layout, backend)
    host = ctrl.write([3, 4, 10], node_id=5)
    assert host is not None
    ctrl.synchronize()
    (rec,) = ctrl.records
    spec = ctrl.pools.spec
    assert (rec.kind, rec.backend, rec.layout, rec.pages) == ("write", backend, layout, 3)
    assert rec.nbytes == 3 * spec.page_bytes and rec.runs == 2 and rec.duration_s > 0
    assert rec.as_dict()["op_id"] == 1


def test_the_cache_keeps_a_node_pinned_until_its_write_is_seen(make_ctrl: Make) -> None:
    ctrl = make_ctrl(defer=True)
    rt = _rt(ctrl)
    cache = HiRadixCache(ctrl, write_policy="write_through")
    pages = ctrl.device.alloc_pages(3)
    assert pages is not None
    cache.insert(PageKey([1, 2, 3]), pages)  # write_through: backup issued now
    assert ctrl.writes_in_flight == 1
    cache.writing_check()
    assert cache.protected_size() == 12  # still pinned: the copy has not run
    rt.step("d2h")
    cache.writing_check()
    assert cache.protected_size() == 0 and cache.evictable_size() == 12


def test_reset_waits_and_clears(make_ctrl: Make) -> None:
    ctrl = make_ctrl(defer=True)
    ctrl.write([1], node_id=1)
    ctrl.load([5], node_id=2)
    ctrl.start_loading()
    ctrl.reset()
    assert _rt(ctrl).pending("d2h") == 0 and _rt(ctrl).pending("h2d") == 0
    assert ctrl.host is not None and ctrl.host.available_size() == ctrl.host.capacity_tokens
    assert len(ctrl.records) == 2


def test_pool_must_cover_the_allocators(make_ctrl: Make) -> None:
    from hicache.policy import PageAllocator
    from replay.pools import KVPools
    from tests.replay.conftest import tiny_spec

    rt = CpuRuntime()
    pools = KVPools(tiny_spec(), rt)
    with pytest.raises(ValueError, match="device allocator"):
        TorchController(PageAllocator(33, 4), PageAllocator(64, 4), pools, rt)
    with pytest.raises(ValueError, match="host allocator"):
        TorchController(PageAllocator(32, 4), PageAllocator(65, 4), pools, rt)
    with pytest.raises(ValueError, match="page size"):
        TorchController(PageAllocator(32, 2), PageAllocator(64, 2), pools, rt)
