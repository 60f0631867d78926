"""Reports: every figure present with its data equal to what the run tables say, the
comparison table's highlights, the configs, determinism, inputs and errors."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cli.report import main
from studies.report import (
    CDF_POINTS,
    PCIE_BINS,
    TIME_POINTS,
    Run,
    build_report,
    describe_runs,
    timeline_runs,
)
from studies.sweep import load_grid, run_sweep

REPO = Path(__file__).resolve().parent.parent
FIGURES = ("fig-hitrate", "fig-ttft-cdf", "fig-ttft-percentiles", "fig-ttft-breakdown",
           "fig-occupancy", "fig-pcie", "fig-writes")  # fmt: skip
REL = 2e-5  # figure data carries 6 significant digits


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 jobs (write policy x host ratio) + a run without a host tier, on a small HBM pool so
    that host hits, loads and evictions all happen."""
    grid = load_grid(REPO / "examples" / "quick.toml")
    grid = grid.select("cache.eviction", ["lru"]).select("gpu.device_tokens", [8192])
    grid = grid.with_set(["workload.max_requests=100"])
    grid = dataclasses.replace(grid, include=((("cache.enable_host", False),),))
    out = tmp_path_factory.mktemp("sweep")
    df = run_sweep(grid, out, jobs=2, progress=False)
    assert len(df) == 7 and (df["status"] == "ok").all()
    return out


@pytest.fixture(scope="module")
def report_path(sweep_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_report([sweep_dir], tmp_path_factory.mktemp("report") / "report.html", pdf=True)


@pytest.fixture(scope="module")
def report(report_path: Path) -> str:
    return report_path.read_text(encoding="utf-8")


def figure_data(html: str, fig_id: str) -> Any:
    m = re.search(
        rf'<script type="application/json" class="figure-data" data-figure="{fig_id}">(.*?)'
        r"</script>",
        html,
        re.S,
    )
    assert m, fig_id
    return json.loads(m.group(1).replace("<\\/", "</"))


class Tables(HTMLParser):
    """Every <table> as a list of rows of (cell text, cell class)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, str]]]] = []
        self._cell: list[str] | None = None
        self._cls = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell, self._cls = [], dict(attrs).get("class") or ""

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(("".join(self._cell), self._cls))
            self._cell = None


def finished(run_dir: str) -> pd.DataFrame:
    req = pd.read_parquet(Path(run_dir) / "requests.parquet")
    return req[req["finish_s"] >= 0]


def conf(run_dir: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(run_dir) / "config.json").read_text())
    return data


def close(a: Any, b: float) -> bool:
    return a == pytest.approx(b, rel=REL, abs=1e-9)


# --- the figures -----------------------------------------------------------------------------


def test_every_figure_is_present_as_svg_with_its_data(report: str) -> None:
    for fig_id in FIGURES:
        m = re.search(rf'<section id="{fig_id}">(.*?)</section>', report, re.S)
        assert m, fig_id
        section = m.group(1)
        assert re.search(r"<figure[^>]*><svg", section) and "</svg>" in section
        assert "<figcaption>" in section and '<div class="numbers"><table>' in section
        figure_data(report, fig_id)
    assert "<img" not in report and "http://" not in report.split("<svg", 1)[0]
    assert re.search(r"<(link|script)[^>]+src=", report) is None  # self-contained


def test_hit_rate_figure_matches_the_requests(report: str) -> None:
    rows = figure_data(report, "fig-hitrate")["rows"]
    assert len(rows) == 7
    for r in rows:
        req = finished(r["dir"])
        prompt = req["prompt_tokens"].sum()
        assert close(r["device_hit_rate"], req["device_hit_tokens"].sum() / prompt)
        assert close(r["host_hit_rate"], req["host_hit_tokens"].sum() / prompt)
        c = conf(r["dir"])
        assert (r["device_tokens"], r["host_tokens"]) == (c["device_tokens"], c["host_tokens"])
    assert any(r["host_hit_rate"] > 0 for r in rows)
    assert [r["run"] for r in rows if r["host_tokens"] == 0] == ["no host tier"]


def test_ttft_figures_match_the_requests(report: str) -> None:
    cdf = figure_data(report, "fig-ttft-cdf")
    probs = cdf["probabilities"]
    assert len(probs) == CDF_POINTS and probs[-1] == 1.0
    assert len(cdf["lines"]) == 7
    for line in cdf["lines"]:
        ttft = finished(line["dir"])["ttft_s"].dropna().to_numpy()
        expected = np.quantile(ttft, probs, method="inverted_cdf")
        assert all(close(a, b) for a, b in zip(line["ttft_s"], expected, strict=True))
    pct = figure_data(report, "fig-ttft-percentiles")
    assert pct["x"] == "capacity" and len(pct["rows"]) == 7
    for r in pct["rows"]:
        ttft = finished(r["dir"])["ttft_s"].dropna()
        for p in (50, 90, 99):
            assert close(r[f"ttft_p{p}_s"], ttft.quantile(p / 100))
        c = conf(r["dir"])
        assert r["x"] == c["device_tokens"] + c["host_tokens"]
    parts = figure_data(report, "fig-ttft-breakdown")
    for r in parts["rows"]:
        req = finished(r["dir"])
        assert close(r["queueing"], req["queue_s"].mean())
        assert close(r["load stall"], req["load_stall_s"].mean())
        assert close(r["prefill compute"], req["prefill_s"].mean())
        assert close(r["ttft"], req["ttft_s"].mean())
        rest = (
            req["ttft_s"].mean() - req[["queue_s", "load_stall_s", "prefill_s"]].sum(axis=1).mean()
        )
        assert r["other"] == pytest.approx(max(0.0, rest), rel=REL, abs=1e-6)
    assert any(r["load stall"] > 0 for r in parts["rows"])


def test_occupancy_figure_matches_the_timeline(report: str) -> None:
    runs = figure_data(report, "fig-occupancy")["runs"]
    assert len(runs) == 4  # 7 runs > 6: one per series (3 policies, no host), median capacity
    for s in runs:
        tl = pd.read_parquet(Path(s["dir"]) / "timeline.parquet")
        c = conf(s["dir"])
        end = json.loads((Path(s["dir"]) / "summary.json").read_text())["sim_duration_s"]
        assert len(s["t_s"]) == TIME_POINTS
        # each sample holds until the next one (the last until the end); average per bin
        seg_start = tl["t_s"].to_numpy()
        seg_end = np.append(seg_start[1:], max(end, seg_start[-1]))
        parts = {"requests": ("device_request_tokens", c["device_tokens"]),
                 "locked": ("device_protected_tokens", c["device_tokens"]),
                 "evictable": ("device_evictable_tokens", c["device_tokens"]),
                 "host": ("host_used_tokens", c["host_tokens"])}  # fmt: skip
        for key, (col, pool) in parts.items():
            if not pool:
                assert s[key] == []
                continue
            values = tl[col].to_numpy(dtype=float)
            edges = np.linspace(0.0, end, TIME_POINTS + 1)  # exact (the JSON is rounded)
            assert all(close(a, b) for a, b in zip(s["t_s"], edges[:-1], strict=True))
            for lo, hi, got in zip(edges[:-1], edges[1:], s[key], strict=True):
                overlap = np.clip(np.minimum(seg_end, hi) - np.maximum(seg_start, lo), 0, None)
                assert close(got, float((values * overlap).sum()) / (hi - lo) / pool), (key, lo)


def test_pcie_figure_matches_the_transfers(report: str) -> None:
    runs = figure_data(report, "fig-pcie")["runs"]
    assert runs and any(max(s["h2d_busy"]) > 0 for s in runs)
    for s in runs:
        tr = pd.read_parquet(Path(s["dir"]) / "transfers.parquet")
        end = json.loads((Path(s["dir"]) / "summary.json").read_text())["sim_duration_s"]
        width = end / PCIE_BINS
        for d in ("d2h", "h2d"):
            sel = tr[tr["direction"] == d]
            busy = [0.0] * PCIE_BINS
            moved = [0.0] * PCIE_BINS
            for start, stop, nbytes in zip(sel["start_s"], sel["end_s"], sel["bytes"],
                                           strict=True):  # fmt: skip
                for b in range(PCIE_BINS):
                    lo, hi = b * width, (b + 1) * width
                    overlap = max(0.0, min(stop, hi) - max(start, lo))
                    busy[b] += overlap
                    moved[b] += nbytes * overlap / (stop - start) if stop > start else 0.0
            assert all(close(a, b / width) for a, b in zip(s[f"{d}_busy"], busy, strict=True))
            gbs = [b / width / 1e9 for b in moved]
            assert all(a == pytest.approx(b, rel=1e-4, abs=1e-6)
                       for a, b in zip(s[f"{d}_gb_s"], gbs, strict=True))  # fmt: skip
            # all bytes accounted for (copies of zero duration aside)
            assert sum(moved) == pytest.approx(float(sel["bytes"].sum()), rel=1e-9)


def test_writes_figure_matches_the_transfers(report: str) -> None:
    rows = figure_data(report, "fig-writes")["rows"]
    assert len(rows) == 7
    for r in rows:
        tr = pd.read_parquet(Path(r["dir"]) / "transfers.parquet")
        page = conf(r["dir"])["config"]["cache"]["page_size"]
        written = int(tr.loc[tr["direction"] == "d2h", "pages"].sum()) * page
        loaded = int(tr.loc[tr["direction"] == "h2d", "pages"].sum()) * page
        assert (r["tokens_written"], r["tokens_loaded"]) == (written, loaded)
        assert r["excess_writes"] == max(0, written - loaded)
        assert r["write_amplification"] == (pytest.approx(written / loaded) if loaded else None)
    assert any(r["tokens_loaded"] for r in rows)


def luminance(hex_color: str) -> float:
    r, g, b = (int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_host_hit_hatching_contrasts_with_its_fill(report: str) -> None:
    section = re.search(r'<section id="fig-hitrate">(.*?)</section>', report, re.S)
    assert section
    patterns = re.findall(
        r'<pattern .*?<rect [^>]*fill="(#[0-9a-f]{6})"/>\s*<path [^>]*style="([^"]*)"',
        section.group(1),
        re.S,
    )
    assert patterns  # the host part is hatched
    for fill, style in patterns:
        stroke = re.search(r"stroke: (#[0-9a-f]{6})", style)
        assert stroke and "stroke-opacity" not in style
        assert abs(luminance(fill) - luminance(stroke.group(1))) > 0.12, (fill, style)


def test_long_tables_fold_and_the_write_chart_ranks_runs() -> None:
    from studies.report.figures_traffic import MAX_WRITE_BARS, _amplification_order
    from studies.report.html import NUMBERS_ROWS, _numbers_html

    df = pd.DataFrame({"run": [f"r{i}" for i in range(NUMBERS_ROWS + 5)]})
    html = _numbers_html(df)
    assert html.count("<table>") == 2 and "the other 5 rows</summary>" in html
    assert html.index("<td>r11</td>") < html.index("<details") < html.index("<td>r12</td>")
    assert "<details" not in _numbers_html(df.iloc[: NUMBERS_ROWS + 2])  # 1-2 rows: all shown
    rows = [
        {"run": run, "host": host, "tokens_written": written, "write_amplification": amp}
        for run, host, written, amp in (("none", False, 0, None), ("low", True, 10, 1.5),
                                        ("never read", True, 5, None), ("high", True, 90, 9.0),
                                        ("idle", True, 0, None))
    ]  # fmt: skip
    order = [r["run"] for r in _amplification_order(rows)]
    assert order == ["never read", "high", "low", "none", "idle"]
    assert MAX_WRITE_BARS <= NUMBERS_ROWS


# --- tables and configs ----------------------------------------------------------------------


def test_comparison_table_highlights_the_best_runs(report: str, sweep_dir: Path) -> None:
    section = re.search(r'<section id="comparison">(.*?)</section>', report, re.S)
    assert section
    parser = Tables()
    parser.feed(section.group(1))
    # two tables (cache and TTFT, then the rest), the same runs in the same order: side by side
    # they are the one comparison
    assert len(parser.tables) == 2
    first, second = parser.tables
    assert [r[0] for r in first] == [r[0] for r in second]
    header = [text for text, _ in first[0]] + [text for text, _ in second[0][1:]]
    rows = [a + b[1:] for a, b in zip(first[1:], second[1:], strict=True)]
    assert len(rows) == 7 and len(header) == 19
    results = pd.read_parquet(sweep_dir / "results.parquet")
    for title, key, best in (("hit rate", "hit_rate", max), ("TTFT p99 [ms]", "ttft_p99_s", min)):
        col = header.index(title)
        marked = {row[0][0] for row in rows if row[col][1] == "best"}
        target = best(results[key])
        n_best = int((results[key] == target).sum())
        assert len(marked) == n_best >= 1
        for row in rows:
            if row[0][0] in marked:  # the marked cells show the best value
                text = row[col][0].replace(",", "").rstrip(" %")
                shown = float(text)
                scale = 100 if title == "hit rate" else 1e3
                # the cell is rounded to its last shown digit: within half of it
                decimals = len(text.partition(".")[2])
                assert shown == pytest.approx(target * scale, abs=0.5 * 10**-decimals + 1e-9)
    # columns without a "better" direction are never highlighted
    pools = header.index("HBM pool [tokens]")
    assert all(row[pools][1] == "" for row in rows)


def test_configs_and_grid_are_in_the_report(report: str) -> None:
    configs = re.search(r'<section id="configs">(.*)</section>', report, re.S)
    assert configs
    text = configs.group(1)
    for needle in ("model.name", "llama-3-8b", "What differs", "cache.write_policy",
                   "[axes]", "&quot;trace_sha256&quot;"):  # fmt: skip
        assert needle in text, needle
    assert text.count("<details>") == 7 + 1  # one config.json per run, the grid file


# --- determinism, inputs, errors -------------------------------------------------------------


def test_same_inputs_give_byte_identical_files(
    sweep_dir: Path, report_path: Path, tmp_path: Path
) -> None:
    # a run of the sweep given again, and first: sorted inputs and dropped duplicates make this
    # the same input as the sweep alone
    run_dir = sorted((sweep_dir / "runs").iterdir())[0]
    again = build_report([run_dir, sweep_dir], tmp_path / "again.html", pdf=True)
    assert again.read_bytes() == report_path.read_bytes()
    pdf = again.with_suffix(".pdf").read_bytes()
    assert pdf == report_path.with_suffix(".pdf").read_bytes()
    assert pdf.startswith(b"%PDF")


def test_report_of_a_single_run(sweep_dir: Path, tmp_path: Path) -> None:
    run_dir = sorted((sweep_dir / "runs").iterdir())[0]
    assert main([str(run_dir), "--out", str(tmp_path / "one.html")]) == 0
    html = (tmp_path / "one.html").read_text()
    for fig_id in FIGURES:
        assert f'<section id="{fig_id}">' in html
    (row,) = figure_data(html, "fig-hitrate")["rows"]
    assert row["run"] == run_dir.name  # nothing differs: the directory names the run


def test_user_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    for args in ([str(tmp_path / "empty")], [str(tmp_path / "missing")]):
        assert main([*args, "--out", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hicache-sim: ") and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def fake_run(name: str, host: bool = True, policy: str = "write_through", ratio: float = 2.0,
             device: int = 8192, rate: float = 1.0) -> Run:  # fmt: skip
    config = {"cache": {"write_policy": policy, "hicache_ratio": ratio, "enable_host": host,
                        "eviction": "lru", "page_size": 64},
              "gpu": {"device_tokens": device}, "workload": {"rate_scale": rate}}  # fmt: skip
    conf = {"config": config, "device_tokens": device,
            "host_tokens": int(device * ratio) if host else 0, "trace": "t.jsonl"}  # fmt: skip
    return Run(Path(name), name, conf, {"sim_duration_s": 1.0})


def test_labels_series_and_the_x_axis() -> None:
    runs = [fake_run("a", policy=p, ratio=r) for p in ("write_through", "write_back")
            for r in (2.0, 4.0)] + [fake_run("b", host=False)]  # fmt: skip
    data = describe_runs(runs)
    assert data.x == "capacity"
    assert [r.label for r in runs] == ["write_through · ratio=2", "write_through · ratio=4",
                                       "write_back · ratio=2", "write_back · ratio=4",
                                       "no host tier"]  # fmt: skip
    assert data.series_order() == ["write_through", "write_back", "no host tier"]
    # only the rate varies: it becomes the x axis
    rated = describe_runs([fake_run(f"r{x}", rate=x) for x in (0.5, 1.0)])
    assert rated.x == "rate" and [r.series for r in rated.runs] == ["all runs", "all runs"]
    # the same config twice: told apart by directory
    twice = describe_runs([fake_run("x/one"), fake_run("y/two")])
    assert [r.label for r in twice.runs] == ["one", "two"]
    dup = describe_runs([fake_run("x/one", ratio=2.0), fake_run("y/two", ratio=4.0),
                         fake_run("z/three", ratio=4.0)])  # fmt: skip
    assert [r.label for r in dup.runs] == ["ratio=2", "ratio=4 (two)", "ratio=4 (three)"]


def test_timeline_figures_show_one_run_per_series_when_there_are_many() -> None:
    runs = [fake_run(f"{p}{d}", policy=p, device=d) for p in ("write_through", "write_back")
            for d in (4096, 8192, 16384, 32768)]  # fmt: skip
    data = describe_runs(runs)
    picked = timeline_runs(data)
    assert [r.shown for r in picked] == ["write_through8192", "write_back8192"]
    assert math.isclose(data.x_value(picked[0]), 8192 * 3)
