"""Issue 27 item 3: ``hicache-sim compare-metrics RUN BEFORE.prom AFTER.prom`` against
scrapes printed as an SGLang 0.5.23 server prints its ``/metrics``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from cli.main import main
from sim.prom import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, render, run_families
from tests.test_metrics_prom import _frames

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


class Server:
    """The metrics an SGLang 0.5.23 server registers (observability/metrics_collector.py:
    names, label names, buckets), on a registry of their own, observed request by request
    as ``TokenizerMetricsCollector.observe_one_finished_request`` does; two TP ranks."""

    def __init__(self) -> None:
        self.reg = CollectorRegistry()
        tok, stream = ["model_name", "engine_type"], ["model_name", "engine_type", "is_streaming"]
        self.labels = {"model_name": MODEL, "engine_type": "unified"}
        self.stream = {**self.labels, "is_streaming": "true"}
        r = self.reg
        self.requests = Counter("sglang:num_requests_total", "Number of requests processed.",
                                stream, registry=r)  # fmt: skip
        self.prompt = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                              stream, registry=r)  # fmt: skip
        doc = "Number of generation tokens processed."
        self.gen = Counter("sglang:generation_tokens_total", doc, stream, registry=r)
        self.cached = Counter("sglang:cached_tokens_total",
                              "Number of cached prompt tokens by source (device/host/storage).",
                              [*tok, "cache_source"], registry=r)  # fmt: skip
        self.ttft = Histogram("sglang:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", stream,
                              buckets=TTFT_BUCKETS, registry=r)  # fmt: skip
        self.itl = Histogram("sglang:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", tok,
                             buckets=ITL_BUCKETS, registry=r)  # fmt: skip
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", stream,
                             buckets=E2E_BUCKETS, registry=r)  # fmt: skip
        cache = ["cache_type", "tp_rank", "pp_rank", "dp_rank"]
        self.load_back = Counter("sglang:load_back_tokens_total", "The number of tokens loaded "
                                 "back from local host DRAM (L2) to GPU, by host pool (kv, swa, "
                                 "mamba, ...).", [*cache, "pool"], registry=r)  # fmt: skip
        self.pool = Gauge("sglang:max_total_num_tokens",
                          "Maximum total number of tokens in the KV cache pool.",
                          [*tok, "tp_rank", "pp_rank", "moe_ep_rank"], registry=r)  # fmt: skip
        for rank in ("0", "1"):
            self.pool.labels(**self.labels, tp_rank=rank, pp_rank="0", moe_ep_rank="0").set(70000)
        # process metrics a real scrape has beside SGLang's
        Counter("process_cpu_seconds", "Total user and system CPU time.", registry=r).inc(3.5)

    def finish(
        self, prompt: int, out: int, device: int, host: int, ttft: float, e2e: float
    ) -> None:
        self.requests.labels(**self.stream).inc()
        self.prompt.labels(**self.stream).inc(prompt)
        self.gen.labels(**self.stream).inc(out)
        for src, v in (("device", device), ("host", host)):
            if v:
                self.cached.labels(**self.labels, cache_source=src).inc(v)
        self.ttft.labels(**self.stream).observe(ttft)
        for _ in range(out - 1):
            self.itl.labels(**self.labels).observe((e2e - ttft) / (out - 1))
        self.e2e.labels(**self.stream).observe(e2e)

    def load(self, tokens: int) -> None:
        for rank in ("0", "1"):  # every TP rank reports the same count
            self.load_back.labels(cache_type="UnifiedRadixCache", tp_rank=rank, pp_rank="0",
                                  dp_rank="0", pool="kv").inc(tokens)  # fmt: skip

    def scrape(self) -> str:
        return generate_latest(self.reg).decode()


@pytest.fixture
def scrapes(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(run directory, BEFORE, AFTER): the run is the frames of test_metrics_prom (3 finished
    requests: 3,400 prompt tokens, 768 device + 256 host + 128 L3 cached, TTFT 0.05/0.3/0.5 s);
    the server finished 2 requests before the benchmark and 3 during it."""
    run = tmp_path / "run"
    run.mkdir()
    req, tr = _frames("0.5.23")
    fams = run_families(req, tr, sglang_version="0.5.23", model_name="llama-3-8b",
                        page_size=128, device_tokens=65536, host_tokens=131072)  # fmt: skip
    (run / "metrics.prom").write_text(render(fams))
    (run / "summary.json").write_text(json.dumps({"sglang_version": "0.5.23"}))
    s = Server()
    s.finish(5000, 10, 0, 0, ttft=5.0, e2e=9.0)  # before the benchmark: not compared
    s.finish(3000, 10, 1000, 0, ttft=3.0, e2e=4.0)
    s.load(10000)
    before = tmp_path / "before.prom"
    before.write_text(s.scrape())
    s.finish(1000, 5, 0, 0, ttft=0.05, e2e=0.45)
    s.finish(2000, 11, 500, 300, ttft=0.15, e2e=1.15)
    s.finish(500, 1, 200, 0, ttft=0.7, e2e=0.7)
    s.load(256)
    after = tmp_path / "after.prom"
    after.write_text(s.scrape())
    return run, before, after


def _line(text: str, what: str) -> str:
    (line,) = [x for x in text.splitlines() if x.strip().startswith(what)]
    return " ".join(line.split()[len(what.split()) :])


def test_prints_simulator_beside_the_server_tier_by_tier(
    scrapes: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run, before, after = scrapes
    assert main(["compare-metrics", str(run), str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert _line(out, "finished requests") == "3 3 +0 (+0.0%)"
    assert _line(out, "prompt tokens") == "3,400 3,500 -100 (-2.9%)"
    assert _line(out, "output tokens") == "17 17 +0 (+0.0%)"
    assert _line(out, "cached tokens: device") == "768 700 +68 (+9.7%)"
    assert _line(out, "cached tokens: host") == "256 300 -44 (-14.7%)"
    assert _line(out, "cached tokens: storage (L3)") == "128 0 +128"
    # 1,152 / 3,400 against 1,000 / 3,500
    assert _line(out, "hit rate, all tiers") == "33.9% 28.6% +5.3 pt"
    # TTFT p50: rank 1.5 of 3; simulator in (0.2, 0.4] -> 0.3, server in (0.1, 0.2] -> 0.15
    assert _line(out, "TTFT p50") == "300.0 ms 150.0 ms +150.0 ms (+100.0%)"
    assert _line(out, "TTFT mean") == "283.3 ms 300.0 ms -16.7 ms (-5.6%)"
    # each request's inter-token latency is 0.1 s on both sides
    assert _line(out, "inter-token latency mean") == "100.0 ms 100.0 ms +0.0 ms (+0.0%)"
    # read on one TP rank: 256, not 512; the server's 10,000 before the benchmark left out
    assert _line(out, "load-back tokens, host -> device") == "384 256 +128 (+50.0%)"
    assert _line(out, "device pool tokens (max_total_num_tokens)") == "65,536 70,000 -4,464 (-6.4%)"
    assert "TPOT per request mean (0.5.23)" in out  # the server did not export it: "-"
    assert _line(out, "TPOT per request mean (0.5.23)").split()[-2:] == ["-", "-"]


def test_json(scrapes: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run, before, after = scrapes
    assert main(["compare-metrics", str(run), str(before), str(after), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in got["rows"] if "key" in r}
    assert got["server_looks_like"] == "0.5.23" and got["simulated_sglang_version"] == "0.5.23"
    assert rows["prompt_tokens"] == {"key": "prompt_tokens", "what": "prompt tokens",
                                     "unit": "count", "simulator": 3400.0, "server": 3500.0,
                                     "difference": -100.0, "relative": -100 / 3500}  # fmt: skip
    assert rows["device_hit_rate"]["server"] == pytest.approx(700 / 3500)
    assert rows["ttft_p50_s"]["difference"] == pytest.approx(0.15)
    assert rows["tpot_mean_s"]["server"] is None and rows["tpot_mean_s"]["difference"] is None


def _err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["compare-metrics", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_errors_are_one_line(
    scrapes: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, before, after = scrapes
    missing = tmp_path / "nope.prom"
    assert _err([str(run), str(missing), str(after)], capsys) == (
        f"hicache-sim: {missing}: no such file"
    )
    other = tmp_path / "node.prom"
    other.write_text("# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\n"
                     "node_load1 0.5\n")  # fmt: skip
    assert "no SGLang metrics (sglang:...)" in _err([str(run), str(other), str(after)], capsys)
    # swapped: the counters went down (what a restart between the scrapes also gives)
    msg = _err([str(run), str(after), str(before)], capsys)
    assert "went down from" in msg and "same server run" in msg
    assert "no request finished" in _err([str(run), str(after), str(after)], capsys)
    bad = tmp_path / "bad.prom"
    bad.write_text('sglang:num_requests_total{model_name="m" 3\n')
    assert "not a Prometheus text scrape" in _err([str(run), str(bad), str(after)], capsys)
    empty_run = tmp_path / "empty"
    empty_run.mkdir()
    assert "no metrics.prom" in _err([str(empty_run), str(before), str(after)], capsys)
    assert "not a run directory" in _err([str(missing), str(before), str(after)], capsys)
    pd_run = tmp_path / "pd"
    pd_run.mkdir()
    (pd_run / "summary.json").write_text('{"pd": true, "roles": {}}')
    assert "--engine-type prefill or --engine-type decode" in _err(
        [str(pd_run), str(before), str(after)], capsys
    )
    msg = _err([str(pd_run), str(before), str(after), "--engine-type", "decode"], capsys)
    assert "made before PD runs wrote metrics.prom" in msg
    assert "is for a prefill/decode" in _err(
        [str(run), str(before), str(after), "--engine-type", "decode"], capsys
    )
