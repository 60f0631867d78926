"""Calibration: the fit recovers known constants from synthetic measurements (within 2 %), eta
from both-at-once rows, and the profile it writes is one ``sim`` can load and use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hicache.latency import load_profile, save_profile
from replay.bench import _DEFAULTS, COLUMNS
from replay.bench_compute import gemm_label, parse_gemm_label
from replay.calibrate import calibrate, fit_eta, fit_link, predict_ops

MiB = 1 << 20
LAYER_PAGE = 64 * 4096  # Llama-3-8B, 64-token page, one layer


def _truth(backend: str, direction: str) -> dict[str, float]:
    """Known constants of a synthetic machine (direct pays per run, kernel does not)."""
    base = {"d2h": (6e-6, 52e9), "h2d": (4e-6, 47e9)}[direction]
    if backend == "kernel":
        return {"alpha": 25e-6 + base[0], "gamma": 0.0, "beta": 0.8 * base[1]}
    return {"alpha": base[0], "gamma": 2.5e-6, "beta": base[1]}


def synthetic_bench(noise: float = 0.005, seed: int = 0, eta: float = 0.8) -> pd.DataFrame:
    """A bench table drawn from :func:`_truth` with multiplicative Gaussian noise."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []

    def add(durations: list[float], **cols: Any) -> None:
        # the bench's own defaults, pinned host memory as on a GPU
        base = {**_DEFAULTS, "host_memory": "pinned"}
        base.update(cols)
        for i, d in enumerate(durations):
            rows.append({**base, "repeat": i, "duration_s": d * (1 + rng.normal(0, noise))})

    for d in ("d2h", "h2d"):
        t = _truth("direct", d)
        for size in (4096 * 4**k for k in range(9)):
            alone = t["alpha"] + size / t["beta"]
            add([alone] * 3, kind="plain", direction=d, bytes=size)
            if size >= MiB:
                add(
                    [t["alpha"] + size / (t["beta"] * eta)] * 3,
                    kind="bidir",
                    direction=d,
                    bytes=size,
                )
        for b in ("direct", "kernel"):
            t = _truth(b, d)
            for layers in (1, 32):
                for n in (1, 4, 16, 64, 256):
                    if n * layers > 1024:
                        continue
                    for r in (0, 1, 4, 16):
                        runs = 1 if not r or r >= n else -(-n // r)
                        na = 1 if d == "d2h" else layers
                        ng = runs * layers
                        nbytes = n * layers * LAYER_PAGE
                        sec = na * t["alpha"] + ng * t["gamma"] + nbytes / t["beta"]
                        add(
                            [sec] * 3,
                            kind="op",
                            backend=b,
                            direction=d,
                            layout="layer_first" if b == "direct" else "page_first",
                            bytes=nbytes,
                            pages=n,
                            run_pages=r,
                            runs=runs,
                            layers=layers,
                            n_alpha=na,
                            n_gamma=ng,
                        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


@pytest.mark.parametrize(
    ("alpha", "gamma", "beta"),
    [(5e-6, 2e-6, 25e9), (3e-6, 2.5e-6, 53e9), (12e-6, 8e-6, 12.5e9), (2e-5, 1e-6, 375e9)],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_fit_recovers_known_parameters_within_2_percent(
    alpha: float, gamma: float, beta: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    na, ng, nb, t = [], [], [], []
    for layers in (1, 8, 32):
        for n in (1, 4, 16, 64, 256):
            for runs in {1, max(1, n // 16), max(1, n // 4), n}:
                for a in (1, layers):
                    b = n * layers * LAYER_PAGE
                    sec = a * alpha + runs * layers * gamma + b / beta
                    na.append(a)
                    ng.append(runs * layers)
                    nb.append(b)
                    t.append(sec * (1 + rng.normal(0, 0.005)))
    fit = fit_link(na, ng, nb, t)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.02)
    assert fit.gamma_s == pytest.approx(gamma, rel=0.02)
    assert fit.beta_Bps == pytest.approx(beta, rel=0.02)
    assert fit.median_rel_err < 0.01 and fit.pinned == ()


def test_fit_pins_a_negative_gamma_to_zero() -> None:
    rng = np.random.default_rng(3)
    runs = rng.integers(1, 64, 80)
    nbytes = rng.integers(1, 1024, 80) * LAYER_PAGE
    t = (30e-6 + nbytes / 40e9) * (1 + rng.normal(0, 0.01, 80))
    fit = fit_link(np.ones(80), runs, nbytes, t)
    assert fit.gamma_s >= 0 and fit.alpha_s == pytest.approx(30e-6, rel=0.1)
    assert fit.beta_Bps == pytest.approx(40e9, rel=0.02)


def test_fit_drops_gamma_when_it_cannot_be_told_from_alpha() -> None:
    nbytes = np.array([1, 4, 16, 64]) * MiB
    t = 5e-6 + nbytes / 50e9
    fit = fit_link(np.ones(4), np.ones(4), nbytes, t)  # every op: one run per alpha
    assert fit.pinned == ("gamma",) and fit.alpha_s == pytest.approx(5e-6)


def test_fit_errors() -> None:
    with pytest.raises(ValueError, match="no measurements"):
        fit_link([], [], [], [])
    with pytest.raises(ValueError, match="several sizes"):
        fit_link([1, 1], [0, 0], [MiB, MiB], [1e-3, 2e-3])
    with pytest.raises(ValueError, match="bandwidth"):  # bigger copies faster: no bandwidth
        fit_link([1, 1], [0, 0], [MiB, 2 * MiB], [2e-3, 1e-3])
    with pytest.raises(ValueError, match="> 0"):
        fit_link([1], [0], [MiB], [0.0])


def test_eta_from_both_directions_at_once() -> None:
    df = synthetic_bench(noise=0.002, eta=0.7)
    for d in ("d2h", "h2d"):
        eta, how = fit_eta(df, d)
        assert eta == pytest.approx(0.7, rel=0.02) and "median" in how
    no_bidir = df[df.kind != "bidir"]
    assert fit_eta(no_bidir, "d2h") == (1.0, "not measured (no both-directions rows); 1.0")


def _meta(device: str) -> dict[str, Any]:
    return {
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {
            "device": device,
            "gpu_name": "NVIDIA H200" if device == "cuda" else "none (CPU tensors)",
            "torch": "2.13.0",
            "cuda": "12.8",
            "driver": "570.00",
        },
    }


def test_calibrate_recovers_every_backend_and_direction() -> None:
    df = synthetic_bench()
    cal = calibrate(df, _meta("cpu"), gpu="h100-sxm", link="pcie5-x16")
    prof = cal.profile
    for b in ("direct", "kernel"):
        for d in ("d2h", "h2d"):
            t = _truth(b, d)
            p = prof.link(b, d)
            assert p.alpha_s == pytest.approx(t["alpha"], rel=0.02)
            assert p.beta_Bps == pytest.approx(t["beta"], rel=0.02)
            if t["gamma"]:
                assert p.gamma_s == pytest.approx(t["gamma"], rel=0.02)
            else:
                assert p.gamma_s < 0.02 * 2.5e-6
            assert p.eta == pytest.approx(0.8, rel=0.02)
            assert cal.fits[b][d].median_rel_err < 0.01
    ops = df[df.kind == "op"]
    err = np.abs(predict_ops(prof, ops) - ops.duration_s) / ops.duration_s
    assert float(np.median(err)) < 0.01


def test_cpu_profiles_are_marked_unmeasured(tmp_path: Path) -> None:
    cal = calibrate(synthetic_bench(), _meta("cpu"), gpu="h100-sxm", link="pcie5-x16")
    prov = cal.profile.provenance
    assert cal.profile.measured is False
    assert "NOT A GPU MEASUREMENT" in prov["notes"]
    assert all(isinstance(v, str) for v in prov.values())
    for key in ("source", "date", "machine_torch", "sizes", "eta", "compute", "fit_direct_d2h"):
        assert prov[key], key
    path = tmp_path / "p.json"
    save_profile(cal.profile, path)
    loaded = load_profile(path, "h100-sxm", "pcie5-x16")
    assert loaded.link("direct", "h2d") == cal.profile.link("direct", "h2d")
    assert loaded.measured is False


def _gemm_row(label: str, seconds: float, repeat: int = 0) -> dict[str, object]:
    return {
        **{c: 0 for c in COLUMNS},
        "kind": "gemm",
        "backend": "gemm",
        "layout": label,
        "duration_s": seconds,
        "repeat": repeat,
    }


def test_cuda_profiles_are_measured_and_fit_compute() -> None:
    from hicache.forward import compute_models_for
    from hicache.hardware import get_gpu

    gemm, _, _ = compute_models_for(get_gpu("h200"))
    predicted = gemm.time(4096, 4096, 4096)
    extra = pd.DataFrame(
        [
            _gemm_row(gemm_label("x", 4096, 4096, 4096), 1.25 * predicted),
            {
                **{c: 0 for c in COLUMNS},
                "kind": "hbm",
                "backend": "hbm",
                "bytes": 2 << 30,
                "duration_s": (2 << 30) / 4.0e12,
            },
        ]
    )
    cal = calibrate(
        pd.concat([synthetic_bench(), extra], ignore_index=True),
        _meta("cuda"),
        gpu="h200",
        link="pcie5-x16",
    )
    assert cal.profile.measured is True
    assert cal.profile.gemm_scale == pytest.approx(1.25, rel=1e-9)
    assert cal.profile.decode_hbm_efficiency == pytest.approx(4.0 / 4.8, rel=1e-6)
    assert "gemm_scale 1.250" in cal.profile.provenance["compute"]
    assert cal.profile.provenance["machine_gpu_name"] == "NVIDIA H200"


def test_gemm_scale_weighs_a_layer_s_gemms_by_their_time() -> None:
    """gemm_scale is a layer's measured GEMM time over its predicted time (medians per shape),
    so the big MLP GEMM weighs in as it does in a layer; rows without a shape leave the
    base profile's value."""
    from hicache.forward import compute_models_for
    from hicache.hardware import get_gpu

    gemm, _, _ = compute_models_for(get_gpu("h200"))
    big, small = (4096, 28672, 4096), (4096, 4096, 4096)
    rows = [
        _gemm_row(gemm_label("gate_up", *big), f * gemm.time(*big), r)
        for r, f in enumerate((1.0, 1.1, 1.2))
    ] + [_gemm_row(gemm_label("o", *small), 2.0 * gemm.time(*small), r) for r in range(3)]
    cal = calibrate(
        pd.concat([synthetic_bench(), pd.DataFrame(rows)], ignore_index=True),
        _meta("cuda"),
        gpu="h200",
        link="pcie5-x16",
    )
    want = (1.1 * gemm.time(*big) + 2.0 * gemm.time(*small)) / (gemm.time(*big) + gemm.time(*small))
    assert cal.profile.gemm_scale == pytest.approx(want, rel=1e-9)
    assert parse_gemm_label(gemm_label("qkv", 7, 9, 11)) == (7, 9, 11)
    assert parse_gemm_label("qkv") is None
    unshaped = pd.DataFrame([_gemm_row("qkv", 1.0)])
    cal = calibrate(
        pd.concat([synthetic_bench(), unshaped], ignore_index=True),
        _meta("cuda"),
        gpu="h200",
        link="pcie5-x16",
    )
    assert cal.profile.gemm_scale == 1.0


def test_replay_ops_join_the_fit() -> None:
    df = synthetic_bench()
    t = _truth("direct", "h2d")
    rp = pd.DataFrame(
        {
            "backend": ["direct"] * 3,
            "direction": ["h2d"] * 3,
            "layout": ["layer_first"] * 3,
            "bytes": [MiB * 32, MiB * 64, MiB * 96],
            "n_alpha": [32] * 3,
            "n_gamma": [64, 32, 96],
        }
    )
    rp["duration_s"] = rp.n_alpha * t["alpha"] + rp.n_gamma * t["gamma"] + rp["bytes"] / t["beta"]
    alone = calibrate(df, _meta("cpu"), gpu="h100-sxm", link="pcie5-x16")
    cal = calibrate(df, _meta("cpu"), gpu="h100-sxm", link="pcie5-x16", replay=rp)
    assert cal.profile.provenance["replay_ops"] == "3"
    assert cal.fits["direct"]["h2d"].n == alone.fits["direct"]["h2d"].n + 3
    assert cal.fits["direct"]["d2h"].n == alone.fits["direct"]["d2h"].n


def test_missing_backend_is_an_error() -> None:
    df = synthetic_bench()
    with pytest.raises(ValueError, match="no kernel d2h"):
        calibrate(df[df.backend != "kernel"], _meta("cpu"), gpu="h100-sxm", link="pcie5-x16")
