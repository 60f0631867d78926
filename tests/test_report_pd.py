"""Issue 28 item 5: ``hicache-sim report`` on PD runs: the per-role tables, the PD figures (TTFT
step by step, the KV transfer, each role's occupancy) with their plotted data checked against
the run's own tables, a report mixing a PD run with a single-server run, and the page in a
real browser (skipped without a Chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cli.main import main
from hicache.config import load_config
from sim.pd.run import run_pd_simulation
from studies.report import build_report
from tests.test_pd import CONVERSATION
from tests.test_report_browser import PROBE, WIDTH, run_chromium
from traces.io import read_trace

PD_FIGURES = ("fig-pd-ttft", "fig-pd-transfer", "fig-pd-occupancy")


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """150 conversation requests on 2 prefill + 2 decode servers, the decode radix cache on."""
    out = tmp_path_factory.mktemp("pd") / "run"
    cfg = load_config(None, ["workload.max_requests=150", "workload.rate_scale=0.5",
                             "pd.enabled=true", "pd.prefill_instances=2",
                             "pd.decode_instances=2", "pd.decode_radix_cache=true"])  # fmt: skip
    run_pd_simulation(cfg, read_trace(CONVERSATION), out)
    return out


@pytest.fixture(scope="module")
def report(pd_run: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(pd_run), "--out", str(out), "--pdf"]) == 0
    assert out.with_suffix(".pdf").stat().st_size > 0
    return out.read_text("utf-8")


def _data(html: str, fig: str) -> Any:
    m = re.search(rf'data-figure="{fig}">(.*?)</script>', html, re.S)
    assert m, fig
    return json.loads(m.group(1).replace("<\\/", "</"))


def _integral(series: dict[str, Any], key: str) -> float:
    """Sum of value x bin width: the area under a per-bin average."""
    return float(sum((v or 0.0) * w for v, w in zip(series[key], series["width_s"], strict=True)))


def _tables(run: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    req = pd.read_parquet(run / "requests.parquet")
    return req[req["finish_s"] >= 0], json.loads((run / "summary.json").read_text())


def test_pd_report_has_the_pd_figures_and_not_the_single_server_ones(report: str) -> None:
    for fig in PD_FIGURES:
        assert f'<section id="{fig}">' in report
    # pools and PCIe over time are per role for a PD run; its TTFT breakdown too
    for fig in ("fig-occupancy", "fig-pcie", "fig-ttft-breakdown"):
        assert f'<section id="{fig}">' not in report
    assert '<section id="pd-roles">' in report and "PD 2P+2D" not in report  # one run: no label
    assert "TTFT distribution" in report  # the client's TTFT (arrival to first token)


def test_ttft_steps_are_the_requests(pd_run: Path, report: str) -> None:
    done, summary = _tables(pd_run)
    row = _data(report, "fig-pd-ttft")["rows"][0]
    steps = {"pre-allocation wait": ("arrival_s", "prealloc_s"),
             "bootstrap": ("prealloc_s", "bootstrap_s"),
             "prefill queue": ("bootstrap_s", "prefill_admitted_s"),
             "prefill": ("prefill_admitted_s", "prefill_end_s"),
             "link wait": ("prefill_end_s", "transfer_start_s"),
             "KV transfer": ("transfer_start_s", "transfer_end_s"),
             "merge wait": ("transfer_end_s", "first_token_s")}  # fmt: skip
    for part, (a, b) in steps.items():
        assert row[part] == pytest.approx((done[b] - done[a]).mean(), rel=1e-5, abs=1e-9), part
    assert sum(row[p] for p in steps) == pytest.approx(row["ttft"], rel=1e-5)
    assert row["ttft"] == pytest.approx(summary["ttft_mean_s"], rel=1e-5)
    assert row["tpot"] == pytest.approx(summary["tpot_mean_s"], rel=1e-5)


def test_transfer_figure_is_the_links(pd_run: Path, report: str) -> None:
    done, summary = _tables(pd_run)
    data = _data(report, "fig-pd-transfer")
    s = data["runs"][0]
    duration = summary["sim_duration_s"]
    on_link = done["transfer_end_s"] - done["transfer_start_s"]
    # the links' mean busy share, integrated over the run: their total sending time / 2 links
    assert _integral(s, "busy_mean") == pytest.approx(on_link.sum() / 2, rel=1e-4)
    busiest = max(on_link[done["prefill_instance"] == i].sum() for i in range(2))
    assert _integral(s, "busy_max") >= busiest * (1 - 1e-4)
    assert max(v or 0 for v in s["busy_max"]) <= 1.0  # one FIFO per link
    assert _integral(s, "gb_s") == pytest.approx(done["transfer_bytes"].sum() / 1e9, rel=1e-4)
    pts = data["requests"][0]
    assert len(pts["mb"]) == len(done)
    assert sorted(pts["transfer_ms"]) == pytest.approx(sorted(on_link * 1e3), rel=1e-5)
    assert duration > 0


def test_occupancy_figure_is_the_requests_and_the_timeline(pd_run: Path, report: str) -> None:
    done, _ = _tables(pd_run)
    one = _data(report, "fig-pd-occupancy")["runs"][0]
    dec, pre = one["decode"]["requests"], one["prefill"]["requests"]
    # time-averaged counts integrate to the requests' time in each stage
    assert _integral(dec, "decoding") == pytest.approx(
        (done["finish_s"] - done["first_token_s"]).sum(), rel=1e-4)  # fmt: skip
    assert _integral(dec, "prealloc queue") == pytest.approx(
        (done["prealloc_s"] - done["arrival_s"]).sum(), rel=1e-4, abs=1e-6)  # fmt: skip
    assert _integral(pre, "waiting queue") == pytest.approx(
        (done["prefill_admitted_s"] - done["bootstrap_s"]).sum(), rel=1e-4)  # fmt: skip
    # the decode servers' HBM pool: the timeline's request tokens, per server, over its pool
    tl = pd.read_parquet(pd_run / "timeline.parquet")
    conf = json.loads((pd_run / "config.json").read_text())
    pool = conf["roles"]["decode"]["device_tokens"]
    end = one["decode"]["pools"]["t_s"][-1] + one["decode"]["pools"]["width_s"][-1]
    areas = []
    for _, g in tl[tl["role"] == "decode"].groupby("instance"):
        t = g["t_s"].to_numpy()
        dt = np.diff(np.append(t, end))
        areas.append(float((g["device_request_tokens"].to_numpy() * dt).sum()) / pool)
    got = _integral(one["decode"]["pools"], "requests")
    assert got == pytest.approx(np.mean(areas), rel=1e-3)
    # the timeline's own running count tracks the decoding stage (sampled per iteration)
    a = np.array([v or 0.0 for v in dec["decoding"]])
    b = np.array([v or 0.0 for v in dec["timeline"]])
    assert np.corrcoef(a, b)[0, 1] > 0.8


def test_per_role_tables(pd_run: Path, report: str) -> None:
    done, summary = _tables(pd_run)
    row = _data(report, "pd-roles")["rows"][0]
    pre, dec = summary["roles"]["prefill"], summary["roles"]["decode"]
    assert row["prefill"]["hit_rate"] == pre["hit_rate"] > 0
    assert row["prefill"]["queue_after_bootstrap_mean_s"] == pytest.approx(
        (done["prefill_admitted_s"] - done["bootstrap_s"]).mean())  # fmt: skip
    assert row["decode"]["radix_cache"] is True
    assert row["decode"]["hit_rate"] == dec["hit_rate"]
    assert row["decode"]["bootstrap_mean_s"] == pytest.approx(
        (done["bootstrap_s"] - done["prealloc_s"]).mean())  # fmt: skip
    saved = row["transfer"]["transfer_bytes_saved_per_rank"]
    assert saved == done["transfer_bytes_saved"].sum() > 0
    on_link = done["transfer_end_s"] - done["transfer_start_s"]
    assert row["transfer"]["link_busy_mean"] == pytest.approx(
        on_link.sum() / 2 / summary["sim_duration_s"])  # fmt: skip
    for title in ("Prefill role", "KV transfer", "Decode role"):
        assert f"<h3>{title}</h3>" in report
    assert f"{100 * dec['hit_rate']:.2f} %" in report  # the decode radix cache's hits


def test_a_report_mixing_pd_and_single_server_runs(pd_run: Path, tmp_path: Path) -> None:
    single = tmp_path / "single"
    assert main(["run", str(CONVERSATION), "--out", str(single), "--max-requests", "150",
                 "--set", "workload.rate_scale=0.5"]) == 0  # fmt: skip
    html = build_report([pd_run, single], tmp_path / "mixed.html").read_text("utf-8")
    labels = {r["run"] for r in _data(html, "fig-hitrate")["rows"]}
    assert any("PD 2P+2D" in x for x in labels) and any("single server" in x for x in labels)
    occ = [r["run"] for r in _data(html, "fig-occupancy")["runs"]]
    assert len(occ) == 1 and "single server" in occ[0]
    assert [r["run"] for r in _data(html, "fig-pd-occupancy")["runs"]] == [
        x for x in labels if "PD" in x]  # fmt: skip
    assert [r["run"] for r in _data(html, "fig-ttft-breakdown")["rows"]] == occ
    assert "a PD run does not count these defects" in html


def test_pd_report_renders_at_1400_px(report: str, tmp_path: Path) -> None:
    page = tmp_path / "probe.html"
    page.write_text(report.replace("</body>", PROBE), "utf-8")
    dom = run_chromium(tmp_path, f"--window-size={WIDTH},3000", "--dump-dom", page.as_uri())
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, dom[-2000:]
    probe = json.loads(m.group(1).replace("&quot;", '"'))
    assert probe["scroll"] <= WIDTH, probe
    assert probe["tables_overflowing"] == [], probe
