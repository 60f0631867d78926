"""Pools: geometry of both layouts, sizing and scaling, run counting, element placement."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from replay.pools import KVPools, PoolSpec, count_runs, model_pools, size_pools, split_runs
from replay.runtime import CpuRuntime
from replay.transfer import CopyEngine
from tests.replay.conftest import tiny_spec


def test_shapes_follow_sglang_layouts() -> None:
    lf = tiny_spec("layer_first")
    pf = tiny_spec("page_first")
    # device: (parts, layers, pages, page_size * e); e = 32 B / 8 B = 4 int64
    assert lf.dtype == torch.int64 and lf.elems == 4
    assert lf.device_shape() == (2, 3, 32, 16)
    assert lf.host_shape() == (2, 3, 64, 16)  # per layer, pages contiguous
    assert pf.host_shape() == (2, 64, 4, 3, 4)  # token-major: all layers of a token together
    assert lf.layer_page_bytes == 4 * 64 and lf.page_bytes == 4 * 64 * 3
    assert lf.device_bytes == 32 * lf.page_bytes and pf.host_bytes == 64 * pf.page_bytes


def test_dtype_is_the_widest_that_divides_a_token_part() -> None:
    assert tiny_spec(token_layer_bytes=12).dtype == torch.int16  # 6 B per part
    assert tiny_spec(token_layer_bytes=10).dtype == torch.uint8  # 5 B per part
    assert tiny_spec(token_layer_bytes=8).dtype == torch.int32


@pytest.mark.parametrize(
    "kw", [{"num_layers": 0}, {"page_size": 0}, {"host_pages": -1}, {"token_layer_bytes": 3}]
)
def test_invalid_specs_are_rejected(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        tiny_spec("page_first", **kw)
    with pytest.raises(ValueError, match="layout"):
        PoolSpec(1, 8, 1, 1, 1, "page_head")


def test_no_scaling_when_it_fits() -> None:
    s = size_pools(
        num_layers=2,
        token_layer_bytes=64,
        page_size=4,
        device_tokens=40,
        host_tokens=80,
        device_budget_bytes=1 << 20,
        host_budget_bytes=1 << 20,
    )
    assert (s.spec.device_pages, s.spec.host_pages, s.factor, s.notes) == (10, 20, 1.0, ())


def test_scaling_keeps_the_ratio_and_says_what_it_did() -> None:
    page = 2 * 64 * 4  # bytes of one page, all layers
    s = size_pools(
        num_layers=2,
        token_layer_bytes=64,
        page_size=4,
        device_tokens=4000,
        host_tokens=8004,
        device_budget_bytes=100 * page,
        host_budget_bytes=10_000 * page,
    )
    assert s.spec.device_pages == 100 and s.spec.host_pages == 200
    assert s.factor == pytest.approx(0.1)
    assert s.spec.device_bytes <= 100 * page
    assert len(s.notes) == 1 and "scaled by 0.1" in s.notes[0] and "4,000 -> 400" in s.notes[0]
    # explicit --scale
    t = size_pools(
        num_layers=2,
        token_layer_bytes=64,
        page_size=4,
        device_tokens=4000,
        host_tokens=8004,
        device_budget_bytes=1 << 30,
        host_budget_bytes=1 << 30,
        scale=0.5,
    )
    assert t.spec.device_pages == 500 and "--scale" in t.notes[0]


def test_scaled_host_stays_larger_than_device() -> None:
    s = size_pools(
        num_layers=1,
        token_layer_bytes=8,
        page_size=1,
        device_tokens=100,
        host_tokens=101,
        device_budget_bytes=8 * 10,
        host_budget_bytes=1 << 20,
    )
    assert s.spec.host_pages > s.spec.device_pages


def test_budget_too_small_for_one_page() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        size_pools(
            num_layers=32,
            token_layer_bytes=4096,
            page_size=64,
            device_tokens=640,
            host_tokens=1280,
            device_budget_bytes=1 << 20,
            host_budget_bytes=1 << 30,
        )


def test_model_pools_use_the_model_geometry() -> None:
    s = model_pools(
        "llama-3-8b",
        tp=1,
        page_size=64,
        device_tokens=64_000,
        host_tokens=128_064,
        device_budget_bytes=1 << 30,
        host_budget_bytes=4 << 30,
    )
    spec = s.spec
    # HARDWARE.md C4: 4,096 B per token per layer, 32 layers, K and V
    assert (spec.num_layers, spec.token_layer_bytes, spec.parts) == (32, 4096, 2)
    assert spec.page_bytes == 8 * 2**20  # 8 MiB per 64-token page
    assert spec.device_pages == 128 and s.factor < 1
    mla = model_pools(
        "deepseek-v3",
        tp=8,
        page_size=64,
        device_tokens=6400,
        host_tokens=12864,
        device_budget_bytes=1 << 30,
        host_budget_bytes=1 << 30,
    )
    assert mla.spec.parts == 1 and mla.spec.token_layer_bytes == 1152
    small = model_pools(
        "llama-3-8b",
        tp=1,
        page_size=16,
        device_tokens=1600,
        host_tokens=3216,
        device_budget_bytes=1 << 30,
        host_budget_bytes=1 << 30,
        num_layers=2,
        token_layer_bytes=256,
    )
    assert small.spec.num_layers == 2 and len(small.notes) == 2


def test_count_runs_and_split_runs() -> None:
    assert count_runs([], []) == 0
    assert count_runs([1, 2, 3], [7, 8, 9]) == 1
    assert count_runs([1, 2, 3], [7, 9, 10]) == 2  # host side breaks
    assert count_runs([1, 3, 4], [7, 8, 9]) == 2  # device side breaks
    assert split_runs([5, 6, 0, 1], [2, 3, 4, 5]) == [(5, 2, 2), (0, 4, 2)]
    with pytest.raises(ValueError):
        count_runs([1], [])


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=30))
def test_split_runs_reconstructs_the_pairs(pairs: list[tuple[int, int]]) -> None:
    dev = [d for d, _ in pairs]
    host = [h for _, h in pairs]
    runs = split_runs(dev, host)
    assert len(runs) == count_runs(dev, host)
    assert [d0 + i for d0, _, n in runs for i in range(n)] == dev
    assert [h0 + i for _, h0, n in runs for i in range(n)] == host


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_written_bytes_land_where_sglang_keeps_them(layout: str) -> None:
    spec = tiny_spec(layout)
    pools = KVPools(spec, CpuRuntime())
    pools.fill_pattern()
    assert pools.host is not None and not pools.host_pinned
    eng = CopyEngine(pools, pools.runtime, "kernel")
    eng.wait(eng.d2h([3, 9], [40, 17]))
    dev = pools.device.view(2, 3, 32, 4, 4)  # (part, layer, page, token, e)
    for part in range(2):
        for layer in range(3):
            for d, h in ((3, 40), (9, 17)):
                for tok in range(4):
                    want = dev[part, layer, d, tok]
                    if layout == "layer_first":
                        got = pools.host.view(2, 3, 64, 4, 4)[part, layer, h, tok]
                    else:
                        got = pools.host[part, h, tok, layer]
                    assert torch.equal(got, want)
    # untouched host pages keep their fill
    assert int(pools.host_pages_view([0]).max()) == -1


def test_stamps_round_trip() -> None:
    pools = KVPools(tiny_spec(), CpuRuntime())
    pools.stamp_device([1, 5], [11, (1 << 63) - 1])
    assert pools.device_stamps_ok([1, 5], [11, (1 << 63) - 1])
    assert not pools.device_stamps_ok([1, 5], [11, 12])
    assert pools.describe()["dtype"] == "int64"


class _FakeCudart:
    def __init__(self, rc: int) -> None:
        self.rc = rc
        self.calls: list[tuple[int, int, int]] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append((ptr, size, flags))
        return self.rc


def _bare_cuda_runtime() -> object:
    """A CudaRuntime without a GPU: only what ``host_pool`` touches."""
    from replay.runtime import CudaRuntime

    rt = object.__new__(CudaRuntime)
    rt._registered = []
    rt.notes = []
    return rt


def test_host_pool_registration_and_its_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinning paths that only a GPU runs, exercised with a fake CUDA runtime library: a
    registered pool is kept for unregistering; a failed registration clears CUDA's last error
    (or it would surface at the next kernel launch as someone else's) and falls back to the
    caching host allocator, saying so; an error that cannot be cleared stops with advice."""
    import replay.runtime as rtm

    real_empty = torch.empty
    pinned_asks: list[bool] = []

    def empty(*shape: object, **kw: object) -> torch.Tensor:
        pinned_asks.append(bool(kw.pop("pin_memory", False)))  # the CPU build cannot pin
        return real_empty(*shape, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    rt = _bare_cuda_runtime()
    ok = _FakeCudart(0)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: ok)
    pool = rt.host_pool((4, 8), torch.int64)
    assert ok.calls == [(pool.data_ptr(), 4 * 8 * 8, 0)]
    assert rt._registered == [pool] and rt.notes == [] and pinned_asks == [False]

    rt = _bare_cuda_runtime()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(712))
    cleared: list[bool] = []
    monkeypatch.setattr(rtm, "_clear_cuda_error", lambda: cleared.append(True) or True)
    pinned_asks.clear()
    pool = rt.host_pool((4, 8), torch.int64)
    assert cleared == [True] and pinned_asks == [False, True]  # fell back to a pinned alloc
    assert rt._registered == [] and "cudaError 712" in rt.notes[0]

    monkeypatch.setattr(rtm, "_clear_cuda_error", lambda: False)
    with pytest.raises(RuntimeError, match=r"could not be cleared.*ulimit -l"):
        rt.host_pool((4, 8), torch.int64)
