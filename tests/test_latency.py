"""Transfer and compute models, layer pipeline and profiles (`hicache.latency`)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hicache.hardware import GPUS, get_gpu
from hicache.latency import (
    BACKENDS,
    DIRECTIONS,
    LinkParams,
    Profile,
    default_profile_path,
    layer_pipeline_end,
    load_profile,
    op_charges,
    op_time,
    profile_from_dict,
    profile_to_dict,
    profile_to_json,
    save_profile,
    shipped_profiles,
    transfer_time,
)

H100 = get_gpu("h100-sxm")


@pytest.fixture
def h100() -> Profile:
    return load_profile(None, "h100-sxm", "pcie5-x16")


# --- transfers ---------------------------------------------------------------------------------


def test_transfer_time_closed_form() -> None:
    p = LinkParams(alpha_s=3e-6, beta_Bps=50e9, gamma_s=2.5e-6, eta=0.8)
    mib = 2**20
    assert transfer_time(p, mib) == pytest.approx(3e-6 + 2.5e-6 + mib / 50e9)
    assert transfer_time(p, mib, runs=16) == pytest.approx(3e-6 + 16 * 2.5e-6 + mib / 50e9)
    assert transfer_time(p, mib, coupled=True) == pytest.approx(3e-6 + 2.5e-6 + mib / 40e9)
    assert transfer_time(p, 0, runs=0) == pytest.approx(3e-6)
    with pytest.raises(ValueError, match=r"nbytes"):
        transfer_time(p, -1)
    with pytest.raises(ValueError, match=r"runs"):
        transfer_time(p, 1, runs=-1)


@pytest.mark.parametrize(
    ("size", "gbps"),
    [(4 * 1024, 1.3), (16 * 1024, 5.0), (64 * 1024, 15.5), (2**20, 46), (16 * 2**20, 52.5)],
)
def test_c3_small_copy_curve(size: int, gbps: float) -> None:
    # HARDWARE.md C3 [model]: t(s) = 3 us + s / 53 GB/s and the effective bandwidths it gives
    p = LinkParams(alpha_s=3e-6, beta_Bps=53e9)
    assert size / transfer_time(p, size, runs=0) / 1e9 == pytest.approx(gbps, rel=0.05)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha_s": -1.0, "beta_Bps": 1.0},
        {"alpha_s": 0.0, "beta_Bps": 0.0},
        {"alpha_s": 0.0, "beta_Bps": 1.0, "gamma_s": -1.0},
        {"alpha_s": 0.0, "beta_Bps": 1.0, "eta": 0.0},
        {"alpha_s": 0.0, "beta_Bps": 1.0, "eta": 1.5},
        {"alpha_s": float("nan"), "beta_Bps": 1.0},
    ],
)
def test_link_params_reject_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LinkParams(**kwargs)


def test_direct_backend_pays_per_copy_and_kernel_does_not(h100: Profile) -> None:
    """Fragmentation costs the direct backend a copy per run (layer_first) or per page
    (page_first_direct), and costs a kernel load nothing (one gather per layer)."""
    nbytes, pages, layers = 64 * 2**20, 512, 32
    loads = {
        (b, lay, runs): op_time(
            h100.link(b, "h2d"),
            op_charges(
                "load", nbytes, runs, layers, backend=b, layout=lay, pages=pages, kv_parts=2
            ),
        )
        for b, lay in (
            ("kernel", "page_first"),
            ("direct", "layer_first"),
            ("direct", "page_first_direct"),
        )
        for runs in (1, pages)
    }
    assert loads["kernel", "page_first", 1] == loads["kernel", "page_first", pages]
    assert loads["direct", "layer_first", 1] < loads["direct", "layer_first", pages]
    # page_first_direct never merges pages: as slow as layer_first with nothing contiguous
    assert loads["direct", "page_first_direct", 1] == loads["direct", "layer_first", pages]
    assert loads["kernel", "page_first", pages] < loads["direct", "layer_first", pages]


# --- profiles ----------------------------------------------------------------------------------


def test_every_gpu_has_a_shipped_default_for_its_link() -> None:
    for g in GPUS.values():
        p = load_profile(default_profile_path(g.name, g.default_link), g.name, g.default_link)
        assert (p.gpu, p.link_name) == (g.name, g.default_link)
        assert p.measured is False
        assert "not measured" in p.provenance["source"]
        for b in BACKENDS:
            for d in DIRECTIONS:
                assert p.link(b, d).beta_Bps > 0
    defaults = [s for s in shipped_profiles() if not s.endswith("-measured")]
    assert len(defaults) == len(GPUS)


def test_a_measured_profile_replaces_the_estimate_for_its_gpu_and_link(
    h100: Profile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a GPU run's profile is committed as ``<gpu>-measured.json``, runs on that GPU and
    link use it without naming it; other links keep the estimate."""
    import dataclasses

    import hicache.profile as lat

    monkeypatch.setattr(lat, "PROFILE_DIR", tmp_path)
    save_profile(h100, tmp_path / "h100-sxm-pcie5-x16-default.json")
    assert load_profile(None, "h100-sxm", "pcie5-x16") == h100  # only the estimate
    measured = dataclasses.replace(h100, measured=True, gemm_scale=1.07)
    save_profile(measured, tmp_path / "h100-sxm-measured.json")
    assert lat.shipped_profile_path("h100-sxm", "pcie5-x16").name == "h100-sxm-measured.json"
    assert load_profile(None, "h100-sxm", "pcie5-x16") == measured
    assert shipped_profiles() == ["h100-sxm-measured", "h100-sxm-pcie5-x16"]
    # measured over another link: not a what-if for this one
    assert lat.shipped_profile_path("h100-sxm", "pcie4-x16").name.endswith("-default.json")
    # a broken measured file is reported, not silently skipped
    (tmp_path / "h100-sxm-measured.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"h100-sxm-measured\.json:1: invalid JSON"):
        load_profile(None, "h100-sxm", "pcie5-x16")


def test_shipped_pcie5_values(h100: Profile) -> None:
    assert h100.link("direct", "d2h") == LinkParams(3e-6, 53e9, 2.5e-6, 0.8)
    assert h100.link("direct", "h2d").beta_Bps == 50e9
    assert h100.link("kernel", "h2d").gamma_s == 5e-7  # per batched-copy descriptor (C3)
    assert (h100.gemm_scale, h100.decode_hbm_efficiency) == (1.0, 0.8)
    assert (h100.prefill_forward_s, h100.decode_forward_s) == (1.5e-3, 2e-4)
    assert (h100.request_s, h100.sampling_s, h100.hicache_check_s) == (1e-4, 1e-4, 1.5e-4)


def test_profile_round_trip(h100: Profile, tmp_path: Path) -> None:
    assert pickle.loads(pickle.dumps(h100)) == h100
    assert profile_from_dict(profile_to_dict(h100)) == h100
    assert profile_from_dict(json.loads(profile_to_json(h100))) == h100
    out = tmp_path / "sub" / "p.json"
    save_profile(h100, out)
    assert load_profile(out, "h100-sxm", "pcie5-x16") == h100
    assert [p.name for p in out.parent.iterdir()] == ["p.json"]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    # the shipped file is exactly what profile_to_json writes
    shipped = default_profile_path("h100-sxm", "pcie5-x16").read_text(encoding="utf-8")
    assert shipped == profile_to_json(h100)


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d.update(colour="red"), "colour: unknown key"),
        (lambda d: d["links"]["kernel"]["d2h"].update(alhpa_s=1), "links.kernel.d2h.alhpa_s"),
        (lambda d: d["links"].update(rdma={}), "links.rdma: unknown key"),
        (lambda d: d["links"]["direct"].update(both={}), "links.direct.both: unknown key"),
        (lambda d: d["compute"].update(mfu=0.5), "compute.mfu: unknown key"),
        (lambda d: d["compute"].pop("gemm_scale"), "compute.gemm_scale: missing"),
        (lambda d: d["links"]["direct"]["h2d"].pop("eta"), "links.direct.h2d.eta: missing"),
        (lambda d: d["compute"].update(gemm_scale=0), "compute.gemm_scale must be in"),
        (lambda d: d["compute"].update(request_s=-1), "compute.request_s must be >= 0"),
        (lambda d: d["compute"].update(sampling_s="x"), "compute.sampling_s: expected a finite"),
        (lambda d: d["links"]["kernel"]["h2d"].update(eta=2), "links.kernel.h2d.eta must be"),
        (lambda d: d.update(version=3), "version: unsupported"),
        (lambda d: d.update(measured="no"), "measured"),
        (lambda d: d["provenance"].pop("source"), "provenance.source: missing"),
    ],
)
def test_profile_errors_name_the_file_and_key(
    h100: Profile, tmp_path: Path, edit: Any, key: str
) -> None:
    data = profile_to_dict(h100)
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(ValueError, match=r"prof.json") as e:
        load_profile(path, "h100-sxm", "pcie5-x16")
    assert key in str(e.value)


def test_a_version_1_profile_is_converted_on_read(h100: Profile, tmp_path: Path) -> None:
    """Profiles written before the operator model (version 1: a roofline at a guessed MFU)
    still load: their links as they were, their overheads as the per-pass ones, the rest from
    the tables; the provenance says so."""
    data = profile_to_dict(h100)
    data["version"] = 1
    data["compute"] = {
        "mfu": 0.5,
        "prefill_overhead_s": 0.002,
        "attn_efficiency": 1.0,
        "decode_hbm_efficiency": 0.7,
        "decode_overhead_s": 0.003,
    }
    got = load_profile(_write(tmp_path, data), "h100-sxm", "pcie5-x16")
    assert got.links == h100.links
    assert (got.gemm_scale, got.decode_hbm_efficiency) == (1.0, 0.7)
    # the old per-batch overheads stood in for launches the operator model now charges per op:
    # the shipped default's overheads replace them
    for key in ("prefill_forward_s", "decode_forward_s", "request_s", "sampling_s",
                "hicache_check_s"):  # fmt: skip
        assert getattr(got, key) == getattr(h100, key), key
    assert "version-1" in got.provenance["converted"]
    data["gpu"] = "b200"  # no shipped default: the overheads are 0
    got = load_profile(_write(tmp_path, data), "b200", "pcie5-x16")
    assert (got.prefill_forward_s, got.decode_forward_s, got.request_s) == (0.0, 0.0, 0.0)
    data["compute"]["gemm_scale"] = 1.0  # a version-1 file with version-2 keys is an error
    with pytest.raises(ValueError, match=r"compute.gemm_scale: unknown key"):
        load_profile(_write(tmp_path, data), "h100-sxm", "pcie5-x16")


def test_profile_file_problems(h100: Profile, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing.json: cannot read"):
        load_profile(tmp_path / "missing.json", "h100-sxm", "pcie5-x16")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.json:2: invalid JSON"):
        load_profile(bad, "h100-sxm", "pcie5-x16")
    path = _write(tmp_path, profile_to_dict(h100))
    with pytest.raises(ValueError, match=r"gpu: profile is for 'h100-sxm', the run uses 'h200'"):
        load_profile(path, "h200", "pcie5-x16")
    with pytest.raises(ValueError, match=r"no shipped default.*h100-sxm-pcie5-x16"):
        load_profile(None, "h100-sxm", "pcie4-x16")
    with pytest.raises(ValueError, match=r"unknown io backend 'rdma'"):
        h100.link("rdma", "h2d")
    with pytest.raises(ValueError, match=r"unknown direction"):
        h100.link("kernel", "up")


# --- layer pipeline ----------------------------------------------------------------------------


def _pipeline_loop(start: float, total: float, n: int, ls: float, le: float) -> float:
    c, f = total / n, start
    for i in range(1, n + 1):
        f = max(f, ls + i * (le - ls) / n) + c
    return f


def test_layer_pipeline_cases() -> None:
    # load done long before: compute alone
    assert layer_pipeline_end(10.0, 3.2, 32, 0.0, 1.0) == pytest.approx(13.2)
    # load much slower than compute: ends one layer after the load
    assert layer_pipeline_end(0.0, 3.2, 32, 0.0, 100.0) == pytest.approx(100.1)
    # load starting with the batch and as fast as compute: one layer's load is exposed
    assert layer_pipeline_end(0.0, 3.2, 32, 0.0, 3.2) == pytest.approx(3.3)
    for bad in [(0.0, 1.0, 0, 0.0, 1.0), (0.0, -1.0, 4, 0.0, 1.0), (0.0, 1.0, 4, 2.0, 1.0)]:
        with pytest.raises(ValueError):
            layer_pipeline_end(*bad)


finite = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)


@given(
    start=finite,
    total=finite,
    n=st.integers(1, 128),
    ls=finite,
    dur=finite,
)
def test_layer_pipeline_matches_the_layer_loop(
    start: float, total: float, n: int, ls: float, dur: float
) -> None:
    got = layer_pipeline_end(start, total, n, ls, ls + dur)
    assert got == pytest.approx(_pipeline_loop(start, total, n, ls, ls + dur), rel=1e-9, abs=1e-9)
    assert got >= start + total - 1e-9 and got >= ls + dur
