"""The report and a warm-up window (``workload.warmup_s``): figures of requests leave the
window's requests out, as summary.json does (and differ from the whole table), the figures over
time keep the whole run and shade the window, the header says what was left out; a run without
a window reports as before.

Runs: the bundled multiturn trace's first 100 requests on a small HBM pool, with and without a
5 s window (35 of the 100 arrive in it, on a cold cache): about a second each."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies.report import build_report, load_runs
from studies.report.derive import pcie_totals, write_traffic
from studies.report.figures_traffic import WARMUP_COLOR, WARMUP_LABEL
from tests.test_report import figure_data

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "traces" / "data" / "synthetic" / "multiturn.jsonl"
BASE = ["gpu.device_tokens=8192", "workload.max_requests=100"]
WARMUP_S = 5.0
REL = 2e-5  # figure data carries 6 significant digits


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``warm``: a 5 s warm-up window; ``plain``: the same run without one."""
    from hicache.config import load_config
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(TRACE)
    out = tmp_path_factory.mktemp("warmup")
    sets = {"warm": [*BASE, f"workload.warmup_s={WARMUP_S:g}"], "plain": BASE}
    for name, extra in sets.items():
        run_simulation(load_config(None, extra), trace, out / name, progress=False)
    return {name: out / name for name in sets}


@pytest.fixture(scope="module")
def reports(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The HTML report of each run alone, and of both together (``both``)."""
    out = tmp_path_factory.mktemp("warmup-reports")
    inputs = {"warm": [runs["warm"]], "plain": [runs["plain"]], "both": list(runs.values())}
    return {
        name: build_report(dirs, out / f"{name}.html", pdf=name == "both").read_text()
        for name, dirs in inputs.items()
    }


def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def finished(run_dir: Path, measured_only: bool) -> pd.DataFrame:
    """Finished requests of the run: all of them, or those after its warm-up window."""
    req = pd.read_parquet(run_dir / "requests.parquet")
    if measured_only and "warmup" in req:
        req = req[~req["warmup"]]
    return req[req["finish_s"] >= 0]


def close(a: Any, b: float) -> bool:
    return bool(a == pytest.approx(b, rel=REL, abs=1e-9))


def section(html: str, fig_id: str) -> str:
    m = re.search(rf'<section id="{fig_id}">(.*?)</section>', html, re.S)
    assert m, fig_id
    return m.group(1)


def test_the_setup_has_a_window_that_changes_the_figures(runs: dict[str, Path]) -> None:
    req = pd.read_parquet(runs["warm"] / "requests.parquet")
    s = summary(runs["warm"])
    assert req["warmup"].sum() == s["warmup_requests"] > 0 and s["requests"] > 0
    assert "warmup" not in pd.read_parquet(runs["plain"] / "requests.parquet")
    whole = finished(runs["warm"], measured_only=False)["ttft_s"]
    assert not close(whole.mean(), s["ttft_mean_s"])  # the window's requests do count here


def test_request_figures_leave_the_warmup_out_as_the_summary(
    runs: dict[str, Path], reports: dict[str, str]
) -> None:
    html, s = reports["warm"], summary(runs["warm"])
    (row,) = figure_data(html, "fig-ttft-breakdown")["rows"]
    assert close(row["ttft"], s["ttft_mean_s"])
    assert close(row["queueing"] + row["prefetch wait"], s["queue_mean_s"])
    assert close(row["load stall"], s["load_stall_mean_s"])
    whole = finished(runs["warm"], measured_only=False)
    assert not close(row["ttft"], whole["ttft_s"].mean())
    # the CDF: the measured requests' TTFTs, not the whole table's
    cdf = figure_data(html, "fig-ttft-cdf")
    (line,) = cdf["lines"]
    probs = cdf["probabilities"]
    measured = finished(runs["warm"], measured_only=True)["ttft_s"].to_numpy()
    assert len(measured) == s["finished_requests"]
    expected = np.quantile(measured, probs, method="inverted_cdf")
    assert all(close(a, b) for a, b in zip(line["ttft_s"], expected, strict=True))
    every = np.quantile(whole["ttft_s"].to_numpy(), probs, method="inverted_cdf")
    assert not all(close(a, b) for a, b in zip(line["ttft_s"], every, strict=True))
    (pct,) = figure_data(html, "fig-ttft-percentiles")["rows"]
    assert pct["ttft_p90_s"] == s["ttft_p90_s"] != whole["ttft_s"].quantile(0.9)


def test_copy_totals_count_from_the_windows_end_as_the_summary(runs: dict[str, Path]) -> None:
    (run,) = load_runs([runs["warm"]]).runs
    s = summary(runs["warm"])
    totals = pcie_totals(run)
    assert totals["d2h_gb"] == pytest.approx(s["bytes_d2h"] / 1e9, rel=1e-12)
    assert totals["h2d_gb"] == pytest.approx(s["bytes_h2d"] / 1e9, rel=1e-12)
    tr = pd.read_parquet(runs["warm"] / "transfers.parquet")
    assert tr.loc[tr["direction"] == "d2h", "bytes"].sum() > s["bytes_d2h"]  # the window's
    later = tr[tr["start_s"] >= s["warmup_end_s"]]
    written = int(later.loc[later["direction"] == "d2h", "pages"].sum()) * run.page_size
    assert write_traffic(run)["tokens_written"] == written


def test_figures_over_time_keep_the_whole_run_and_shade_the_window(
    runs: dict[str, Path], reports: dict[str, str]
) -> None:
    html = reports["warm"]
    s = summary(runs["warm"])
    window = [s["warmup_end_s"] - WARMUP_S, s["warmup_end_s"]]
    tr = pd.read_parquet(runs["warm"] / "transfers.parquet")
    for fig_id in ("fig-occupancy", "fig-pcie"):
        (series,) = figure_data(html, fig_id)["runs"]
        assert series["warmup_window_s"] == window
        assert series["t_s"][0] == 0.0  # from the run's start, the window included
        svg = section(html, fig_id)
        assert WARMUP_LABEL in svg  # the legend (SVG text stays text)
        assert svg.count(f"fill: {WARMUP_COLOR}") == 3  # a span on each panel, the legend's
        assert f"fill: {WARMUP_COLOR}" not in section(reports["plain"], fig_id)
    (pcie,) = figure_data(html, "fig-pcie")["runs"]
    width = pcie["width_s"][0]
    moved = sum(v * width * 1e9 for v in pcie["d2h_gb_s"])
    d2h = float(tr.loc[tr["direction"] == "d2h", "bytes"].sum())
    assert moved == pytest.approx(d2h, rel=1e-3)  # every copy, the window's too


def test_the_header_says_what_the_window_left_out(
    runs: dict[str, Path], reports: dict[str, str]
) -> None:
    n = summary(runs["warm"])["warmup_requests"]
    head = reports["warm"].split("<nav>", 1)[0]
    m = re.search(r'<p class="note" id="warmup">(.*?)</p>', head)
    assert m, "no warm-up note at the top"
    assert f"the first {WARMUP_S:g} s ({n:,} requests) ran but count in no figure" in m.group(1)
    both = re.search(r'<p class="note" id="warmup">(.*?)</p>', reports["both"])
    assert both and f"({n:,} requests)" in both.group(1)
    assert "1 run(s) without a window count every request" in both.group(1)


def test_a_run_without_a_window_reports_as_before(
    runs: dict[str, Path], reports: dict[str, str]
) -> None:
    html = reports["plain"]
    assert 'id="warmup"' not in html and "warm-up" not in html.lower()
    req = finished(runs["plain"], measured_only=False)
    (row,) = figure_data(html, "fig-ttft-breakdown")["rows"]
    assert close(row["ttft"], req["ttft_s"].mean())
    cdf = figure_data(html, "fig-ttft-cdf")
    expected = np.quantile(req["ttft_s"].to_numpy(), cdf["probabilities"], method="inverted_cdf")
    assert all(close(a, b) for a, b in zip(cdf["lines"][0]["ttft_s"], expected, strict=True))
    for fig_id in ("fig-occupancy", "fig-pcie"):
        (series,) = figure_data(html, fig_id)["runs"]
        assert "warmup_window_s" not in series
    (run,) = load_runs([runs["plain"]]).runs
    tr = pd.read_parquet(runs["plain"] / "transfers.parquet")
    d2h_gb = float(tr.loc[tr["direction"] == "d2h", "bytes"].sum()) / 1e9
    assert pcie_totals(run)["d2h_gb"] == d2h_gb
    # beside a run with a window, its figures are the same as alone
    alone = figure_data(html, "fig-ttft-breakdown")["rows"][0]
    beside = figure_data(reports["both"], "fig-ttft-breakdown")["rows"]
    assert {k: v for k, v in alone.items() if k != "run"} in [
        {k: v for k, v in r.items() if k != "run"} for r in beside
    ]
