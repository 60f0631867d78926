"""`trace convert --from bench-serving` (bench_serving --output-details results) and
`--from bench-multiturn` (bench_multiturn performance logs), on fixtures made here with the
fields SGLang 0.5.23's bench_serving and benchmark/hicache/bench_multiturn.py write."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.test_import_common import one_line_error, roundtrip
from traces.generate import multiturn
from traces.io import read_trace


def bench_serving_result(n: int, rate: float, *, failed: tuple[int, ...] = ()) -> dict[str, Any]:
    """One bench_serving run as --output-details writes it: settings, metrics, and the
    per-request lists (request i: 100 + 10 i prompt tokens, 5 + i output tokens)."""
    return {
        "tag": None,
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": rate,
        "max_concurrency": 8,
        "duration": 12.5,
        "completed": n - len(failed),
        "total_input_tokens": sum(100 + 10 * i for i in range(n)),
        "mean_ttft_ms": 20.0,
        "input_lens": [100 + 10 * i for i in range(n)],
        "output_lens": [0 if i in failed else 5 + i for i in range(n)],
        "ttfts": [0.02] * n,
        "itls": [[0.01] * 4] * n,
        "generated_texts": ["x"] * n,
        "errors": ["timeout" if i in failed else "" for i in range(n)],
    }


def test_bench_serving_runs_lengths_and_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "sglang_0101_30_random.jsonl"
    runs = [bench_serving_result(10, 4.0, failed=(3,)), bench_serving_result(20, math.inf)]
    src.write_text("".join(json.dumps(r) + "\n" for r in runs))  # inf is written as Infinity
    out = tmp_path / "bs.jsonl"
    assert main(["trace", "convert", str(src), str(out), "--block-size", "64"]) == 0
    printed = capsys.readouterr().out
    assert "29 requests" in printed and "no prompt tokens" in printed
    trace = read_trace(out)
    reqs = list(trace.requests)
    assert trace.header.extra["failed_requests_left_out"] == 1 and trace.header.extra["runs"] == 2
    # run 0 at 4 req/s (request 3 failed), run 1 (rate inf) all at run 0's start + duration
    assert [r.timestamp for r in reqs[:9]] == [0, 250, 500, 1000, 1250, 1500, 1750, 2000, 2250]
    assert {r.timestamp for r in reqs[9:]} == {12500.0}
    assert [r.input_length for r in reqs[:4]] == [100, 110, 120, 140]
    assert [r.output_length for r in reqs[:4]] == [5, 6, 7, 9]
    ids = [h for r in reqs for h in r.hash_ids or []]
    assert len(ids) == len(set(ids))  # no prefix information: nothing shared
    stats = roundtrip(out, tmp_path, capsys, requests=29)
    assert stats["prefix_cache"]["infinite_capacity_hit_rate"]["64"] == 0.0  # type: ignore[index]


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (lambda r: r.pop("output_lens"), "line", "--output-details"),
        (lambda r: r["input_lens"].__setitem__(2, 0), "input_lens[2]", "integer >= 1"),
        (lambda r: r["output_lens"].pop(), "output_lens", "differ in length"),
        (lambda r: r.update({"request_rate": -1}), "request_rate", "rate > 0"),
    ],
)  # fmt: skip
def test_bench_serving_malformed_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, field: str, says: str
) -> None:
    bad = bench_serving_result(4, 2.0)
    change(bad)
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(bench_serving_result(4, 2.0)) + "\n" + json.dumps(bad) + "\n")
    cmd = ["trace", "convert", str(src), str(tmp_path / "o.jsonl"), "--from", "bench-serving"]
    assert main(cmd) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["path"], m["line"], m["field"]) == (str(src), "2", field) and says in m["problem"]


def multiturn_log_line(total: int, rate: float) -> dict[str, Any]:
    """A bench_multiturn log line (log_to_jsonl_file: timestamp, tag, summary)."""
    summary = {"total_requests": total, "request_rate": rate, "average_ttft": 0.1,
               "p90_ttft": 0.2, "median_ttft": 0.1, "average_latency": 1.0, "p90_latency": 1.5,
               "median_latency": 1.0, "throughput": 3.0}  # fmt: skip
    return {"timestamp": "2025-06-01T10:00:00", "tag": "", "summary": summary}


def test_bench_multiturn_regenerates_each_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "performance_metrics.jsonl"
    src.write_text("".join(json.dumps(multiturn_log_line(24, r)) + "\n" for r in (8, 2)))
    out = tmp_path / "mt.jsonl"
    flags = "--num-clients 8 --num-rounds 3 --request-length 256 --output-length 32 --port 1"
    cmd = ["trace", "convert", str(src), str(out), "--bench-args", flags, "--block-size", "64"]
    assert main(cmd) == 0
    assert "48 requests, 16 sessions" in capsys.readouterr().out
    reqs = list(read_trace(out).requests)
    # the first rate's requests are traces.generate.multiturn's, with the same parameters
    same = multiturn(clients=8, rounds=3, request_length=256, output_length=32,
                     request_rate=8.0, block_size=64, seed=1)  # fmt: skip
    assert [(r.timestamp, r.hash_ids) for r in reqs[:24]] == [
        (r.timestamp, r.hash_ids) for r in same.requests
    ]
    # the second rate follows, with ids and sessions of its own (the cache was flushed)
    first_ids = {h for r in reqs[:24] for h in r.hash_ids or []}
    assert first_ids.isdisjoint(h for r in reqs[24:] for h in r.hash_ids or [])
    assert reqs[24].timestamp >= reqs[23].timestamp
    assert {r.session_id for r in reqs[24:]} == {f"r1/c{c}" for c in range(8)}
    stats = roundtrip(out, tmp_path, capsys, requests=48)
    assert stats["sessions"]["sessions"] == 16  # type: ignore[index]


def test_bench_multiturn_needs_the_runs_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "performance_metrics.jsonl"
    src.write_text(json.dumps(multiturn_log_line(24, 8)) + "\n")
    assert main(["trace", "convert", str(src), str(tmp_path / "o.jsonl")]) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["line"], m["field"]) == ("1", "summary.total_requests")
    assert "--num-clients 256 x --num-rounds 5 = 1280" in m["problem"]
