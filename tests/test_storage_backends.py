"""Storage backend presets and the per-call cost rule (``hicache.storage_backends``)."""

from __future__ import annotations

import dataclasses

import pytest

from hicache.config.sections import STORAGE_BACKENDS, StorageConfig
from hicache.storage_backends import (
    BACKENDS,
    StorageBackendSpec,
    backend_for,
    get_backend,
    with_overrides,
)


def spec(**kw: object) -> StorageBackendSpec:
    """Round numbers: 1 MB/s read, 0.5 MB/s write, 10/20/30 ms per call, 1/2/3 ms per page."""
    base: dict[str, object] = dict(
        name="t",
        read_gbps=1e-3,
        write_gbps=0.5e-3,
        query_call_s=0.01,
        read_call_s=0.02,
        write_call_s=0.03,
        query_page_s=0.001,
        read_page_s=0.002,
        write_page_s=0.003,
        zero_copy=True,
        shared=True,
        sources=("hand-made",),
    )
    base.update(kw)
    return StorageBackendSpec(**base)  # type: ignore[arg-type]


def test_presets_match_the_config_names_and_carry_sources() -> None:
    assert set(BACKENDS) == set(STORAGE_BACKENDS) - {"none"}
    for b in BACKENDS.values():
        assert b.sources and all(s.strip() for s in b.sources)
        assert not b.measured and b.note  # estimates, and the note says which
        assert b.read_gbps > 0 and b.write_gbps > 0
        assert b.zero_copy or b.copy_gbps > 0


def test_preset_character() -> None:
    f, t, m = get_backend("file"), get_backend("3fs"), get_backend("mooncake")
    assert not f.zero_copy and f.query_stops_at_miss and not f.shared
    assert t.zero_copy and m.zero_copy and t.shared and m.shared
    assert (f.read_gbps, f.write_gbps, f.copy_gbps) == (6.5, 3.5, 5.4)
    assert t.read_gbps == pytest.approx(40 * 2**30 / 1e9)  # 3FS README: 40 GiB/s
    assert (m.read_gbps, m.write_gbps) == (87.0, 87.0)  # Mooncake TE on 4x200 Gbps RoCE
    # a 128-page read of 8 MiB pages: RDMA stores beat one local SSD behind a memcpy
    page = 8 << 20
    read = {b.name: b.call_seconds("read", 128, page) for b in (f, t, m)}
    assert read["mooncake"] < read["3fs"] < read["file"]
    # file: 128 x (20 us + 8 MiB / 5.4 GB/s) + 128 x 8 MiB / 6.5 GB/s
    assert read["file"] == pytest.approx(128 * (20e-6 + page / 5.4e9) + 128 * page / 6.5e9)


def test_get_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown storage backend 'nvme'; choices: 3fs, file, "):
        get_backend("nvme")


def test_call_seconds_arithmetic() -> None:
    s = spec()
    # query: 10 ms + 4 x 1 ms, no bytes (page size and ranks do not matter)
    assert s.call_seconds("query", 4, 1000, ranks=8) == pytest.approx(0.014)
    # read: 20 ms + 4 x 2 ms + 4,000 B / 1 MB/s
    assert s.call_seconds("read", 4, 1000) == pytest.approx(0.032)
    # write: 30 ms + 4 x 3 ms + 4,000 B / 0.5 MB/s
    assert s.call_seconds("write", 4, 1000) == pytest.approx(0.050)
    # two ranks double the link bytes, not the per-call or per-page part
    assert s.call_seconds("read", 4, 1000, ranks=2) == pytest.approx(0.036)
    assert s.stage_seconds("read", 4, 1000) == pytest.approx(0.028)


def test_generic_path_adds_a_per_rank_memcpy() -> None:
    s = spec(zero_copy=False, copy_gbps=2e-3)  # 2 MB/s memcpy
    # + 4,000 B / 2 MB/s = 2 ms, paid once whatever the ranks (they copy in parallel)
    assert s.call_seconds("read", 4, 1000) == pytest.approx(0.034)
    assert s.call_seconds("read", 4, 1000, ranks=2) == pytest.approx(0.038)
    assert s.call_seconds("query", 4, 1000) == pytest.approx(0.014)  # no copy on a query
    with pytest.raises(ValueError, match="copy_gbps"):
        spec(zero_copy=False)


def test_zero_pages_cost_nothing_and_bad_arguments_raise() -> None:
    s = spec()
    for kind in ("query", "read", "write"):
        assert s.call_seconds(kind, 0, 1000) == 0.0
    with pytest.raises(ValueError, match="unknown storage call kind 'get'"):
        s.call_seconds("get", 1, 1000)
    with pytest.raises(ValueError, match="unknown storage call kind"):
        s.call_seconds("get", 0, 1000)
    with pytest.raises(ValueError, match="ranks"):
        s.call_seconds("read", 1, 1000, ranks=0)
    with pytest.raises(ValueError, match="sources"):
        spec(sources=())
    with pytest.raises(ValueError, match="bandwidths"):
        spec(read_gbps=0.0)


def test_overrides_replace_only_what_is_set() -> None:
    m = get_backend("mooncake")
    assert with_overrides(m) is m
    fast = with_overrides(m, read_gbps=190.0)
    assert (fast.read_gbps, fast.write_gbps) == (190.0, 87.0)
    assert dataclasses.replace(fast, read_gbps=87.0) == m
    with pytest.raises(ValueError, match=">= 0"):
        with_overrides(m, write_gbps=-1.0)


def test_backend_for_a_storage_section() -> None:
    assert backend_for(StorageConfig()) is None  # SGLang's default: no L3
    b = backend_for(StorageConfig(backend="file", read_gbps_override=13.0, write_gbps_override=6.6))
    assert b is not None and (b.name, b.read_gbps, b.write_gbps) == ("file", 13.0, 6.6)
    assert backend_for(StorageConfig(backend="3fs")) == get_backend("3fs")
