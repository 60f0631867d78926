"""The report as a reader gets it: every figure is an inline SVG that draws something, the
cache-only hit-rate study has its section when its rows are given, and, where a Chromium is on
PATH, the page renders to a non-blank screenshot at 1,400 px wide without horizontal overflow
(neither the page nor a table beside a figure needs a horizontal scrollbar). Without a
Chromium (CI may have none) the browser part is skipped; the rest always runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from studies.report import build_report

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "traces" / "data" / "synthetic" / "multiturn.jsonl"
FIGURES = ("fig-hitrate", "fig-hitrate-study", "fig-ttft-cdf", "fig-ttft-percentiles",
           "fig-ttft-breakdown", "fig-occupancy", "fig-pcie", "fig-writes")  # fmt: skip
#: SVG elements that put ink on the page (matplotlib draws with path, use and text).
DRAWING = {"path", "use", "text", "rect", "line", "polyline", "polygon", "circle", "image"}
WIDTH = 1400


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three tiny timed runs (40 requests, small HBM pools): two write policies and no host
    tier, so that host hits, copies and the no-host case all show."""
    from hicache.config import load_config
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(TRACE)
    out = tmp_path_factory.mktemp("runs")
    dirs = []
    # three keys differ: labels as long as a sweep's ("write_through_selective · lfu · device=4096")
    setups = {
        "wts": ["cache.write_policy=write_through_selective", "cache.eviction=lfu",
                "gpu.device_tokens=4096"],
        "wb": ["cache.write_policy=write_back", "gpu.device_tokens=8192"],
        "none": ["cache.enable_host=false", "gpu.device_tokens=4096"],
    }  # fmt: skip
    for name, extra in setups.items():
        cfg = load_config(None, ["workload.max_requests=40", *extra])
        run_simulation(cfg, trace, out / name, progress=False)
        dirs.append(out / name)
    return dirs


@pytest.fixture(scope="module")
def hitrate_rows() -> list[dict[str, Any]]:
    """A small cache-only grid: two device pools x (two write policies, no host tier)."""
    from sim.hitrate import HitRateConfig
    from studies.sweep import run_hitrate_grid
    from traces.io import read_trace
    from traces.stats import infinite_capacity_hit_rate

    trace = read_trace(TRACE)
    configs = [
        HitRateConfig(dev, host, 64, "lru", wp)
        for dev in (4096, 16384)
        for wp, host in (
            ("write_through", 2 * dev),
            ("write_back", 2 * dev),
            ("write_through", 0),
        )
    ]
    rows = run_hitrate_grid(trace, configs, jobs=1, progress=False)
    inf = infinite_capacity_hit_rate(trace, 64)
    for r in rows:
        r["infinite_capacity_hit_rate"] = inf
        r["policy"] = r["write_policy"] if r["host_tokens"] else "no host tier"
    return rows


@pytest.fixture(scope="module")
def report_path(
    runs: list[Path], hitrate_rows: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    return build_report(runs, out, hitrate_rows=hitrate_rows, hitrate_title="multiturn (page 64)")


class Svgs(HTMLParser):
    """Per ``<section id=...>``: how many ``<svg>`` elements it holds and how many drawing
    elements are inside them; and the ids of all sections."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.svgs: dict[str, int] = {}
        self.ink: dict[str, int] = {}
        self._section = ""
        self._depth = 0  # open <svg> elements

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self._section = dict(attrs).get("id") or ""
            self.sections.append(self._section)
        elif tag == "svg":
            self._depth += 1
            self.svgs[self._section] = self.svgs.get(self._section, 0) + 1
        elif self._depth and tag in DRAWING:
            self.ink[self._section] = self.ink.get(self._section, 0) + 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag == "svg":
            self._depth -= 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._depth -= 1


def test_every_figure_is_an_svg_that_draws(report_path: Path) -> None:
    html = report_path.read_text(encoding="utf-8")
    parser = Svgs()
    parser.feed(html)
    assert [s for s in parser.sections if s.startswith("fig-")] == list(FIGURES)
    for fig_id in FIGURES:
        assert parser.svgs.get(fig_id) == 1, fig_id
        assert parser.ink.get(fig_id, 0) >= 20, (fig_id, parser.ink.get(fig_id))
    # the figure shows at its natural width (text the same size in every figure), at most
    # the page's
    for width in re.findall(r'<figure style="width:(\d+)px">', html):
        assert 400 <= int(width) <= 1500


def test_the_hit_rate_study_has_its_section(
    report_path: Path, runs: list[Path], hitrate_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    html = report_path.read_text(encoding="utf-8")
    m = re.search(r'<section id="fig-hitrate-study">(.*?)</section>', html, re.S)
    assert m
    section = m.group(1)
    assert "infinite-capacity hit rate" in section and "multiturn (page 64)" in section
    for policy in ("write_through", "write_back", "no host tier"):
        assert section.count(f">{policy}</td>") == 2  # a table row per device pool
    assert '<a href="#fig-hitrate-study">' in html
    # without rows, no such section; with the same rows again, the same bytes
    plain = build_report(runs, tmp_path / "plain.html").read_text(encoding="utf-8")
    assert "fig-hitrate-study" not in plain and '<section id="fig-hitrate">' in plain
    again = build_report(runs, tmp_path / "again.html", hitrate_rows=hitrate_rows,
                         hitrate_title="multiturn (page 64)")  # fmt: skip
    assert again.read_bytes() == report_path.read_bytes()


def test_the_study_notes_that_write_back_ignores_hit_counts(
    runs: list[Path], hitrate_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    from sim.hitrate import write_back_ignores_hit_counts

    def study(rows: list[dict[str, Any]]) -> str:
        html = build_report(runs, tmp_path / "r.html", hitrate_rows=rows).read_text("utf-8")
        m = re.search(r'<section id="fig-hitrate-study">(.*?)</section>', html, re.S)
        assert m
        return m.group(1)

    assert '<p class="note">' not in study(hitrate_rows)  # LRU only: nothing to note
    # the same rows once more as LFU (under write_back SGLang counts no hits: LFU = LRU)
    both = hitrate_rows + [{**r, "eviction": "lfu", "policy": f"{r['policy']} · lfu"}
                           for r in hitrate_rows]  # fmt: skip
    note = write_back_ignores_hit_counts(both)
    assert note
    assert f'<p class="note">{html_escape(note)}</p>' in study(both)


# --- in a real browser (skipped without one) -------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH")


def run_chromium(tmp_path: Path, *args: str) -> str:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}", *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    return done.stdout


#: Appended to a copy of the report: writes the page's and each table box's overflow into
#: the DOM, for --dump-dom.
PROBE = """<script>
const over = [...document.querySelectorAll("div.numbers, div.wide")]
  .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.closest("section").id);
document.body.setAttribute("data-probe", JSON.stringify({
  scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth,
  tables_overflowing: over}));
</script></body>"""


def test_renders_without_horizontal_overflow_at_1400_px(report_path: Path, tmp_path: Path) -> None:
    page = tmp_path / "probe.html"
    page.write_text(report_path.read_text(encoding="utf-8").replace("</body>", PROBE), "utf-8")
    dom = run_chromium(tmp_path, f"--window-size={WIDTH},3000", "--dump-dom", page.as_uri())
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, dom[-2000:]
    probe = json.loads(m.group(1).replace("&quot;", '"'))
    assert probe["client"] == WIDTH
    assert probe["scroll"] <= WIDTH, probe
    assert probe["tables_overflowing"] == [], probe


def test_screenshot_is_not_blank(report_path: Path, tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image")
    shot = tmp_path / "report.png"
    run_chromium(tmp_path, f"--window-size={WIDTH},4000", f"--screenshot={shot}",
                 report_path.as_uri())  # fmt: skip
    assert shot.is_file(), "chromium wrote no screenshot"
    img = image.open(shot).convert("RGB")
    assert img.size == (WIDTH, 4000)
    pixels = np.asarray(img.resize((140, 400))).reshape(-1, 3)
    inked = int((pixels.min(axis=1) < 200).sum())
    assert inked > 0.03 * len(pixels)  # text, axes and bars, not a white page
    assert len(np.unique(pixels, axis=0)) > 50  # and in colour: the figures drew
