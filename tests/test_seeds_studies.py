"""Issue 26 item 4, the rest: ``--seeds K`` in ``sweep`` and ``plan`` (:mod:`sim.seeds`,
:mod:`studies.sweep.seeds`), and a replica being a config that reruns exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from cli.plan import _metric
from hicache.config import load_config, with_overrides
from sim.engine import run_simulation
from sim.seeds import median_summary, replica_overrides
from studies.sweep.seeds import seed_table
from traces.io import read_trace

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
TRACE = DATA / "synthetic" / "multiturn.jsonl"
SMALL = "gpu.device_tokens=65536"


def test_a_replica_is_a_config_that_reruns_it(tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert main(["run", str(TRACE), "--out", str(out), "--set", SMALL, "--seeds", "3"]) == 0
    block = json.loads((out / "summary.json").read_text())["seeds"]
    conf = json.loads((out / "config.json").read_text())["config"]
    assert conf["workload"]["resample_sessions"] is True
    # replica 2 rerun from its config alone (the first run's config with seeds + 2)
    cfg = with_overrides(load_config(None, [SMALL]), replica_overrides(0, 0, 2))
    again = run_simulation(cfg, read_trace(TRACE))
    third = block["runs"][2]
    assert third["seed"] == 2
    for key in ("hit_rate", "ttft_p90_s", "tpot_mean_s"):
        assert again[key] == third[key]
    # and it is not the recorded order's run (the permutation changed something)
    assert any(block["runs"][0][k] != third[k] for k in ("hit_rate", "ttft_p90_s"))


def test_median_summary_judges_on_medians_and_the_majority() -> None:
    runs = [
        {"hit_rate": 0.5, "ttft_p90_s": 1.0, "overloaded": True, "name": "a"},
        {"hit_rate": 0.7, "ttft_p90_s": 3.0, "overloaded": False, "name": "b"},
        {"hit_rate": 0.6, "ttft_p90_s": 2.0, "overloaded": True, "name": "c"},
    ]
    m = median_summary(runs, [0, 1, 2])
    assert m["hit_rate"] == pytest.approx(0.6) and m["ttft_p90_s"] == pytest.approx(2.0)
    assert m["overloaded"] is True and m["name"] == "a"
    assert [r["seed"] for r in m["seeds"]["runs"]] == [0, 1, 2]
    iv = m["seeds"]["intervals"]["ttft_p90_s"]
    assert iv["lo"] == pytest.approx(np.quantile([1, 2, 3], 0.05))
    assert iv["hi"] == pytest.approx(np.quantile([1, 2, 3], 0.95))
    # one of three overloaded: not overloaded
    runs[2]["overloaded"] = False
    assert median_summary(runs, [0, 1, 2])["overloaded"] is False
    # a single replica is the run itself, without a seeds block
    assert median_summary(runs[:1], [0]) == runs[0]


def test_seed_table_folds_each_configurations_replicas() -> None:
    df = pd.DataFrame(
        {
            "job": list("abcdef"),
            "status": ["ok", "ok", "ok", "ok", "ok", "failed"],
            "error": [None] * 6,
            "cache.write_policy": ["wt", "wt", "wt", "wb", "wb", "wb"],
            "seed": [0, 1, 2, 0, 1, 2],
            "device_tokens": [1] * 6,
            "hit_rate": [0.1, 0.3, 0.2, 0.5, 0.7, math.nan],
            "ttft_p90_s": [1.0, 2.0, 3.0, 4.0, 6.0, math.nan],
            "overloaded": [False, True, False, False, False, None],
        }
    )
    t = seed_table(df).set_index("cache.write_policy")
    assert list(t.index) == ["wt", "wb"]
    assert t.loc["wt", "seeds"] == 3 and t.loc["wb", "seeds"] == 2  # the failed one left out
    assert t.loc["wt", "overloaded_seeds"] == 1
    assert t.loc["wt", "hit_rate"] == pytest.approx(0.2)
    assert t.loc["wb", "ttft_p90_s"] == pytest.approx(5.0)
    assert t.loc["wb", "ttft_p90_s_lo"] == pytest.approx(np.quantile([4, 6], 0.05))
    assert "seed" not in t.columns


def _grid(tmp_path: Path, axes: str) -> Path:
    grid = tmp_path / "g.toml"
    grid.write_text(
        f'[base]\ntrace = "{TRACE}"\nset = ["{SMALL}"]\n\n[axes]\n{axes}\n\n'
        '[[include]]\n"cache.enable_host" = false\n'
    )
    return grid


def test_sweep_seeds_runs_every_job_k_times_and_writes_the_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = _grid(tmp_path, '"cache.write_policy" = ["write_through", "write_back"]')
    out = tmp_path / "s"
    assert main(["sweep", str(grid), "--out", str(out), "--seeds", "2", "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 6 and (df["status"] == "ok").all()  # (2 + the include) x 2 seeds
    assert sorted(df["seed"]) == [0, 0, 0, 1, 1, 1]
    seeds = pd.read_csv(out / "seeds.csv")
    assert len(seeds) == 3 and (seeds["seeds"] == 2).all()
    # the include's row has the base's write policy and enable_host false
    assert set(zip(seeds["cache.write_policy"], seeds["cache.enable_host"], strict=True)) == {
        ("write_through", True), ("write_back", True), ("write_through", False)}  # fmt: skip
    for _, row in seeds.iterrows():
        same = df[(df["cache.write_policy"] == row["cache.write_policy"])
                  & (df["cache.enable_host"] == row["cache.enable_host"])]  # fmt: skip
        assert len(same) == 2
        assert row["hit_rate"] == pytest.approx(same["hit_rate"].median())
        assert row["ttft_p90_s_lo"] <= row["ttft_p90_s"] <= row["ttft_p90_s_hi"]
    # a replica's run directory records what it replays
    job = df[(df["seed"] == 1) & (df["cache.write_policy"] == "write_back")].iloc[0]
    conf = json.loads((out / job["run_dir"] / "config.json").read_text())["config"]
    assert conf["run"]["seed"] == 1 and conf["router"]["seed"] == 1
    assert conf["workload"]["resample_sessions"] is True
    assert "median over seeds [p5 - p95]" in text and "seeds.csv" in text


def test_sweep_seeds_refuses_a_grid_that_varies_the_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = _grid(tmp_path, '"run.seed" = [0, 1]')
    assert main(["sweep", str(grid), "--out", str(tmp_path / "s"), "--seeds", "2"]) == 2
    assert "--seeds varies run.seed" in capsys.readouterr().err


def test_plan_seeds_judges_the_median_and_shows_the_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p"
    args = ["plan", str(TRACE), "--target", "ttft_p90_s=2s", "--max-instances", "2",
            "--variant", "host:cache.hicache_ratio=2", "--jobs", "1", "--seeds", "3",
            "--set", SMALL, "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "judged on the median of 3 seeds" in text
    plan = json.loads((out / "plan.json").read_text())
    assert plan["seeds"] == 3
    (conf,) = plan["configurations"]
    for e in conf["evaluations"]:
        s = e["summary"]
        runs = s["seeds"]["runs"]
        assert [r["seed"] for r in runs] == [0, 1, 2]
        assert s["ttft_p90_s"] == pytest.approx(float(np.median([r["ttft_p90_s"] for r in runs])))
    assert conf["ttft_p90_s_lo"] <= conf["ttft_p90_s"] <= conf["ttft_p90_s_hi"]
    k = "ttft_p90_s"
    assert f"{_metric(k, conf[k])} [{_metric(k, conf[k + '_lo'])} - " in text
    assert "seeds" in pd.read_csv(out / "plan.csv").columns
    assert "in brackets the 5th-95th percentile" in (out / "plan.html").read_text()


def test_a_pd_run_replays_the_replica_too() -> None:
    # a PD run takes the same resampled trace as a single-server one (before the fix it ran
    # the recorded order under every seed: intervals of zero width)
    base = load_config(None, [SMALL, "pd.enabled=true"])
    trace = read_trace(TRACE)
    first = run_simulation(with_overrides(base, replica_overrides(0, 0, 0)), trace)
    other = run_simulation(with_overrides(base, replica_overrides(0, 0, 1)), trace)
    assert first["requests"] == other["requests"]
    assert any(first[k] != other[k] for k in ("ttft_p90_s", "ttft_mean_s", "e2e_mean_s"))
