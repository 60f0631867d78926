"""The L3 storage tier wherever a user looks: the report (hit rates stacked device / host /
storage, the "L3 storage traffic" figure only with an L3 tier, the SGLang 0.5.14 defects
table, the comparison's L3 columns, old run directories without any of it), ``run``'s console
summary, and the cache-only study with L3 rows.

Runs: the bundled Mooncake conversation trace's first 400 requests at a quarter of its rate
(the demo's set-up), with and without a Mooncake L3 store: about half a second each, with L3
hits and one D5 defect."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from studies.report import build_report, load_runs
from tests.test_report import Tables, figure_data

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "traces" / "data" / "mooncake" / "conversation_trace.jsonl"
BASE = ["sglang.version=0.5.14", "workload.max_requests=400", "workload.rate_scale=0.25"]
REL = 2e-5  # figure data carries 6 significant digits


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``l2``: write_through, no L3; ``l3``: the same with a Mooncake store; ``old``: ``l2`` as
    a run directory written before the L3 tier (no storage columns, keys or config section)."""
    from hicache.config import load_config
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(TRACE)
    out = tmp_path_factory.mktemp("l3runs")
    dirs = {}
    for name, extra in (("l2", []), ("l3", ["storage.backend=mooncake"])):
        run_simulation(load_config(None, [*BASE, *extra]), trace, out / name, progress=False)
        dirs[name] = out / name
    old = out / "old"
    shutil.copytree(dirs["l2"], old)
    summary = json.loads((old / "summary.json").read_text())
    for key in ("storage_hit_rate", "prefetch_wait_mean_s", "sglang_defects", "storage"):
        summary.pop(key, None)
    (old / "summary.json").write_text(json.dumps(summary))
    conf = json.loads((old / "config.json").read_text())
    conf["config"].pop("storage", None)
    (old / "config.json").write_text(json.dumps(conf))
    req = pd.read_parquet(old / "requests.parquet")
    req.drop(columns=["storage_hit_tokens", "prefetch_wait_s"]).to_parquet(old / "requests.parquet")
    dirs["old"] = old
    return dirs


def summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


@pytest.fixture(scope="module")
def l3_report(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("l3report") / "report.html"
    build_report([runs["l2"], runs["l3"], runs["old"]], out, pdf=True)
    assert out.with_suffix(".pdf").read_bytes().startswith(b"%PDF")  # defects as text pages
    return out.read_text(encoding="utf-8")


def section(html: str, sid: str) -> str | None:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', html, re.S)
    return m.group(1) if m else None


def test_the_l3_run_hits_the_store(runs: dict[str, Path]) -> None:
    s = summary(runs["l3"])
    assert s["storage"]["backend"] == "mooncake"
    assert s["storage_hit_rate"] > 0.05 and s["storage"]["prefetches_issued"] > 0
    assert s["sglang_defects"]["D5"]["count"] > 0  # the defects table has a row to show
    assert "storage" not in summary(runs["l2"])


# --- hit rates -------------------------------------------------------------------------------


def test_hit_rate_bars_stack_the_three_tiers_as_the_summary_says(
    runs: dict[str, Path], l3_report: str
) -> None:
    data = figure_data(l3_report, "fig-hitrate")
    assert data["tiers"] == ["device", "host", "storage"]
    rows = {Path(r["dir"]).name: r for r in data["rows"]}
    assert set(rows) == {"l2", "l3", "old"}
    for name, r in rows.items():
        s = summary(runs[name])
        assert r["device_hit_rate"] == pytest.approx(s["device_hit_rate"])
        assert r["host_hit_rate"] == pytest.approx(s["host_hit_rate"])
        assert r["storage_hit_rate"] == pytest.approx(s.get("storage_hit_rate", 0.0))
        stacked = r["device_hit_rate"] + r["host_hit_rate"] + r["storage_hit_rate"]
        assert stacked == pytest.approx(s["hit_rate"])
        assert r["l3"] == (name == "l3")
    l3 = rows["l3"]
    req = pd.read_parquet(runs["l3"] / "requests.parquet")
    done = req[req["finish_s"] >= 0]
    expected = done["storage_hit_tokens"].sum() / done["prompt_tokens"].sum()
    assert l3["storage_hit_rate"] == pytest.approx(expected) and l3["storage_hit_rate"] > 0
    # drawn: a cross-hatched part and its legend entry; its percentage in the table
    sec = section(l3_report, "fig-hitrate")
    assert sec and "storage (L3) hits" in sec and "<th>L3</th>" in sec
    assert f"{100 * l3['storage_hit_rate']:.2f} %" in sec


def test_without_l3_the_report_has_no_storage_parts(runs: dict[str, Path], tmp_path: Path) -> None:
    html = build_report([runs["l2"], runs["old"]], tmp_path / "r.html").read_text("utf-8")
    assert section(html, "fig-storage") is None and 'href="#fig-storage"' not in html
    data = figure_data(html, "fig-hitrate")
    assert data["tiers"] == ["device", "host"]
    assert all(r["storage_hit_rate"] == 0 and not r["l3"] for r in data["rows"])
    sec = section(html, "fig-hitrate")
    assert sec and "storage (L3) hits" not in sec and "<th>L3</th>" not in sec
    comparison = section(html, "comparison")
    assert comparison and "L3 hits" not in comparison and "L3 read [GB]" not in comparison


# --- the L3 storage traffic figure -----------------------------------------------------------


def test_storage_figure_shows_each_l3_run_as_its_tables_say(
    runs: dict[str, Path], l3_report: str
) -> None:
    sec = section(l3_report, "fig-storage")
    assert sec and re.search(r"<figure[^>]*><svg", sec)
    assert '<a href="#fig-storage">L3 storage traffic</a>' in l3_report
    (row,) = figure_data(l3_report, "fig-storage")["rows"]  # the L3 run only
    assert Path(row["dir"]).name == "l3"
    st = summary(runs["l3"])["storage"]
    assert row["backend"] == "mooncake"
    assert (row["bytes_read"], row["bytes_written"]) == (st["bytes_read"], st["bytes_written"])
    assert row["bytes_read"] > 0 and row["bytes_written"] > 0
    for key in ("prefetches_terminated", "prefetches_revoked", "prefetches_aborted",
                "pages_discarded", "prefetches_issued"):  # fmt: skip
        assert row[key] == st[key], key
    req = pd.read_parquet(runs["l3"] / "requests.parquet")
    waits = req.loc[(req["finish_s"] >= 0) & (req["prefetch_wait_s"] > 0), "prefetch_wait_s"]
    assert row["requests_waited"] == len(waits) > 0
    for q, key in ((0.5, "prefetch_wait_p50_s"), (0.9, "prefetch_wait_p90_s")):
        assert row[key] == pytest.approx(float(np.quantile(waits, q)), rel=REL)
    assert row["prefetch_wait_p90_s"] == pytest.approx(st["prefetch_wait_p90_s"], rel=REL)
    assert row["prefetch_wait_mean_s"] == pytest.approx(st["prefetch_wait_mean_s"], rel=REL)


def test_comparison_has_the_l3_columns(runs: dict[str, Path], l3_report: str) -> None:
    sec = section(l3_report, "comparison")
    assert sec
    parser = Tables()
    parser.feed(sec)
    assert len(parser.tables) == 3  # cache and TTFT, the rest, and the L3 traffic
    header = [t for t, _ in parser.tables[0][0]]
    col = header.index("L3 hits")
    cells = {row[0][0]: row[col][0] for row in parser.tables[0][1:]}
    s = summary(runs["l3"])
    assert cells["L3 mooncake"] == f"{100 * s['storage_hit_rate']:.2f} %"
    assert {v for k, v in cells.items() if k != "L3 mooncake"} == {"–"}
    third = [t for t, _ in parser.tables[2][0]]
    assert third == ["run", "prefetch wait mean [ms]", "L3 read [GB]", "L3 written [GB]"]


# --- SGLang 0.5.14 defects -------------------------------------------------------------------


def test_defects_table_lists_the_nonzero_counters(runs: dict[str, Path], l3_report: str) -> None:
    sec = section(l3_report, "sglang-defects")
    assert sec and "the simulator itself stays consistent" in sec
    assert "SGLang 0.5.14 defects this trace would hit" in sec
    rows = figure_data(l3_report, "sglang-defects")["rows"]
    expected = [
        (code, name, d["count"], d["tokens"])
        for name in ("l2", "l3")
        for code, d in summary(runs[name])["sglang_defects"].items()
        if d["count"]
    ]
    assert expected  # D5 on the L3 run
    got = [(r["code"], Path(r["dir"]).name, r["count"], r["tokens"]) for r in rows]
    assert sorted(got) == sorted(expected)
    parser = Tables()
    parser.feed(sec)
    (table,) = parser.tables
    assert [c for c, _ in table[0]][:4] == ["code", "run", "count", "tokens"]
    assert [r[0][0] for r in table[1:]] == [r["code"] for r in rows]
    assert all(int(r[2][0].replace(",", "")) > 0 for r in table[1:])  # no zero rows
    what = summary(runs["l3"])["sglang_defects"]["D5"]["what"]
    assert "here:" in what and what.replace("'", "&#x27;") in sec
    # the run written before the counters existed is named as not included
    assert "1 run(s) were written before the simulator counted these defects" in sec


def test_defects_section_says_when_none_were_hit(runs: dict[str, Path], tmp_path: Path) -> None:
    assert not any(d["count"] for d in summary(runs["l2"])["sglang_defects"].values())
    html = build_report([runs["l2"]], tmp_path / "r.html").read_text("utf-8")
    sec = section(html, "sglang-defects")
    assert sec and "None were hit" in sec and "<table" not in sec
    # only runs written before the counters existed: no such section at all
    old = build_report([runs["old"]], tmp_path / "old.html").read_text("utf-8")
    assert section(old, "sglang-defects") is None and section(old, "fig-hitrate")


def test_old_runs_load_and_label_like_new_runs_without_l3(runs: dict[str, Path]) -> None:
    from studies.report import ttft_breakdown

    data = load_runs([runs["l2"], runs["old"], runs["l3"]])
    labels = {Path(r.shown).name: r.label for r in data.runs}
    # an old run equals a new one without L3 (the storage defaults fill its config)
    assert labels == {"l2": "no L3 (l2)", "old": "no L3 (old)", "l3": "L3 mooncake"}
    old = next(r for r in data.runs if Path(r.shown).name == "old")
    assert not old.has_l3 and old.rate("storage_hit_rate") == 0.0
    assert ttft_breakdown(old)["prefetch wait"] == 0.0


# --- the console and the cache-only study ----------------------------------------------------


def test_run_summary_prints_three_tiers_l3_traffic_and_defects(runs: dict[str, Path]) -> None:
    from cli.run_output import format_summary

    s = summary(runs["l3"])
    text = format_summary(s)
    lines = text.splitlines()
    assert (
        f"hit rate {s['hit_rate']:.2%} (device {s['device_hit_rate']:.2%}, host "
        f"{s['host_hit_rate']:.2%}, L3 storage {s['storage_hit_rate']:.2%})" in lines
    )
    (l3,) = [ln for ln in lines if ln.startswith("L3 mooncake: ")]
    st = s["storage"]
    assert f"read {st['bytes_read'] / 1e9:,.1f} GB" in l3
    assert f"prefetches {st['prefetches_issued']:,} ({st['prefetches_terminated']:,} term" in l3
    (defects,) = [ln for ln in lines if ln.startswith("SGLang 0.5.14 defects")]
    assert f"D5 x{s['sglang_defects']['D5']['count']}" in defects
    plain = format_summary(summary(runs["l2"]))
    assert "L3" not in plain and "defects" not in plain
    # a nonzero counter is named even without an L3 tier (L2LB is counted always)
    l2 = summary(runs["l2"])
    l2["sglang_defects"]["L2LB"] = {"count": 2, "tokens": 128, "what": "..."}
    assert "L2LB x2 (128 tokens)" in format_summary(l2).splitlines()[-1]


def test_hitrate_study_shows_the_l3_rows() -> None:
    from sim.hitrate import HitRateConfig
    from studies.report import hitrate_study, study_labels
    from studies.sweep import run_hitrate_grid
    from traces.io import read_trace

    trace = read_trace(REPO / "traces" / "data" / "synthetic" / "multiturn.jsonl")
    configs = [HitRateConfig(4096, 8256, 64), HitRateConfig(4096, 8256, 64, storage=True)]
    rows = run_hitrate_grid(trace, configs, jobs=1, progress=False)
    assert rows[1]["storage_hit_rate"] > 0
    assert study_labels(rows) == ["write_through · no L3", "write_through · L3 unlimited"]
    fig = hitrate_study(rows)
    assert "L3 hits" in fig.numbers.columns and "L3 [tokens]" in fig.numbers.columns
    by_label = {r["series"]: r for r in fig.data["rows"]}
    assert by_label["write_through · L3 unlimited"]["storage_hit_rate"] == pytest.approx(
        rows[1]["storage_hit_rate"], rel=REL
    )
    assert "dash-dot" in fig.caption
    plain = hitrate_study(rows[:1])
    assert "L3 hits" not in plain.numbers.columns and "dash-dot" not in plain.caption


# --- in a real browser (skipped without one) -------------------------------------------------


def test_l3_report_renders_without_horizontal_overflow(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    from tests.test_report_browser import PROBE, WIDTH, run_chromium

    report = build_report([runs["l2"], runs["l3"]], tmp_path / "report.html")
    page = tmp_path / "probe.html"
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE), "utf-8")
    dom = run_chromium(tmp_path, f"--window-size={WIDTH},3000", "--dump-dom", page.as_uri())
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, dom[-2000:]
    probe = json.loads(m.group(1).replace("&quot;", '"'))
    assert probe["scroll"] <= WIDTH, probe
    assert probe["tables_overflowing"] == [], probe
