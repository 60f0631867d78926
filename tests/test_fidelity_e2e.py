"""The end-to-end fidelity runner (bench/fidelity_e2e.py): its scenarios parse, its probes hit the
tier each row assumes, and its rows are computed from the runs (not typed in)."""

from __future__ import annotations

import copy

import pytest


@pytest.fixture()
def e2e(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
    import fidelity_e2e

    return fidelity_e2e


def test_every_scenario_parses_and_names_its_rows(e2e):
    scs = e2e.load_scenarios()
    assert {sc["id"] for sc in scs} >= {"E2", "E4", "E5", "E6"}
    total = 0
    for sc in scs:
        assert sc["source"] and sc["assumed"], sc["file"]
        for r in sc["rows"]:
            total += 1
            assert r["kind"] in e2e.TARGETS
            assert r["variant"] in sc["variants"]
            assert r.get("over", r["variant"]) in sc["variants"]
            assert r["reference"] > 0
    assert total >= 6  # issue 25: at least six end-to-end rows


def test_probe_hits_the_tier_the_row_assumes(e2e):
    (sc,) = e2e.load_scenarios(["E6"])
    s = e2e.run_variant(sc, "p512")
    assert s["last_host_hit_tokens"] >= 512 - 16
    # the repeat is a host hit: far faster than the cold prompt, which recomputes all of it
    assert s["ttft_last"] < s["ttft_first"]


def test_probe_check_rejects_a_wrong_tier(e2e):
    (sc,) = e2e.load_scenarios(["E6"])
    sc = copy.deepcopy(sc)
    sc["trace"]["expect"] = "storage"  # no L3 in this scenario: the repeat cannot hit storage
    with pytest.raises(RuntimeError, match="should hit storage"):
        e2e.run_variant(sc, "p512")


def test_rows_follow_the_runs(e2e, monkeypatch):
    (sc,) = e2e.load_scenarios(["E6"])
    sc = copy.deepcopy(sc)
    sc["rows"] = [r for r in sc["rows"] if r["variant"] == "p512"]
    fake = {"ttft_first": 0.3, "ttft_last": 0.1}
    monkeypatch.setattr(e2e, "run_variant", lambda sc, name: fake)
    (row,) = e2e.scenario_rows(sc)
    assert row.prediction == pytest.approx(3.0)
    assert row.error == pytest.approx(3.0 / row.reference - 1)


def _passes_scenario(**trace):
    spec = {"kind": "passes", "clients": 4, "requests": 2, "input": 2048, "output": 1, **trace}
    return {
        "id": "T",
        "base": {
            "set": [
                "model.name=llama-3-8b",
                "gpu.device_tokens=20480",
                "cache.page_size=64",
                "cache.hicache_ratio=4",
            ]
        },
        "trace": spec,
        "variants": {"v": {"set": []}},
    }


def test_passes_flush_leaves_the_prompts_in_host(e2e):
    s = e2e.run_variant(_passes_scenario(flush="device"), "v")
    assert s["pass2_hit_share"] >= 0.9  # 2,048-token prompts: all but the last page from host
    # the measured pass loads instead of recomputing: faster than the all-miss warm pass
    assert s["pass2_input_tok_s"] > s["pass1_input_tok_s"]


def test_passes_check_rejects_a_wrong_tier(e2e):
    with pytest.raises(RuntimeError, match="should hit storage"):
        e2e.run_variant(_passes_scenario(flush="device", expect="storage"), "v")
