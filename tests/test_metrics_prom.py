"""Issue 27 item 3: ``metrics.prom`` (SGLang's Prometheus names, labels and buckets for a run)
and the per-request ``cached_tokens*`` columns."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from cli.main import main
from sim.metrics import REQUEST_COLUMNS, RequestRow, TransferRow, request_frame
from sim.prom import (
    TTFT_BUCKETS,
    Family,
    go_float,
    histogram_quantile,
    render,
    run_families,
)

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
TRACE = DATA / "synthetic" / "multiturn.jsonl"


def _rows() -> list[RequestRow]:
    # rid, arrival, admitted, first token, finish, prefill, stall, prompt, outputs, device hit,
    # host hit, host hit recomputed, computed, retractions, L3 hit, prefetch wait
    return [
        RequestRow(0, 0.0, 0.0, 0.05, 0.45, 0.05, 0.0, 1000, 5, 0, 0, 0, 1000, 0, 0),
        RequestRow(1, 1.0, 1.0, 1.3, 2.3, 0.1, 0.0, 2000, 11, 512, 256, 0, 1232, 1, 128),
        RequestRow(2, 2.0, 2.1, 2.5, 2.5, 0.1, 0.0, 400, 1, 256, 0, 64, 144, 0, 0),
        RequestRow(3, 3.0, -1.0, -1.0, -1.0, 0.0, 0.0, 90000, 4, 0, 0, 0, 0, 0, 0),  # rejected
    ]


def _frames(version: str = "0.5.23") -> tuple[pd.DataFrame, pd.DataFrame]:
    from sim.metrics import sglang_cached_tokens

    req = request_frame(_rows())
    req = req.assign(**sglang_cached_tokens(req, version))
    copies = [
        TransferRow("d2h", "write", 4096, 4, 1, 0.4, 0.4, 0.5),
        TransferRow("h2d", "load", 2048, 2, 1, 1.1, 1.1, 1.2),
        TransferRow("h2d", "load", 1024, 1, 1, 2.2, 2.2, 2.25),
    ]
    return req, pd.DataFrame(copies, columns=list(TransferRow._fields))


def _families(version: str = "0.5.23", **kw: Any) -> list[Family]:
    req, tr = _frames(version)
    args: dict[str, Any] = dict(sglang_version=version, model_name="llama-3-8b", page_size=128,
                                device_tokens=65536, host_tokens=131072)  # fmt: skip
    return run_families(req, tr, **(args | kw))


def _parse(text: str) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _one(samples: list[Any], name: str, **labels: str) -> float:
    got = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(got) == 1, (name, labels, got)
    return float(got[0])


# --------------------------------------------------------------------------- columns --
def test_cached_tokens_columns_follow_each_version() -> None:
    from sim.metrics import SGLANG_CACHED_COLUMNS, sglang_cached_tokens

    req = request_frame(_rows())
    assert tuple(REQUEST_COLUMNS[-4:]) == SGLANG_CACHED_COLUMNS
    assert list(req.columns) == list(REQUEST_COLUMNS)
    # 0.5.23 (the default): what came from where; the parts add up to cached_tokens
    assert req["cached_tokens"].tolist() == [0, 512 + 256 + 128, 256, 0]
    assert req["cached_tokens_device"].tolist() == [0, 512, 256, 0]
    assert req["cached_tokens_host"].tolist() == [0, 256, 0, 0]
    assert req["cached_tokens_storage"].tolist() == [0, 128, 0, 0]
    # 0.5.14: request 2's 64 matched host tokens were not loaded (recomputed), yet SGLang
    # reports them as host and takes them off device (host_total = matched host hit)
    old = sglang_cached_tokens(req, "0.5.14")
    assert old["cached_tokens"].tolist() == [0, 896, 256, 0]
    assert old["cached_tokens_device"].tolist() == [0, 512, 256 - 64, 0]
    assert old["cached_tokens_host"].tolist() == [0, 256, 64, 0]
    assert old["cached_tokens_storage"].tolist() == [0, 128, 0, 0]


# ---------------------------------------------------------------------------- format --
def test_render_is_what_prometheus_client_prints() -> None:
    fams = _families("0.5.23", storage={"backend": "file", "prefetched_tokens": 384,
                                        "backed_up_tokens": 1024})  # fmt: skip

    class Same:
        def collect(self) -> Any:
            for f in fams:
                base = f.name[: -len("_total")] if f.type == "counter" else f.name
                m = Metric(base, f.help, f.type)
                for name, labels, value in f.samples:
                    m.add_sample(name, labels, value)
                yield m

    reg = CollectorRegistry()
    reg.register(Same())
    assert render(fams) == generate_latest(reg).decode()
    assert go_float(12345678.0) == "1.2345678e+07" and go_float(1e6) == "1e+06"
    assert go_float(0.1) == "0.1" and go_float(400) == "400.0" and go_float(math.inf) == "+Inf"


def test_counters_and_histograms_of_the_frames() -> None:
    text = render(_families("0.5.23"))
    got = _parse(text)
    # the three finished requests (the rejected one is no finished request)
    assert _one(got["sglang:num_requests"], "sglang:num_requests_total", is_streaming="true") == 3
    assert _one(got["sglang:prompt_tokens"], "sglang:prompt_tokens_total") == 3400
    assert _one(got["sglang:generation_tokens"], "sglang:generation_tokens_total") == 17
    cached = got["sglang:cached_tokens"]
    assert {s.labels["cache_source"]: s.value for s in cached} == {"device": 768.0, "host": 256.0,
                                                                   "storage": 128.0}  # fmt: skip
    ttft = got["sglang:time_to_first_token_seconds"]
    assert _one(ttft, "sglang:time_to_first_token_seconds_count") == 3
    assert _one(ttft, "sglang:time_to_first_token_seconds_sum") == pytest.approx(0.05 + 0.3 + 0.5)
    buckets = [s for s in ttft if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets] == [go_float(b) for b in TTFT_BUCKETS] + ["+Inf"]
    assert [s.value for s in buckets][:4] == [1.0, 1.0, 2.0, 3.0]  # 0.05 | 0.3 | 0.5
    assert all(a.value <= b.value for a, b in itertools.pairwise(buckets))
    # ITL: each request's outputs - 1 tokens at its mean TPOT; sum = the decode time
    itl = got["sglang:inter_token_latency_seconds"]
    assert _one(itl, "sglang:inter_token_latency_seconds_count") == 4 + 10
    assert _one(itl, "sglang:inter_token_latency_seconds_sum") == pytest.approx(0.4 + 1.0)
    assert _one(itl, "sglang:inter_token_latency_seconds_bucket", le="0.1") == 14  # 0.1 each
    assert _one(itl, "sglang:inter_token_latency_seconds_bucket", le="0.08") == 0
    tpot = got["sglang:request_time_per_output_token_seconds"]
    assert _one(tpot, "sglang:request_time_per_output_token_seconds_count") == 2
    unc = got["sglang:uncached_prompt_tokens_histogram"]
    assert _one(unc, "sglang:uncached_prompt_tokens_histogram_sum") == 3400 - 896 - 256
    # copies: pages x page size; bytes as moved
    assert _one(got["sglang:load_back_tokens"], "sglang:load_back_tokens_total", pool="kv") == 384
    assert _one(got["sglang:load_back_bytes"], "sglang:load_back_bytes_total") == 3072
    assert _one(got["sglang:hicache_backup_tokens"], "sglang:hicache_backup_tokens_total") == 512
    assert _one(got["sglang:num_retracted_requests"], "sglang:num_retracted_requests_total") == 1
    assert _one(got["sglang:max_total_num_tokens"], "sglang:max_total_num_tokens") == 65536


def test_names_and_labels_per_version() -> None:
    new = _parse(render(_families("0.5.23", storage={"backend": "file"})))
    old = _parse(render(_families("0.5.14", storage={"backend": "file"})))
    n = new["sglang:num_requests"][0].labels
    assert n == {"model_name": "llama-3-8b", "engine_type": "unified", "is_streaming": "true"}
    assert old["sglang:num_requests"][0].labels == {"model_name": "llama-3-8b",
                                                    "engine_type": "unified"}  # fmt: skip
    assert "sglang:request_time_per_output_token_seconds" in new
    assert "sglang:request_time_per_output_token_seconds" not in old
    for name in ("sglang:hicache_backup_tokens", "sglang:load_back_bytes"):
        assert name in new and name not in old
    # L3 hits: "storage" (0.5.23), "storage_<backend class>" (0.5.14)
    assert {s.labels["cache_source"] for s in new["sglang:cached_tokens"]} >= {"storage"}
    assert {s.labels["cache_source"] for s in old["sglang:cached_tokens"]} >= {
        "storage_HiCacheFile"
    }
    # 0.5.14 reports request 2's recomputed host hit as host: 256 + 64
    host = [s.value for s in old["sglang:cached_tokens"] if s.labels["cache_source"] == "host"]
    assert host == [320.0]
    assert old["sglang:load_back_tokens"][0].labels == {"cache_type": "HiRadixCache"}
    assert new["sglang:load_back_tokens"][0].labels == {
        "cache_type": "UnifiedRadixCache", "dp_rank": "0", "pp_rank": "0", "tp_rank": "0",
        "pool": "kv",
    }  # fmt: skip


def test_histogram_quantile_as_prometheus() -> None:
    b = [(0.1, 2.0), (0.2, 6.0), (0.4, 8.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, b) == pytest.approx(0.1 + 0.1 * (5 - 2) / 4)
    assert histogram_quantile(0.1, b) == pytest.approx(0.1 * 1 / 2)
    assert histogram_quantile(0.8, b) == pytest.approx(0.4)
    assert histogram_quantile(0.95, b) == 0.4  # in the +Inf bucket: the highest finite bound
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))


# ------------------------------------------------------------------------------- run --
def test_a_run_writes_metrics_prom_equal_to_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rc = main(["run", str(TRACE), "--out", str(out), "--set", "gpu.device_tokens=65536",
               "--set", "workload.warmup_s=5", "--set", "workload.max_requests=80"])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    req = pd.read_parquet(out / "requests.parquet")
    assert summary["warmup_requests"] > 0
    measured = req[~req["warmup"] & (req["finish_s"] >= 0)]
    assert len(measured) == summary["finished_requests"] < len(req)
    got = _parse((out / "metrics.prom").read_text())
    n = _one(got["sglang:num_requests"], "sglang:num_requests_total")
    assert n == summary["finished_requests"]
    prompt = _one(got["sglang:prompt_tokens"], "sglang:prompt_tokens_total")
    assert prompt == summary["prompt_tokens"] == measured["prompt_tokens"].sum()
    gen = _one(got["sglang:generation_tokens"], "sglang:generation_tokens_total")
    assert gen == measured["output_tokens"].sum()
    dev = _one(got["sglang:cached_tokens"], "sglang:cached_tokens_total", cache_source="device")
    assert dev == measured["cached_tokens_device"].sum()
    assert dev / prompt == pytest.approx(summary["device_hit_rate"])
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        samples = got[f"sglang:{hist}"]
        buckets = [s.value for s in samples if s.name.endswith("_bucket")]
        assert buckets == sorted(buckets) and buckets[-1] == n
        assert _one(samples, f"sglang:{hist}_count") == n
    ttft_sum = _one(got["sglang:time_to_first_token_seconds"],
                    "sglang:time_to_first_token_seconds_sum")  # fmt: skip
    assert ttft_sum / n == pytest.approx(summary["ttft_mean_s"])
    conf = json.loads((out / "config.json").read_text())
    assert (
        _one(got["sglang:max_total_num_tokens"], "sglang:max_total_num_tokens")
        == (conf["device_tokens"])
    )
    # the backups that started after the window, as summary.json's bytes_d2h
    backup = _one(got["sglang:hicache_backup_bytes"], "sglang:hicache_backup_bytes_total")
    assert backup == summary["bytes_d2h"]
