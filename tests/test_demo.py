"""The demo compares L2 alone with L2 + an L3 storage tier: its timed comparison carries an L3
run that hits the store, its cache-only part an unlimited-L3 series, and its report shows the
three tiers, the L3 traffic and the SGLang defects. The first 400 requests of the bundled
trace (``--max-requests``) keep it to a few seconds."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from tests.test_report import figure_data

L3_SETUP = "write_through + L3 mooncake"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The demo's output folder and what it printed."""
    out = tmp_path_factory.mktemp("demo")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["demo", "--out", str(out), "--max-requests", "400", "--jobs", "2"]) == 0
    return out, buf.getvalue()


def test_timed_part_has_an_l3_run_that_hits_the_store(demo: tuple[Path, str]) -> None:
    out, stdout = demo
    df = pd.read_csv(out / "comparison.csv")
    assert list(df["setup"]) == [
        "write_through",
        "write_through_selective",
        "write_back",
        "no host tier",
        L3_SETUP,
    ]
    assert (df["requests"] == 400).all()
    l3 = df[df["setup"] == L3_SETUP].iloc[0]
    assert l3["storage_hit_rate"] > 0 and l3["storage_backend"] == "mooncake"
    assert l3["storage_bytes_read"] > 0 and l3["prefetch_wait_mean_s"] > 0
    total = l3["device_hit_rate"] + l3["host_hit_rate"] + l3["storage_hit_rate"]
    assert total == pytest.approx(l3["hit_rate"])
    # the same write_through server without L3 hits less
    wt = df[df["setup"] == "write_through"].iloc[0]
    assert l3["hit_rate"] > wt["hit_rate"] and pd.isna(wt["storage_backend"])
    run = out / "runs" / "write_through_L3_mooncake"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["storage_hit_rate"] == pytest.approx(l3["storage_hit_rate"])
    assert (run / "storage_calls.parquet").is_file()
    # printed: the L3 column, the store's traffic and the defects it would hit
    assert re.search(rf"{re.escape(L3_SETUP)} +{l3['hit_rate']:.2%}", stdout)
    assert f"{L3_SETUP}: L3 per instance read " in stdout
    # the defects: 0.5.23 (the default) has one open, met under write_back only
    defects = summary["sglang_defects"]
    assert set(defects) == {"B6"} and summary["sglang_version"] == "0.5.23"
    assert (f"{L3_SETUP}: SGLang 0.5.23 defects" in stdout) == (defects["B6"]["count"] > 0)


def test_cache_only_part_has_an_unlimited_l3_series(demo: tuple[Path, str]) -> None:
    out, _ = demo
    rows = pd.read_csv(out / "hitrate.csv")
    l3 = rows[rows["storage"]]
    assert len(l3) == 3 and set(l3["policy"]) == {"write_through + L3 (unlimited)"}
    assert (l3["storage_tokens"] == 0).all() and l3["storage_hit_rate"].max() > 0
    # an unbounded store never loses a page: the total is the infinite-capacity hit rate
    assert l3["hit_rate"].to_numpy() == pytest.approx(l3["infinite_capacity_hit_rate"].to_numpy())


def test_report_shows_three_tiers_l3_traffic_and_defects(demo: tuple[Path, str]) -> None:
    out, _ = demo
    html = (out / "report.html").read_text(encoding="utf-8")
    hit = figure_data(html, "fig-hitrate")
    assert hit["tiers"] == ["device", "host", "storage"]
    (l3,) = [r for r in hit["rows"] if r["l3"]]
    assert l3["run"] == "write_through · L3 mooncake" and l3["storage_hit_rate"] > 0
    (row,) = figure_data(html, "fig-storage")["rows"]
    assert row["backend"] == "mooncake" and row["bytes_read"] > 0
    # the defects table: the nonzero counters (under 0.5.23, the default, only B6 can be)
    defects = figure_data(html, "sglang-defects")["rows"]
    assert {d["code"] for d in defects} <= {"B6"}
    study = figure_data(html, "fig-hitrate-study")["rows"]
    assert any(r["storage"] and r["storage_hit_rate"] > 0 for r in study)
    md = (out / "report.md").read_text()
    assert "storage.backend=mooncake" in md and "L3 (unlimited)" in md


def test_upgrade_part_sets_both_sglang_releases_side_by_side(demo: tuple[Path, str]) -> None:
    """The write policies run under 0.5.14 and 0.5.23: upgrade.csv pairs them, and the
    terminal, report.md and report.html show the table and its difference lines."""
    out, stdout = demo
    df = pd.read_csv(out / "upgrade.csv", dtype={"sglang_version": str})
    policies = ["write_through", "write_through_selective", "write_back"]
    assert list(df["setup"]) == policies * 2
    assert list(df["sglang_version"]) == ["0.5.14"] * 3 + ["0.5.23"] * 3
    assert (df["requests"] == 400).all()
    for p in policies:  # the main runs are the default release's; the twins the other's
        assert (out / "runs" / f"{p}_sglang-0.5.14" / "summary.json").is_file()
    title = "What upgrading SGLang 0.5.14 -> 0.5.23 changes"
    assert title in stdout and title in (out / "report.md").read_text(encoding="utf-8")
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="sglang-upgrade"' in html and 'href="#sglang-upgrade"' in html
    new = df[df["sglang_version"] == "0.5.23"].set_index("setup")
    old = df[df["sglang_version"] == "0.5.14"].set_index("setup")
    sel = "write_through_selective"
    if abs(new.loc[sel, "host_hit_rate"] - old.loc[sel, "host_hit_rate"]) >= 0.005:
        assert f"{sel}: host hit rate {old.loc[sel, 'host_hit_rate']:.2%} (0.5.14)" in stdout


def test_upgrade_part_has_the_cache_only_grid_under_both_releases(
    demo: tuple[Path, str],
) -> None:
    out, stdout = demo
    df = pd.read_csv(out / "upgrade_cache_only.csv", dtype={"sglang_version": str})
    assert len(df) == 18 and list(df["sglang_version"]) == ["0.5.14"] * 9 + ["0.5.23"] * 9
    old = df[df["sglang_version"] == "0.5.14"].reset_index(drop=True)
    new = df[df["sglang_version"] == "0.5.23"].reset_index(drop=True)
    assert list(old["setup"]) == list(new["setup"])
    assert "write_through_selective @ 1 M device" in set(old["setup"])
    # the default release's (0.5.23's) rows are the grid's own (hitrate.csv)
    grid = pd.read_csv(out / "hitrate.csv")
    sel = grid[(grid["write_policy"] == "write_through_selective") & (grid["device_tokens"] == 1e6)]
    assert new.loc[
        new["setup"] == "write_through_selective @ 1 M device", "host_hit_rate"
    ].item() == (pytest.approx(sel["host_hit_rate"].item()))
    assert "changes, cache-only (the grid's write policies)" in stdout
    assert "Cache-only (the grid" in (out / "report.html").read_text(encoding="utf-8")
