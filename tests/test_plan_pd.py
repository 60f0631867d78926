"""``hicache-sim plan --pd`` (issue 28): the 2-D search against brute force (on random
monotone staircases, and on every cell of a small P x D grid of real PD runs), the
like-for-like rule for decode-side HiCache, the per-role sizes against what a PD run
resolves, goodput on PD request rows, and the command end to end on a tiny trace."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from hicache.config import load_config
from studies.plan import Target
from studies.plan.evaluate import pd_request_times, simulate
from studies.plan.pd import (
    DEFAULT_PD_VARIANTS,
    PdConfigPlan,
    PdPlan,
    build_pd_configs,
    run_pd_plan,
)
from studies.plan.pd_savings import like_for_like_pd, pd_savings_lines
from studies.plan.pd_search import PdEvaluation, find_cheapest_split, pd_trend_notes
from studies.plan.targets import Variant, parse_variant
from traces.io import read_trace

BASE = ["model.name=llama-3-8b", "gpu.name=h100-sxm", "cache.page_size=64", "pd.enabled=true",
        "pd.decode_set=gpu.device_tokens=40000"]  # fmt: skip
X = [Target("x", 0.5)]  # a synthetic target: 0 passes, 1 fails


def _trace(tmp_path: Path, n: int = 80, gap_ms: int = 100, prompt: int = 6000, out: int = 150,
           sessions: int = 0) -> Any:  # fmt: skip
    """``n`` requests ``gap_ms`` apart; with ``sessions``, request i is turn i // sessions of
    session i % sessions (its prompt grows by a 512-token block a turn and shares the turn
    before as a prefix), else every prompt is distinct."""
    lines = []
    for i in range(n):
        sess, turn = (i % sessions, i // sessions) if sessions else (i, 0)
        length = prompt + 512 * turn
        ids = list(range(sess * 1000, sess * 1000 + -(-length // 512)))
        lines.append(json.dumps({"timestamp": i * gap_ms, "input_length": length,
                                 "output_length": out, "hash_ids": ids}))  # fmt: skip
    path = tmp_path / "pd.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return read_trace(path)


# --- the search ------------------------------------------------------------------------------


def _staircase(rng: random.Random, mp: int, md: int) -> Any:
    """A random up-set of [1, mp] x [1, md]: passes iff P >= p_min and D >= f(P), f
    non-increasing (possibly empty: p_min > mp or f > md)."""
    f, cur = [], rng.randint(1, md + 2)
    for _ in range(mp):
        cur = max(1, cur - rng.choice([0, 0, 1, 2, 3]))
        f.append(cur)
    p_min = rng.randint(1, mp + 1)
    return lambda p: p[0] >= p_min and p[1] >= f[p[0] - 1]


def test_search_is_the_brute_force_minimum_on_monotone_staircases() -> None:
    """On 2,000 random monotone pass regions with random GPUs per instance, the search's
    answer costs what the cheapest passing cell of the whole box costs, passes, no split is
    evaluated twice, nothing contradicts monotonicity, and on the larger boxes it evaluates
    well under every cell."""
    rng = random.Random(28)
    fewer = 0
    for _ in range(2000):
        mp, md, wp, wd = (
            rng.randint(1, 12),
            rng.randint(1, 12),
            rng.randint(1, 4),
            rng.randint(1, 4),
        )
        passes = _staircase(rng, mp, md)
        calls: list[tuple[int, int]] = []

        def evaluate(
            p: tuple[int, int], calls: list[Any] = calls, passes: Any = passes
        ) -> dict[str, float]:
            calls.append(p)
            return {"x": 0.0 if passes(p) else 1.0}

        s = find_cheapest_split(evaluate, X, mp, md, wp, wd)
        cells = [(p, d) for p in range(1, mp + 1) for d in range(1, md + 1)]
        cheapest = min((p * wp + d * wd for p, d in cells if passes((p, d))), default=None)
        assert len(calls) == len(set(calls))
        assert s.monotone
        if cheapest is None:
            assert s.answer is None
            continue
        assert s.answer is not None and passes(s.answer)
        assert s.answer[0] * wp + s.answer[1] * wd == cheapest
        assert s.evaluations[s.answer].passed
        fewer += mp * md >= 64 and len(calls) < mp * md / 2
    assert fewer > 100


def test_search_flags_data_that_contradict_monotonicity() -> None:
    """Passing from 2:3 on, except the largest split 4:4: the decode bound never passes at
    4 prefill servers, yet 2:4 passed. The search says the data contradict its assumption
    and answers with the cheapest split it saw pass."""

    def evaluate(p: tuple[int, int]) -> dict[str, float]:
        return {"x": 0.0 if p[0] >= 2 and p[1] >= 3 and p != (4, 4) else 1.0}

    s = find_cheapest_split(evaluate, X, 4, 4)
    assert not s.evaluations[(4, 4)].passed and s.evaluations[(2, 4)].passed
    assert not s.monotone and s.answer == (2, 4)


def test_trend_notes_name_the_role_and_the_splits() -> None:
    t = Target("tpot_p90_s", 0.05)
    ev = {
        (1, 4): PdEvaluation(1, 4, True, "", {"tpot_p90_s": 0.010}),
        (2, 4): PdEvaluation(2, 4, True, "", {"tpot_p90_s": 0.012}),  # rises with P: noted
        (4, 4): PdEvaluation(4, 4, True, "", {"tpot_p90_s": 0.0121}),
        (4, 1): PdEvaluation(4, 1, False, "", {"tpot_p90_s": 0.001, "overloaded": True}),
        (4, 2): PdEvaluation(4, 2, True, "", {"tpot_p90_s": 0.013}),  # overloaded 4:1 skipped
    }
    notes = pd_trend_notes(ev, [t])
    assert notes == [
        "tpot_p90_s rises with more prefill servers: 10 ms at 1:4, 12 ms at 2:4 (prefill:decode)"
    ]


# --- real PD runs ----------------------------------------------------------------------------


def test_plan_on_a_small_pd_workload_is_the_cheapest_cell_of_the_grid(tmp_path: Path) -> None:
    """Every cell of the 4 x 4 box run (the plan's own evaluation, studies.plan.evaluate):
    the verdicts are monotone in each role (the search's assumption, checked here), and the
    plan's answer is the cheapest passing cell; the targets make both roles matter (the answer
    is neither 1:1 nor 4:4, and TTFT alone needs fewer decode servers than TPOT too)."""
    trace = _trace(tmp_path)
    (cfg,) = build_pd_configs(load_config(None, BASE), trace, DEFAULT_PD_VARIANTS[:1])
    targets = [Target("ttft_p90_s", 0.5), Target("tpot_p90_s", 0.0079)]
    grid = {(p, d): simulate(cfg.config, (p, d), trace) for p in range(1, 5) for d in range(1, 5)}
    from studies.plan.search import judge

    ok = {p: judge(s, targets).passed for p, s in grid.items()}
    for (p, d), passed in ok.items():
        for q, e in ((p + 1, d), (p, d + 1)):
            assert not passed or ok.get((q, e), True), f"not monotone at {p}:{d}"
    cheapest = min((p for p in ok if ok[p]), key=lambda p: (p[0] + p[1], p[0]))
    ttft_only = min((p for p, s in grid.items() if judge(s, targets[:1]).passed),
                    key=lambda p: (p[0] + p[1], p[0]))  # fmt: skip
    assert cheapest not in ((1, 1), (4, 4)) and ttft_only[1] < cheapest[1]

    plan = run_pd_plan([cfg], trace, targets, 4, jobs=1, progress=False)
    (c,) = plan.configs
    assert c.split == cheapest and c.gpus == sum(cheapest) and c.monotone
    assert c.chosen is not None and c.chosen["ttft_p90_s"] == grid[cheapest]["ttft_p90_s"]
    assert len(c.evaluations) < len(grid)
    assert c.servers == (1, 1)  # 8 TP1 instances per DGX H100
    row = plan.rows()[0]
    assert (row["prefill_instances"], row["decode_instances"]) == cheapest
    assert row["decode_host_dram_gb_per_instance"] == 0  # no decode radix cache: no host tier


def test_role_sizes_are_what_the_pd_run_resolves(tmp_path: Path) -> None:
    """Per role, device and host pools of each default variant as the PD run's config.json
    has them (the decode host tier only with the radix cache and cache.enable_host); a
    variant's pd.decode_set adds to the base's (gpu.device_tokens stays)."""
    from sim.engine import run_simulation

    trace = _trace(tmp_path, n=4)
    configs = build_pd_configs(load_config(None, BASE), trace)
    assert [c.variant for c in configs] == [v.name for v in DEFAULT_PD_VARIANTS]
    for c in configs:
        out = tmp_path / c.variant.replace(" ", "_")
        from hicache.config import config_from_dict

        run_simulation(config_from_dict(c.config), trace, out)
        roles = json.loads((out / "config.json").read_text())["roles"]
        for role in (c.prefill, c.decode):
            assert roles[role.role]["device_tokens"] == role.device_tokens
            assert roles[role.role]["host_tokens"] == role.host_tokens
        assert c.decode.device_tokens == 40000
    assert [c.decode.host_tokens > 0 for c in configs] == [False, False, True]
    assert configs[2].decode.host_dram_gb == pytest.approx(
        configs[2].decode.host_tokens * configs[2].decode.kv_bytes_per_token / 1e9
    )


def test_goodput_on_pd_rows_uses_the_summary_definitions(tmp_path: Path) -> None:
    """PD request rows give per-request TTFT and TPOT whose means are the summary's."""
    from sim.engine import run_simulation

    frames: dict[str, Any] = {}
    s = run_simulation(load_config(None, BASE), _trace(tmp_path, n=30), frames_out=frames)
    t = pd_request_times(frames["requests"])
    assert t["ttft_s"].mean() == pytest.approx(s["ttft_mean_s"], rel=1e-12)
    assert t["tpot_s"].mean() == pytest.approx(s["tpot_mean_s"], rel=1e-12)


def test_seeds_compose(tmp_path: Path) -> None:
    trace = _trace(tmp_path, n=30, gap_ms=300)
    (cfg,) = build_pd_configs(load_config(None, BASE), trace, DEFAULT_PD_VARIANTS[:1])
    plan = run_pd_plan([cfg], trace, [Target("ttft_p90_s", 600.0)], 2, jobs=1, progress=False,
                       seeds=2)  # fmt: skip
    (c,) = plan.configs
    assert c.split == (1, 1) and len(c.chosen["seeds"]["runs"]) == 2  # type: ignore[index]
    row = plan.rows()[0]
    assert row["seeds"] == 2 and row["ttft_p90_s_lo"] <= row["ttft_p90_s"] <= row["ttft_p90_s_hi"]


# --- savings ---------------------------------------------------------------------------------


def _configs(tmp_path: Path) -> list[Any]:
    variants = [
        *DEFAULT_PD_VARIANTS[:2],
        parse_variant("radix, prefill TP2:pd.decode_radix_cache=true,pd.prefill_set=model.tp=2"),
        Variant("radix over nvlink", ("pd.decode_radix_cache=true", "pd.transfer=nvlink")),
    ]
    return build_pd_configs(load_config(None, BASE), _trace(tmp_path, n=4), variants)


def _plan(configs: list[Any], splits: list[tuple[int, int] | None]) -> PdPlan:
    plans = []
    for c, sp in zip(configs, splits, strict=True):
        ev = (
            []
            if sp is None
            else [PdEvaluation(*sp, True, "", {"transfer_bytes_saved_share": 0.25})]
        )
        plans.append(PdConfigPlan(c, sp, ev))
    return PdPlan([Target("ttft_p90_s", 2.0)], 8, plans)


def test_savings_are_claimed_like_for_like_only(tmp_path: Path) -> None:
    """The radix variant differs from the baseline on the decode side alone: its saving is
    claimed; one that also changes the prefill TP or the KV link is not (named, with what it
    differs in), however cheap."""
    configs = _configs(tmp_path)
    plan = _plan(configs, [(2, 4), (2, 3), (1, 1), (1, 1)])
    pairs, unmatched = like_for_like_pd(plan)
    assert [(b.config.variant, [c.config.variant for c in likes]) for b, likes in pairs] == [
        ("decode cache off", ["decode radix cache (L1)"])
    ]
    assert "prefill: model.tp" in unmatched[0] and unmatched[0].startswith("radix, prefill TP2")
    assert "pd.transfer" in unmatched[1] and "no saving claimed" in unmatched[1]
    lines = pd_savings_lines(plan)
    hours = configs[0].span_s / 3600  # one GPU over the arrival span
    assert lines[0] == (
        f"decode-side HiCache (decode radix cache (L1)) saves 1 GPU, 0 servers (16.7%; "
        f"{hours:.3g} GPU-hours) against decode cache off: 2:3 (5 GPUs; 1 + 1 servers) with "
        "decode radix cache (L1), 2:4 (6 GPUs; 1 + 1 servers) with decode cache off"
    )
    assert len(lines) == 3  # no line at the baseline's split: the radix one never ran 2:4


def test_savings_none_at_these_targets(tmp_path: Path) -> None:
    configs = _configs(tmp_path)[:2]
    lines = pd_savings_lines(_plan(configs, [(2, 4), (2, 4)]))
    assert lines[0] == (
        "decode-side HiCache saves no GPUs at these targets (none): decode cache off and "
        "decode radix cache (L1) all need 2:4 (6 GPUs; 1 + 1 servers)"
    )
    assert lines[1].startswith("at 2:4, decode radix cache (L1): sends 25.0% fewer KV bytes")
    more = pd_savings_lines(_plan(configs, [(2, 4), (3, 4)]))[0]
    assert more.startswith("decode-side HiCache (decode radix cache (L1)) needs 1 more GPU")
    over = pd_savings_lines(_plan(configs, [None, (3, 4)]))[0]
    assert "meets the targets with 3:4" in over and "no split up to 8:8" in over


# --- the command -----------------------------------------------------------------------------


def test_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _trace(tmp_path, n=40, gap_ms=200, prompt=2000, out=40, sessions=8)
    out = tmp_path / "plan"
    argv = ["plan", str(tmp_path / "pd.jsonl"), "--pd", "--target", "ttft_p90=10min",
            "--target", "tpot_p90=1s", "--set", "pd.decode_set=gpu.device_tokens=40000",
            "--max-instances", "2", "--jobs", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "setup: prefill: llama-3-8b on h100-sxm x TP1, dgx-h100 (8 GPUs per server)" in text
    assert "prefill:decode" in text and "decode L1+L2 (host x2)" in text
    assert (
        "decode-side HiCache saves no GPUs at these targets (none): decode cache off, decode "
        "radix cache (L1) and decode L1+L2 (host x2) all need 1:1 (2 GPUs; 1 + 1 servers)"
    ) in text
    assert "at 1:1, decode L1+L2 (host x2): sends " in text
    data = json.loads((out / "plan.json").read_text())
    assert data["pd"] and data["max_instances_per_role"] == 2
    rows = data["configurations"]
    assert [c["variant"] for c in rows] == [v.name for v in DEFAULT_PD_VARIANTS]
    for c in rows:
        assert (c["split"], c["gpus"], c["servers"]) == ("1:1", 2, 2)
        assert c["evaluations"] and "ttft_p90_s" in c["evaluations"][0]["summary"]
    assert [c["decode_host_dram_gb_per_instance"] > 0 for c in rows] == [False, False, True]
    assert rows[0]["prefill_host_dram_gb_per_instance"] > 0  # the base's prefill host tier
    assert rows[0]["decode_hit_rate"] is None and rows[1]["decode_hit_rate"] > 0  # shared turns
    csv = (out / "plan.csv").read_text().splitlines()
    assert len(csv) == 4 and csv[0].startswith("configuration,variant,split,prefill_instances")
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "plan.html").read_text()
    assert "<svg" in page and "prefill/decode split" in page and "decode-side HiCache" in page


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pd", "--router", "round_robin"], "--router: a PD plan routes with pd.prefill_router"),
        (["--set", "pd.enabled=true", "--router", "random"], "--router: a PD plan routes"),
        (["--pd", "--variant", "x:cluster.instances=2"], "cluster.instances is not used by a PD"),
        (["--pd", "--variant", "x:pd.decode_instances=2"], "is what the plan searches"),
        (["--pd", "--variant", "x:pd.enabled=false"], "pd.enabled is set by --pd"),
        (["--pd", "--set", "pd.prefill_instances=2"],
         "--set pd.prefill_instances=2: pd.prefill_instances is what the plan searches"),
        (["--pd", "--sglang-version", "0.5.14"], "modelled for sglang.version 0.5.23 only"),
        (["--pd", "--target", "queue_last_tenth=2s"], "unknown summary key 'queue_last_tenth'"),
    ],
)  # fmt: skip
def test_cli_errors_are_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _trace(tmp_path, n=4)
    out = tmp_path / "plan"
    argv = ["plan", str(tmp_path / "pd.jsonl"), "--target", "ttft_p90=1s", "--out", str(out)]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_a_key_only_single_role_runs_have_is_refused_in_pd(tmp_path: Path) -> None:
    """The error case above is a key a single-role run's summary does have."""
    from studies.plan import summary_keys

    trace = _trace(tmp_path, n=4)
    single = load_config(None, [b for b in BASE if not b.startswith("pd.")])
    assert "queue_last_tenth_s" in summary_keys(single, trace)
    assert "queue_last_tenth_s" not in summary_keys(load_config(None, BASE), trace)
