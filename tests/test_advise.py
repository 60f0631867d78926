"""``hicache-sim advise``: each answer follows from the runs it names, the page renders in a
browser, and every report starts with its verdict."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cli.main import main
from hicache.config import load_config
from studies.advise import advise
from traces.io import read_trace

ROOT = Path(__file__).resolve().parent.parent
MULTI = ROOT / "traces" / "data" / "synthetic" / "multiturn.jsonl"
CONV = ROOT / "traces" / "data" / "mooncake" / "conversation_trace.jsonl"
QUESTIONS = ("Will HiCache help?", "How big a host pool per rank fits the server?",
             "Which write policy?", "Is L3 faster than recompute here?",
             "What does enabling HiCache cost when nothing hits?", "Which router?",
             "What does it change for TTFT?", "What will SGLang's own metrics show?")  # fmt: skip


def test_the_answers_follow_from_their_runs() -> None:
    """A 16k-token pool on a multi-turn trace: the working set is larger, the host tier adds
    hits, the chosen policy is the best of the three, the host pool fits the server."""
    cfg = load_config(None, ["gpu.device_tokens=16384", "workload.max_requests=80"])
    advice = advise(cfg, read_trace(MULTI), jobs=1, timed=False)
    by = {a.question: a for a in advice.answers}
    cache = advice.facts["cache_only"]
    gain = cache[by["Which write policy?"].verdict]["hit_rate"] - cache["no host tier"]["hit_rate"]
    assert advice.facts["working_set_tokens"] > 16384
    assert by["Will HiCache help?"].verdict == ("yes" if gain >= 0.02 else "no")
    best = max(("write_through", "write_through_selective", "write_back"),
               key=lambda p: round(cache[p]["hit_rate"], 3))  # fmt: skip
    assert cache[by["Which write policy?"].verdict]["hit_rate"] == pytest.approx(
        cache[best]["hit_rate"], abs=5e-4
    )
    host_bytes = advice.facts["host_tokens"] * advice.facts["kv_bytes_per_token_per_rank"]
    assert host_bytes <= advice.facts["host_fit_bytes_per_rank"]
    assert "at TP1 SGLang 0.5.23 runs no per-step HiCache checks" in (
        by["What does enabling HiCache cost when nothing hits?"].answer
    )
    assert 'sglang:cached_tokens_total{cache_source="host"}' in (
        by["What will SGLang's own metrics show?"].answer
    )
    assert "What does it change for TTFT?" not in by  # --no-timed


def test_a_working_set_that_fits_in_hbm_gets_a_no() -> None:
    """sgl-project/sglang#7059: when the whole working set fits in HBM, a host tier adds
    nothing; the verdict says no and why."""
    cfg = load_config(None, ["gpu.device_tokens=4194304", "workload.max_requests=80"])
    advice = advise(cfg, read_trace(MULTI), jobs=1, timed=False)
    help_ = advice.answers[0]
    assert help_.verdict == "no" and "fits in the device pool" in help_.answer


def test_tp2_counts_the_checks_and_the_cli_writes_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "advice"
    argv = ["advise", str(MULTI), "--max-requests", "60", "--set", "gpu.device_tokens=16384",
            "--sglang-args", "--tp-size 2", "--jobs", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    for q in QUESTIONS:
        assert q in text
    assert "150 us per decode step" in text  # 0.5.23 at TP2: one check per step (forward.py)
    data = json.loads((out / "advise.json").read_text())
    assert [a["question"] for a in data["answers"]] == list(QUESTIONS)
    page = (out / "advise.html").read_text()
    assert page.index("Will HiCache help?") < page.index("Which write policy?")
    assert main(argv) == 2  # the folder is not overwritten without --force


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium on PATH")


def test_the_page_reads_at_1400_px_in_a_browser(tmp_path: Path) -> None:
    """advise on the bundled conversation trace (a slice), opened in headless Chromium at
    1,400 px: every question is on the page, in order, and nothing overflows sideways."""
    browser = _chromium()
    out = tmp_path / "advice"
    assert main(["advise", str(CONV), "--max-requests", "300", "--jobs", "1", "--no-timed",
                 "--out", str(out)]) == 0  # fmt: skip
    page = out / "advise.html"
    script = (
        "<script>document.body.setAttribute('data-probe', JSON.stringify({scroll: "
        "document.documentElement.scrollWidth, text: document.body.innerText}));</script>"
    )
    probe = page.read_text().replace("</body>", script + "</body>")
    shown = tmp_path / "probe.html"
    shown.write_text(probe)
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--disable-background-networking", f"--user-data-dir={tmp_path / 'p'}",
           "--window-size=1400,2000", "--dump-dom", shown.as_uri()]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False).stdout
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, dom[-1000:]
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert got["scroll"] <= 1400
    positions = [got["text"].find(q.replace("'", "'")) for q in QUESTIONS[:6]]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)


def test_every_report_starts_with_its_verdict(tmp_path: Path) -> None:
    from studies.report import build_report

    for name, sets in (("plain", ["cache.enable_host=false"]), ("hicache", [])):
        argv = [
            "run",
            str(MULTI),
            "--out",
            str(tmp_path / name),
            "--max-requests",
            "60",
            "--set",
            "gpu.device_tokens=16384",
        ] + [a for s in sets for a in ("--set", s)]
        assert main(argv) == 0
    out = build_report([tmp_path / "plain", tmp_path / "hicache"], tmp_path / "r.html")
    page = Path(out).read_text()
    verdict = page[page.index('<section id="verdict">') :]
    assert page.index('id="verdict"') < page.index("<nav>")
    assert "Highest hit rate:" in verdict and "HiCache against no host tier: hit rate" in verdict
