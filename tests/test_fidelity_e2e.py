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
    assert {sc["id"] for sc in scs} >= {"E2", "E3", "E4", "E5", "E6"}
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


def _rounds_scenario(gap_s: float) -> dict:
    spec = {"kind": "rounds", "sessions": 2, "prompts": [1024, 3072, 5120], "answer": 1024,
            "new": 1024, "gap_s": gap_s}  # fmt: skip
    return {
        "id": "T",
        "base": {
            "set": [
                "model.name=llama-3-8b",
                "gpu.device_tokens=65536",
                "cache.page_size=64",
                "pd.enabled=true",
                "workload.output_reuse=next_turn",
            ]
        },
        "trace": spec,
        "variants": {"off": {"set": []}, "on": {"set": ["pd.decode_radix_cache=true"]}},
    }


def test_rounds_trace_grows_by_answer_and_new_tokens(e2e):
    tr = e2e.rounds_trace(_rounds_scenario(60.0)["trace"])
    assert [r.input_length for r in tr.requests] == [1024, 1024, 3072, 3072, 5120, 5120]
    assert [r.timestamp for r in tr.requests[::2]] == [0.0, 60_000.0, 120_000.0]
    # a session's rounds extend each other (the answer's blocks are the next prompt's)
    a, b = tr.requests[0], tr.requests[2]
    assert b.hash_ids[: len(a.hash_ids)] == a.hash_ids
    bad = {**_rounds_scenario(60.0)["trace"], "prompts": [1024, 2048]}
    with pytest.raises(ValueError, match="not new"):
        e2e.rounds_trace(bad)


def test_rounds_decode_cache_holds_prompt_and_answer(e2e):
    """With the decode radix cache the prefill server sends only each round's new tokens: the
    decode side holds the previous prompt and its answer (output_reuse = next_turn)."""
    s = e2e.run_variant(_rounds_scenario(60.0), "on")
    dec = s["roles"]["decode"]
    # round 2 holds round 1's prompt and answer but the last token, whose KV is never computed
    # (1,024 + 1,024 - 1 = 2,047 tokens: 31 full pages, 1,984 tokens); round 3: 4,095 -> 4,032;
    # for both sessions
    assert dec["decode_prefix_tokens"] == 2 * (1984 + 4032)


def test_rounds_barrier_is_checked(e2e):
    with pytest.raises(SystemExit, match="had not finished"):
        e2e.run_variant(_rounds_scenario(0.001), "off")
