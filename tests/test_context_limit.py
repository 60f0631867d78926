"""``workload.max_context`` / ``auto_truncate`` (SGLang's ``--context-length`` and
``--allow-auto-truncate``, :mod:`traces.context`): the limits SGLang derives, prompts aborted
or cut with their head kept, outputs capped, and a run that counts what happened."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from hicache.config import ConfigError, load_config
from hicache.sglang_args import format_sglang_command, parse_sglang_args
from traces.context import ContextLimit, apply_context_limit
from traces.schema import Request, Trace, TraceHeader

TRACE = Path(__file__).resolve().parent.parent / "traces/data/mooncake/conversation_trace.jsonl"


def _trace() -> Trace:
    reqs = [
        Request(0.0, 100, 50, hash_ids=[1, 2]),  # fits
        Request(1.0, 3000, 900, hash_ids=[1, 2, 3, 4, 5, 6]),  # output capped
        Request(2.0, 4090, 10, hash_ids=list(range(1, 10))),  # at the input limit
        Request(3.0, 4089, 10, token_ids=list(range(4089))),  # just below it
    ]
    return Trace(requests=reqs, header=TraceHeader(block_size=512))


def test_limits_are_sglangs() -> None:
    # max_req_len = min(C - 1, kv - 1); max_req_input_len = max_req_len - 5
    assert ContextLimit.of(4096, 1_000_000) == (4095, 4090)
    assert ContextLimit.of(4096, 2000) == (1999, 1994)  # the pool is the tighter bound
    assert ContextLimit.of(0, 2000) == (1999, 1994)


def test_abort_or_truncate_and_cap() -> None:
    limit = ContextLimit.of(4096, 1_000_000)
    got = apply_context_limit(_trace(), limit, truncate=False)
    assert got.aborted == {2} and got.truncated == 0
    out = [(r.input_length, r.output_length) for r in got.trace.requests]
    # request 1: room 4095 - 3000 - 1 = 1094 >= 900, unchanged; request 3: room 4095 - 4089
    # - 1 = 5 < 10, capped; the aborted request is left as it is (the server aborts it)
    assert out == [(100, 50), (3000, 900), (4090, 10), (4089, 5)]
    assert got.capped == 1
    cut = apply_context_limit(_trace(), limit, truncate=True)
    r = cut.trace.requests[2]
    # cut to its first 4,090 tokens: 8 blocks of 512 (the last partial), the head kept
    assert (r.input_length, r.hash_ids, r.output_length) == (4090, list(range(1, 9)), 4)
    assert cut.aborted == frozenset() and cut.truncated == 1 and cut.capped == 2


def test_config_and_flags() -> None:
    with pytest.raises(ConfigError, match="at least 7"):
        load_config(None, ["workload.max_context=5"])
    parsed = parse_sglang_args("--context-length 32768 --allow-auto-truncate")
    assert {"workload.max_context=32768", "workload.auto_truncate=true"} <= set(parsed.overrides)
    cfg = load_config(None, ["workload.max_context=32768", "workload.auto_truncate=true"])
    flags = format_sglang_command(cfg).split()
    assert "--allow-auto-truncate" in flags
    assert flags[flags.index("--context-length") + 1] == "32768"


@pytest.mark.parametrize("truncate", [False, True])
def test_a_run_aborts_or_cuts_the_long_prompts(tmp_path: Path, truncate: bool) -> None:
    out = tmp_path / "r"
    args = ["run", str(TRACE), "--out", str(out), "--max-requests", "300",
            "--set", "workload.rate_scale=0.25", "--set", "workload.max_context=8192",
            "--set", f"workload.auto_truncate={str(truncate).lower()}"]  # fmt: skip
    assert main(args) == 0
    s = json.loads((out / "summary.json").read_text())
    req = pd.read_parquet(out / "requests.parquet")
    from traces.io import read_trace

    lengths = [r.input_length for r in read_trace(TRACE).requests[:300]]
    over = sum(n >= 8186 for n in lengths)  # max_req_input_len = 8191 - 5
    assert over > 0
    if truncate:
        assert s["context_truncated"] == over and s["context_aborted"] == 0
        assert req["prompt_tokens"].max() == 8186 and s["rejected_requests"] == 0
    else:
        assert s["context_aborted"] == over == s["rejected_requests"]
        assert (req.loc[req["finish_s"] < 0, "prompt_tokens"] >= 8186).all()


def test_run_prints_what_the_limit_did() -> None:
    from cli.run_output import format_summary

    s = {"requests": 10, "rejected_requests": 2, "sim_duration_s": 1.0, "wall_time_s": 0.1,
         "hit_rate": 0.0, "device_hit_rate": 0.0, "host_hit_rate": 0.0, "ttft_mean_s": 0.1,
         "ttft_p50_s": 0.1, "ttft_p90_s": 0.1, "ttft_p99_s": 0.1, "tpot_mean_s": 0.01,
         "e2e_mean_s": 0.2, "throughput_output_tok_s": 1.0, "bytes_d2h": 0, "bytes_h2d": 0,
         "retractions": 0, "context_aborted": 2, "context_truncated": 0,
         "context_capped_outputs": 3}  # fmt: skip
    assert "context limit: 2 prompts too long aborted (of the rejected), 0 cut" in format_summary(s)
    del s["context_aborted"]
    assert "context limit" not in format_summary(s)


def test_a_closed_loop_session_goes_on_after_a_rejected_turn(tmp_path: Path) -> None:
    # 8 clients x 3 turns with a 1,024-token system prompt: the later turns outgrow a 1,800
    # token context and are aborted; their followers still come (think time after the
    # rejection), so the run ends with every turn accounted for instead of stalling
    from traces.generate import multiturn
    from traces.io import write_trace

    t = multiturn(clients=8, rounds=3, request_length=400, output_length=64,
                  system_prompt_length=1024, think_time_ms=500, closed_loop=True,
                  seed=3)  # fmt: skip
    path = write_trace(t, tmp_path / "mt.jsonl")
    out = tmp_path / "r"
    args = ["run", str(path), "--out", str(out), "--set", "workload.max_context=1800"]
    assert main(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"] == 24 and s["closed_loop"] is True
    assert 0 < s["context_aborted"] == s["rejected_requests"] < 24


def test_pd_refuses_the_context_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", str(TRACE), "--out", str(tmp_path / "r"), "--max-requests", "20",
            "--set", "pd.enabled=true", "--set", "workload.max_context=8192"]  # fmt: skip
    assert main(args) == 2
    assert "not modelled in a PD run" in capsys.readouterr().err
