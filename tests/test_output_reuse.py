"""``workload.output_reuse = "next_turn"`` (hicache.output_keys): a session turn's output pages
take its next prompt's symbols there, so the next turn hits the answer's KV as SGLang does
when the client sends it back; the timed run (both SGLang versions), the cache-only replay and
a PD decode server's radix cache all see it, and ``none`` leaves every result as before."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hicache.config import ConfigError, load_config
from hicache.output_keys import next_turns, output_keys, output_keys_for
from sim.engine import run_simulation
from sim.hitrate import HitRateConfig, replay, requests_for
from traces.io import read_trace
from traces.keys import page_symbols

BASE = ["model.name=llama-3-8b", "gpu.name=h100-sxm", "cache.page_size=64",
        "gpu.device_tokens=65536"]  # fmt: skip
# turn 0: 1,024 prompt tokens (blocks 0, 1) and 513 outputs: its committed KV is 1,536 tokens,
# 24 full pages, 8 of them output pages; turn 1 sends prompt + answer + 512 new tokens back
TURNS = [(0, 1024, 513, [0, 1], 0), (0, 2048, 4, [0, 1, 2, 3], 1)]


def _trace(tmp_path: Path, turns: Sequence[tuple[float, int, int, list[int], int]]) -> Any:
    lines = [
        json.dumps(
            {
                "timestamp": ts,
                "input_length": n,
                "output_length": out,
                "hash_ids": ids,
                "session_id": "s",
                "turn": k,
                "think_time_ms": 1000,
            }
        )
        for ts, n, out, ids, k in turns
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return read_trace(path)


def test_output_pages_take_the_next_prompts_symbols(tmp_path: Path) -> None:
    trace = _trace(tmp_path, TURNS)
    build = output_keys(trace, 64)
    later = page_symbols(trace.requests[1], 64, trace.block_size)
    assert build(0) == later[16:24] and len(build(0)) == 8
    assert build(1) == []  # the session's last turn
    assert next_turns(trace) == {0: 1}
    assert next_turns(trace, limit=1) == {}  # the next turn is past max_requests
    assert output_keys_for("none", trace, 64)(0) == []
    # turns listed out of order: ordered by turn, as the closed-loop replay orders them
    swapped = _trace(tmp_path, [TURNS[1], TURNS[0]])
    assert next_turns(swapped) == {1: 0}


def test_no_symbols_where_the_next_prompt_does_not_extend_this_one(tmp_path: Path) -> None:
    diverged = [TURNS[0], (0, 2048, 4, [0, 9, 2, 3], 1)]
    assert output_keys(_trace(tmp_path, diverged), 64)(0) == []
    short = [TURNS[0], (0, 1024, 4, [0, 1], 1)]  # shorter than prompt + answer: nothing past it
    assert output_keys(_trace(tmp_path, short), 64)(0) == []
    # a next prompt that covers only part of the answer gives the pages it covers
    part = [TURNS[0], (0, 1280, 4, [0, 1, 2], 1)]
    assert len(output_keys(_trace(tmp_path, part), 64)(0)) == 4


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_timed_run_hits_the_answer(tmp_path: Path, version: str) -> None:
    trace = _trace(tmp_path, TURNS)
    hits = {}
    for mode in ("none", "next_turn"):
        cfg = load_config(None, [*BASE, f"sglang.version={version}",
                                 f"workload.output_reuse={mode}"])  # fmt: skip
        frames: dict[str, Any] = {}
        run_simulation(cfg, trace, frames_out=frames)
        hits[mode] = list(frames["requests"]["device_hit_tokens"])
    assert hits == {"none": [0, 1024], "next_turn": [0, 1536]}


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_cache_only_replay_hits_the_answer(tmp_path: Path, version: str) -> None:
    trace = _trace(tmp_path, TURNS)
    reqs = requests_for(trace, 64)
    got = {}
    for mode in ("none", "next_turn"):
        cfg = HitRateConfig(65536, 131072, 64, sglang_version=version, output_reuse=mode)
        got[mode] = replay(reqs, cfg, trace).device_hit_tokens
    assert got == {"none": 1024, "next_turn": 1536}
    with pytest.raises(ValueError, match="needs the trace"):
        replay(reqs, HitRateConfig(65536, 131072, 64, output_reuse="next_turn"))


def test_pd_decode_radix_cache_holds_the_answer(tmp_path: Path) -> None:
    """The decode server inserted turn 0's prompt and answer at its finish: turn 1 matches
    1,536 tokens there and the prefill server sends only the 512 past them, while the prefill
    server (which never decoded the answer) hits its 1,024 prompt tokens only."""
    trace = _trace(tmp_path, TURNS)
    cfg = load_config(None, [*BASE, "pd.enabled=true", "pd.decode_radix_cache=true",
                             "workload.output_reuse=next_turn"])  # fmt: skip
    frames: dict[str, Any] = {}
    run_simulation(cfg, trace, frames_out=frames)
    req = frames["requests"]
    assert list(req["decode_device_hit_tokens"]) == [0, 1536]
    assert list(frames["prefill"]["requests"]["device_hit_tokens"]) == [0, 1024]
    per_token = req["transfer_bytes"][0] // 1024
    assert list(req["transfer_bytes"]) == [1024 * per_token, 512 * per_token]


def test_unknown_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"workload\.output_reuse"):
        load_config(None, ["workload.output_reuse=always"])


@pytest.mark.parametrize(
    ("extra", "from_l3"),
    [
        (["pd.decode_radix_cache=true"], 512),  # decode HiCache writes the answer to the store
        ([], 0),  # no decode tree: nothing of the answer reaches the store
        (["pd.decode_radix_cache=true", "storage.shared=no"], 0),  # a store per server
        # different TP per role: SGLang's page keys carry the rank's shard, no sharing
        (["pd.decode_radix_cache=true", "pd.decode_set=model.tp=2"], 0),
    ],
)
def test_pd_prefill_prefetches_the_answer_a_decode_server_stored(
    tmp_path: Path, extra: list[str], from_l3: int
) -> None:
    """With a store both roles share (Mooncake), the decode server's finished turn 0 (prompt
    and answer, backed up from its tree through its host pool) is in L3 when turn 1 reaches
    the prefill server: the 512 answer tokens past its own 1,024 come from L3 there."""
    trace = _trace(tmp_path, TURNS)
    cfg = load_config(None, [*BASE, "pd.enabled=true", "workload.output_reuse=next_turn",
                             "storage.backend=mooncake", *extra])  # fmt: skip
    frames: dict[str, Any] = {}
    s = run_simulation(cfg, trace, frames_out=frames)
    pre = frames["prefill"]["requests"]
    assert list(pre["device_hit_tokens"]) == [0, 1024]
    assert list(pre["storage_hit_tokens"]) == [0, from_l3]
    # each role's L3 block: the prefill servers' always (they have the store), the decode
    # servers' where their caches back up to one
    roles = s["roles"]
    assert roles["prefill"]["storage"]["storage_hit_tokens"] == from_l3
    assert ("storage" in roles["decode"]) == ("pd.decode_radix_cache=true" in extra)


def test_the_infinite_capacity_bound_counts_the_answers(tmp_path: Path) -> None:
    """With outputs reused the bound holds earlier answers too: the two-turn trace caches
    1,536 of its 3,072 prompt tokens (not 1,024); on the bundled multi-turn trace at page 16
    (64-token answers: 3 full pages each) an unbounded cache-only replay reaches the bound
    exactly, in both modes."""
    from hicache.output_keys import infinite_capacity_hit_rate_reusing_outputs
    from traces.stats import infinite_capacity_hit_rate

    trace = _trace(tmp_path, TURNS)
    assert infinite_capacity_hit_rate_reusing_outputs(trace, 64) == 1536 / 3072
    assert infinite_capacity_hit_rate(trace, 64) == 1024 / 3072
    multi = read_trace(
        Path(__file__).resolve().parent.parent / "traces/data/synthetic/multiturn.jsonl"
    )
    reqs = requests_for(multi, 16)
    for mode, bound in (
        ("none", infinite_capacity_hit_rate(multi, 16)),
        ("next_turn", infinite_capacity_hit_rate_reusing_outputs(multi, 16)),
    ):
        cfg = HitRateConfig(16 << 20, 0, 16, sglang_version="0.5.23", output_reuse=mode)
        assert replay(reqs, cfg, multi).hit_rate == pytest.approx(bound, rel=1e-12)
    assert infinite_capacity_hit_rate_reusing_outputs(multi, 16) > infinite_capacity_hit_rate(
        multi, 16
    )
