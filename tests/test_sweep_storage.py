"""Sweeps over the L3 storage tier: ``storage.*`` keys as axes and ``--set`` items, and the
results table's L3 columns (``storage_hit_rate``, ``prefetch_wait_mean_s``, the ``storage``
block as ``storage_*`` columns, the defect counters as ``sglang_defect_*``), empty for jobs
without an L3 tier. Four jobs on the bundled Mooncake trace's first 400 requests: a few
seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cli.sweep import main
from hicache.config import ConfigError
from studies.sweep import flatten_summary, load_grid, run_sweep

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "traces" / "data" / "mooncake" / "conversation_trace.jsonl"
GRID = f"""
name = "l3"
[base]
trace = "{TRACE}"
set = ["sglang.version=0.5.14", "workload.max_requests=400", "workload.rate_scale=0.25"]
[axes]
"storage.backend" = ["none", "mooncake"]
"storage.prefetch_policy" = ["timeout", "best_effort"]
"""
L3_COLUMNS = ("storage_hit_rate", "prefetch_wait_mean_s", "storage_backend",
              "storage_prefetches_issued", "storage_prefetches_terminated",
              "storage_prefetches_revoked", "storage_bytes_read", "storage_bytes_written",
              "storage_pages_discarded", "storage_hit_tokens", "storage_requests_with_l3_hit",
              "storage_prefetch_wait_p90_s", "sglang_defect_D5", "sglang_defect_D5_tokens",
              "sglang_defect_L2LB")  # fmt: skip


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    tmp = tmp_path_factory.mktemp("l3sweep")
    grid = tmp / "grid.toml"
    grid.write_text(GRID)
    out = tmp / "out"
    assert main([str(grid), "--out", str(out), "--jobs", "2"]) == 0
    return out, pd.read_parquet(out / "results.parquet")


def test_storage_keys_are_axes_and_the_results_carry_the_l3_columns(
    sweep: tuple[Path, pd.DataFrame],
) -> None:
    out, df = sweep
    assert (df["status"] == "ok").all(), df[["job", "error"]]
    assert list(df.columns[3:5]) == ["storage.backend", "storage.prefetch_policy"]
    for col in L3_COLUMNS:
        assert col in df.columns, col
    assert "storage" not in df.columns and "sglang_defects" not in df.columns  # flattened
    # the defect counters come last, before run_dir
    tail = [c for c in df.columns if c.startswith("sglang_defect_")]
    assert list(df.columns[-len(tail) - 1 : -1]) == tail
    for _, row in df.iterrows():
        s = json.loads((out / row["run_dir"] / "summary.json").read_text())
        conf = json.loads((out / row["run_dir"] / "config.json").read_text())["config"]
        assert conf["storage"]["backend"] == row["storage.backend"]
        assert conf["storage"]["prefetch_policy"] == row["storage.prefetch_policy"]
        assert row["storage_hit_rate"] == pytest.approx(s.get("storage_hit_rate", 0.0))
        if row["storage.backend"] == "none":
            assert pd.isna(row["storage_backend"]) and pd.isna(row["storage_bytes_read"])
            assert row["storage_hit_rate"] == 0
            continue
        st = s["storage"]
        assert row["storage_backend"] == "mooncake"
        assert row["prefetch_wait_mean_s"] == pytest.approx(s["prefetch_wait_mean_s"])
        assert row["storage_bytes_read"] == st["bytes_read"] > 0
        assert row["storage_prefetches_issued"] == st["prefetches_issued"]
        assert row["storage_prefetch_policy"] == row["storage.prefetch_policy"]
        assert row["sglang_defect_D5"] == s["sglang_defects"]["D5"]["count"]
    timeout = df[(df["storage.backend"] == "mooncake")
                 & (df["storage.prefetch_policy"] == "timeout")]  # fmt: skip
    assert float(timeout["storage_hit_rate"].iloc[0]) > 0
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(df.columns)


def test_storage_keys_can_be_set_and_are_checked(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    g = load_grid(grid).with_set(["storage.prefetch_threshold=512", "storage.capacity_gb=50"])
    assert "storage.prefetch_threshold=512" in g.overrides
    with pytest.raises(ConfigError, match=r"storage\.no_such_key"):
        load_grid(grid).with_set(["storage.no_such_key=1"])
    one = g.select("storage.backend", ["mooncake"]).select("storage.prefetch_policy", ["timeout"])
    df = run_sweep(one, tmp_path / "out", jobs=1, progress=False)
    conf = json.loads((tmp_path / "out" / df["run_dir"][0] / "config.json").read_text())
    assert conf["config"]["storage"]["prefetch_threshold"] == 512
    assert conf["config"]["storage"]["capacity_gb"] == 50


def test_flatten_summary() -> None:
    s = {
        "hit_rate": 0.5,
        "storage_hit_rate": 0.25,
        "prefetch_wait_mean_s": 0.1,
        "storage": {"backend": "file", "bytes_read": 10, "storage_hit_tokens": 64,
                    "prefetch_wait_mean_s": 0.1, "prefetch_wait_p90_s": 0.3},
        "sglang_defects": {"D5": {"count": 2, "tokens": 128, "what": "x"}},
        "per_instance": [{"hit_rate": 0.5}],
    }  # fmt: skip
    assert flatten_summary(s) == {
        "hit_rate": 0.5,
        "storage_hit_rate": 0.25,
        "prefetch_wait_mean_s": 0.1,
        "storage_backend": "file",
        "storage_bytes_read": 10,
        "storage_hit_tokens": 64,
        "storage_prefetch_wait_p90_s": 0.3,
        "sglang_defect_D5": 2,
        "sglang_defect_D5_tokens": 128,
        "per_instance": [{"hit_rate": 0.5}],
    }
    # a summary from before the L3 tier passes through unchanged
    assert flatten_summary({"hit_rate": 0.5}) == {"hit_rate": 0.5}
