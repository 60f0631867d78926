"""Prefill/decode disaggregation (issue 28, sim.pd): the sanity case of the issue (one request
in flight: TTFT = the single server's + bootstrap + transfer, TPOT the single server's), the
transfer rule exactly, decode-side pre-allocation blocking on a full decode pool, and a PD run
of the bundled conversation trace reporting per role."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cli.pd_summary import format_pd_summary
from hicache.config import ConfigError, load_config
from hicache.models import kv_bytes_per_token
from sim.engine import run_simulation
from sim.pd.run import role_configs
from sim.pd.transfer import TransferCost, transfer_chunks
from traces.io import read_trace

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
CONVERSATION = DATA / "mooncake" / "conversation_trace.jsonl"
BASE = ["model.name=llama-3-8b", "gpu.name=h100-sxm", "cache.page_size=64",
        "gpu.device_tokens=65536"]  # fmt: skip


def _trace(tmp_path: Path, reqs: list[tuple[float, int, int, int]]) -> object:
    """A trace of (timestamp ms, input tokens, outputs, first hash id) requests, 512-token
    blocks with distinct hash ids (no shared prefix)."""
    lines = []
    for ts, n, out, h in reqs:
        blocks = -(-n // 512)
        ids = list(range(h, h + blocks))
        lines.append(json.dumps({"timestamp": ts, "input_length": n, "output_length": out,
                                 "hash_ids": ids}))  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return read_trace(path)


def _both(tmp_path: Path, reqs: list[tuple[float, int, int, int]], extra: list[str]) -> tuple:
    trace = _trace(tmp_path, reqs)
    single: dict[str, pd.DataFrame] = {}
    run_simulation(load_config(None, BASE + extra), trace, frames_out=single)
    pdf: dict[str, object] = {}
    cfg = load_config(None, [*BASE, *extra, "pd.enabled=true"])
    summary = run_simulation(cfg, trace, frames_out=pdf)
    return cfg, single["requests"], pdf, summary


def test_one_request_at_a_time_ttft_is_single_plus_bootstrap_plus_transfer(
    tmp_path: Path,
) -> None:
    """Requests 100 s apart (one in flight at a time), one chunked (10,000 tokens over the
    8,192-token chunk: two sends): each PD TTFT is the single server's TTFT plus the
    bootstrap (and, for the pair's first request, the handshake) plus
    ``chunks * latency + page-aligned bytes per rank / bandwidth``; TPOT is the single
    server's."""
    reqs = [(0, 10_000, 40, 0), (100_000, 3000, 65, 100), (200_000, 700, 2, 200)]
    cfg, single, frames, summary = _both(tmp_path, reqs, [])
    pdreq = frames["requests"]  # type: ignore[index]
    bpt = kv_bytes_per_token(cfg.model.spec, 1)
    cost = TransferCost.of(cfg.pd)
    for i, (_, n, _, _) in enumerate(reqs):
        one, row = single.iloc[i], pdreq.iloc[i]
        chunks = 2 if n > 8192 else 1
        xfer = chunks * cfg.pd.rdma_latency_s + math.ceil(n / 64) * 64 * bpt / 23.75e9
        assert row["transfer_chunks"] == chunks
        assert row["transfer_end_s"] - row["transfer_start_s"] == pytest.approx(xfer, rel=1e-12)
        assert cost.seconds(int(row["transfer_bytes"]), chunks) == pytest.approx(xfer, rel=1e-12)
        boot = cfg.pd.bootstrap_s + (cfg.pd.handshake_s if i == 0 else 0.0)
        pd_ttft = row["first_token_s"] - row["arrival_s"]
        assert pd_ttft == pytest.approx(one["ttft_s"] + boot + xfer, rel=1e-9, abs=1e-12)
        dec = frames["decode"]["requests"].iloc[i]  # type: ignore[index]
        assert dec["tpot_s"] == pytest.approx(one["tpot_s"], rel=1e-9)
        assert row["finish_s"] - row["first_token_s"] == pytest.approx(
            one["finish_s"] - one["first_token_s"], rel=1e-9
        )
    # the prefill server ran each prompt once, for one token; the decode server decoded it
    pre = frames["prefill"]["requests"]  # type: ignore[index]
    assert list(pre["output_tokens"]) == [1, 1, 1]
    assert list(pre["computed_tokens"]) == [n for _, n, _, _ in reqs]
    assert summary["ttft_mean_s"] == pytest.approx(
        float((pdreq["first_token_s"] - pdreq["arrival_s"]).mean()), rel=1e-12
    )


def test_transfer_rule_nvlink_and_tp(tmp_path: Path) -> None:
    """Over NVLink with TP 2 on both roles: a rank's KV slice (half of llama-3-8b's 8 KV heads
    each) at the NVLink figures; one unchunked send."""
    extra = ["model.tp=2", "gpu.server=dgx-h100", "pd.transfer=nvlink", "pd.handshake_s=0",
             "pd.bootstrap_s=0"]  # fmt: skip
    cfg, single, frames, _ = _both(tmp_path, [(0, 4096, 10, 0)], extra)
    row = frames["requests"].iloc[0]  # type: ignore[index]
    half = kv_bytes_per_token(cfg.model.spec, 2)
    assert half * 2 == kv_bytes_per_token(cfg.model.spec, 1)
    xfer = 5e-6 + 4096 * half / 360e9
    assert row["transfer_bytes"] == 4096 * half
    assert row["transfer_end_s"] - row["transfer_start_s"] == pytest.approx(xfer, rel=1e-12)
    ttft = row["first_token_s"] - row["arrival_s"]
    assert ttft == pytest.approx(single.iloc[0]["ttft_s"] + xfer, rel=1e-9)


def test_chunk_count() -> None:
    assert transfer_chunks(8192, 0, 8192) == 1
    assert transfer_chunks(8193, 0, 8192) == 2
    assert transfer_chunks(100, 512, 8192) == 2  # the cached prefix goes early, on its own
    assert transfer_chunks(50_000, 0, -1) == 1


def test_preallocation_blocks_while_the_decode_pool_is_full(tmp_path: Path) -> None:
    """Decode pool of 4,096 tokens, two 2,048-token prompts at once: the first pre-allocates
    2,048 (+512 reserved); the second needs 2,048 + 512 but only 4,096 - 2,048 - 512 are left
    while the first holds its pages, so it is pre-allocated when the first finishes, and its
    prefill waits for that (the prefill server only takes bootstrapped requests)."""
    extra = ["pd.decode_set=gpu.device_tokens=4096", "pd.handshake_s=0"]
    reqs = [(0, 2048, 64, 0), (0, 2048, 64, 100)]
    cfg, _, frames, summary = _both(tmp_path, reqs, extra)
    a, b = frames["requests"].iloc[0], frames["requests"].iloc[1]  # type: ignore[index]
    assert a["prealloc_s"] == 0.0
    assert b["prealloc_s"] == a["finish_s"]  # blocked until the first left the pool
    assert b["bootstrap_s"] == pytest.approx(b["prealloc_s"] + cfg.pd.bootstrap_s, rel=1e-12)
    assert b["prefill_admitted_s"] >= b["bootstrap_s"]
    assert summary["roles"]["decode"]["prealloc_wait_mean_s"] == pytest.approx(
        b["prealloc_s"] / 2, rel=1e-12
    )
    # with room for both, neither waits
    _, _, free, _ = _both(tmp_path, reqs, ["pd.decode_set=gpu.device_tokens=8192"])
    assert list(free["requests"]["prealloc_s"]) == [0.0, 0.0]  # type: ignore[index]


def test_role_overrides_apply_per_role_and_are_checked() -> None:
    cfg = load_config(None, [*BASE, "pd.enabled=true", "pd.decode_set=gpu.device_tokens=4096"])
    pre, dec = role_configs(cfg)
    assert (pre.gpu.device_tokens, dec.gpu.device_tokens) == (65536, 4096)
    assert not pre.pd.enabled and not dec.pd.enabled
    bad = load_config(None, [*BASE, "pd.enabled=true", "pd.decode_set=model.name=llama-3-70b"])
    with pytest.raises(ConfigError, match="same model"):
        role_configs(bad)
    with pytest.raises(ConfigError, match=r"pd\.transfer"):
        load_config(None, ["pd.transfer=tcp"])


def test_conversation_trace_runs_and_reports_per_role(tmp_path: Path) -> None:
    """300 requests of the bundled conversation trace, 2 prefill + 2 decode servers: every
    request finishes, the run directory has the PD tables and the per-role summary."""
    trace = read_trace(CONVERSATION)
    cfg = load_config(None, ["workload.max_requests=300", "workload.rate_scale=0.5",
                             "pd.enabled=true", "pd.prefill_instances=2",
                             "pd.decode_instances=2"])  # fmt: skip
    out = tmp_path / "run"
    s = run_simulation(cfg, trace, out)
    assert s["pd"] and s["requests"] == 300 and s["finished_requests"] == 300
    for name in (
        "config.json",
        "summary.json",
        "requests.parquet",
        "prefill_requests.parquet",
        "decode_requests.parquet",
        "timeline.parquet",
        "transfers.parquet",
    ):
        assert (out / name).is_file(), name
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 300 and set(req["prefill_instance"]) == {0, 1}
    assert set(req["decode_instance"]) == {0, 1}
    # every step in order, per request
    order = ["arrival_s", "prealloc_s", "bootstrap_s", "prefill_admitted_s", "prefill_end_s",
             "transfer_start_s", "transfer_end_s", "first_token_s", "finish_s"]  # fmt: skip
    for a, b in itertools.pairwise(order):
        assert (req[b] >= req[a]).all(), (a, b)
    roles = s["roles"]
    assert roles["prefill"]["requests"] == roles["decode"]["requests"] == 300
    assert sum(roles["prefill"]["requests_per_instance"]) == 300
    assert 0 < s["hit_rate"] == roles["prefill"]["hit_rate"]
    assert s["tpot_mean_s"] == roles["decode"]["tpot_mean_s"] > 0
    assert s["transfer_bytes_per_rank"] == int(req["transfer_bytes"].sum()) > 0
    text = format_pd_summary(s)
    assert "prefill role: 2 instance(s)" in text and "decode role: 2 instance(s)" in text
    assert json.loads((out / "summary.json").read_text())["roles"]["decode"]["instances"] == 2


def test_closed_loop_turns_follow_their_predecessor_finish() -> None:
    """A trace with think times replays closed loop in PD too: turn k arrives its think time
    after turn k-1 finished on its decode server."""
    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    cfg = load_config(None, ["workload.max_requests=60", "pd.enabled=true",
                             "pd.decode_instances=2"])  # fmt: skip
    frames: dict[str, pd.DataFrame] = {}
    s = run_simulation(cfg, trace, frames_out=frames)
    assert s["closed_loop"] and s["finished_requests"] == 60
    req = frames["requests"].set_index("rid")
    checked = 0
    for rid in range(60):
        r = trace.requests[rid]
        if r.session_id is None or not r.turn:
            continue
        prev = next(j for j in range(rid) if trace.requests[j].session_id == r.session_id
                    and trace.requests[j].turn == r.turn - 1)  # fmt: skip
        if prev >= 60:
            continue
        gap = req.loc[rid, "arrival_s"] - req.loc[prev, "finish_s"]
        assert gap == pytest.approx((r.think_time_ms or 0.0) / 1000.0, abs=1e-9)
        checked += 1
    assert checked > 10


def test_decode_retraction_resumes_without_recompute() -> None:
    """A decode pool too small for its batch: the decode scheduler retracts, the victims wait
    in the retracted queue (nothing new is pre-allocated meanwhile) and come back with their
    KV, never prefilled again on either role; requests whose KV and reserve could never fit
    the decode pool are rejected at arrival instead of waiting forever."""
    trace = read_trace(CONVERSATION)
    cfg = load_config(None, [
        "pd.enabled=true", "workload.max_requests=400",
        "pd.decode_set=gpu.device_tokens=40960;scheduler.max_running_requests=64",
        "pd.num_reserved_decode_tokens=0",
    ])  # fmt: skip
    frames: dict[str, Any] = {}
    s = run_simulation(cfg, trace, frames_out=frames)
    dec = frames["decode"]["requests"]
    assert s["roles"]["decode"]["retractions"] == s["retractions"] > 0
    assert s["finished_requests"] + s["rejected_requests"] == 400
    # the engine's rule: the KV in whole pages plus the reserve (0 here) over the decode pool
    too_long = [-(-(r.input_length + r.output_length) // 64) * 64 > 40960
                for r in trace.requests[:400]]  # fmt: skip
    assert s["rejected_requests"] == sum(too_long) > 0
    assert (dec["computed_tokens"] == 0).all()  # the decode server never prefilled
    pre = frames["prefill"]["requests"]
    done = pre[pre["finish_s"] >= 0]
    cached = done["device_hit_tokens"] + done["host_hit_tokens"] + done["storage_hit_tokens"]
    assert (done["computed_tokens"] + cached == done["prompt_tokens"]).all()  # prefilled once


def test_a_closed_loop_session_goes_on_after_a_rejected_turn(tmp_path: Path) -> None:
    # later turns outgrow a 2,048-token decode pool and are rejected at arrival; their
    # followers still come, so the run ends with every turn accounted for (it stalled before)
    from traces.generate import multiturn

    trace = multiturn(clients=4, rounds=4, request_length=700, output_length=32,
                      think_time_ms=200, closed_loop=True, block_size=64, seed=5)  # fmt: skip
    # the third turn (about 2,200 tokens of KV) is the first that cannot fit: not a last turn
    assert all(r.turn == 2 for r in trace.requests if 1536 < r.input_length + r.output_length
               <= 2048 + 800)  # fmt: skip
    cfg = load_config(None, ["pd.enabled=true", "pd.decode_set=gpu.device_tokens=2048",
                             "pd.num_reserved_decode_tokens=0"])  # fmt: skip
    s = run_simulation(cfg, trace)
    assert s["requests"] == 16
    assert s["rejected_requests"] == 8  # turns 2 and 3 of every client
    assert s["finished_requests"] + s["rejected_requests"] == 16
