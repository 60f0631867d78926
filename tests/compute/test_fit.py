"""The shipped coefficients are a fresh fit of the shipped tables, and generalise across models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hicache.compute.fit import EVAL_TOKENS, levenberg_marquardt
from hicache.compute.profile import (
    ComputeProfile,
    compute_from_dict,
    compute_profile_path,
    compute_to_dict,
    load_compute,
    profile_differences,
)
from hicache.compute.tables import read_all_reduce_rows, read_layer_rows

MODELS = (
    "codellama/CodeLlama-34b-Instruct-hf",
    "meta-llama/Llama-2-70b-hf",
    "meta-llama/Llama-2-7b-hf",
    "microsoft/phi-2",
)


def test_json_on_disk_equals_a_fresh_fit(fresh: ComputeProfile) -> None:
    """Regenerate with ``python bench/fit_compute.py`` after changing a table or the fit."""
    on_disk = json.loads(compute_profile_path("h100-sxm").read_text())
    assert profile_differences(on_disk, json.loads(json.dumps(compute_to_dict(fresh)))) == []


def test_the_comparison_can_fail(fresh: ComputeProfile) -> None:
    d = json.loads(json.dumps(compute_to_dict(fresh)))
    d["gemm"]["peak_flops"] *= 1.001
    d["provenance"]["date"] = "1999-01-01"  # ignored
    assert profile_differences(compute_to_dict(fresh), d) == [
        f"gemm.peak_flops: {fresh.gemm.peak_flops!r} != {d['gemm']['peak_flops']!r}"
    ]


@pytest.mark.parametrize("model", MODELS)
def test_leave_one_model_out_median_error_within_10pct(fresh: ComputeProfile, model: str) -> None:
    stats = fresh.provenance["lomo_linear_s_pct"][model]
    assert stats["n"] > 200
    assert stats["median_pct"] <= 10


def test_in_sample_median_error_within_10pct(fresh: ComputeProfile) -> None:
    assert EVAL_TOKENS == (64, 4096)
    assert all(s["median_pct"] <= 10 for s in fresh.provenance["in_sample_linear_s_pct"].values())


def test_levenberg_marquardt_recovers_known_parameters() -> None:
    x = np.linspace(1, 10, 50)
    y = 3.0 * np.exp(-0.4 * x)
    got = levenberg_marquardt(lambda p: p[0] * np.exp(-p[1] * x) - y, [1.0, 1.0])
    assert got == pytest.approx([3.0, 0.4], rel=1e-8)


def test_tables_hold_what_the_readme_says() -> None:
    rows = read_layer_rows()
    assert sorted({r.model for r in rows}) == list(MODELS)
    assert {r.tp for r in rows} == {1, 2, 4, 8}
    assert min(r.tokens for r in rows) == 1 and max(r.tokens for r in rows) == 4096
    phi = [r for r in rows if r.model == "microsoft/phi-2"]
    assert {r.tp for r in phi} == {1} and all(
        "post_attention_layernorm" not in r.op_ms for r in phi
    )
    ar = read_all_reduce_rows()
    assert {r.workers for r in ar} == {2, 4, 8}
    assert min(r.nbytes for r in ar) == 2048 and max(r.nbytes for r in ar) == 64 << 20


def test_load_compute_round_trips(shipped: ComputeProfile) -> None:
    assert compute_from_dict(compute_to_dict(shipped)) == shipped
    assert load_compute() == shipped


def test_unknown_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"no compute profile for GPU 'b200' \(have: h100-sxm\)"):
        load_compute("b200")


def test_bad_profile_keys_are_named(shipped: ComputeProfile) -> None:
    d = compute_to_dict(shipped)
    d["gemm"]["mfu"] = 0.5
    with pytest.raises(ValueError, match=r"gemm: unknown keys \['mfu'\], missing keys \[\]"):
        compute_from_dict(d)
    d = compute_to_dict(shipped) | {"version": 2}
    with pytest.raises(ValueError, match="version 2, this build reads 1"):
        compute_from_dict(d)
