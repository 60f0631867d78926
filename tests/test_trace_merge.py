"""`trace merge` (hash ids namespaced, --rate-scale) and `trace slice` (time window, count)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from tests.test_import_common import roundtrip
from traces.generate import agentic, multiturn
from traces.io import read_trace, write_trace
from traces.stats import infinite_capacity_hit_rate


def two_traces(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(multiturn(clients=4, rounds=3, request_rate=2.0, block_size=64, seed=1), a)
    write_trace(agentic(sessions=3, steps=3, block_size=64, seed=2), b)
    return a, b


def test_merge_namespaces_ids_sessions_and_scales_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_traces(tmp_path)
    ta, tb = read_trace(a), read_trace(b)
    # both generators start their ids at 0: merged as they are, they would alias
    assert {h for r in ta.requests for h in r.hash_ids} & {
        h for r in tb.requests for h in r.hash_ids
    }
    out = tmp_path / "m.jsonl"
    assert main(["trace", "merge", str(a), str(b), "--out", str(out), "--rate-scale", "1,2"]) == 0
    assert "21 requests, 7 sessions" in capsys.readouterr().out
    m = list(read_trace(out).requests)
    from_a = [r for r in m if r.session_id.startswith("0/")]
    from_b = [r for r in m if r.session_id.startswith("1/")]
    assert len(from_a) == 12 and len(from_b) == 9
    assert {h for r in from_a for h in r.hash_ids}.isdisjoint(h for r in from_b for h in r.hash_ids)
    assert [r.hash_ids for r in from_a] == [r.hash_ids for r in ta.requests]
    top = max(h for r in ta.requests for h in r.hash_ids)
    assert [r.hash_ids for r in from_b] == [[h + top + 1 for h in r.hash_ids] for r in tb.requests]
    # input b at twice its rate: times and think times halved
    b0 = tb.requests[0].timestamp
    assert [r.timestamp for r in from_b] == [(r.timestamp - b0) / 2 for r in tb.requests]
    assert [r.think_time_ms for r in from_b] == [
        None if r.think_time_ms is None else r.think_time_ms / 2 for r in tb.requests
    ]
    assert [r.timestamp for r in m] == sorted(r.timestamp for r in m)
    # the hit rate of the merge is no more than each input's own: nothing new is shared
    merged = read_trace(out)
    cached = infinite_capacity_hit_rate(merged, 64) * sum(r.input_length for r in m)
    own = sum(
        infinite_capacity_hit_rate(t, 64) * sum(r.input_length for r in t.requests)
        for t in (ta, tb)
    )
    assert cached == pytest.approx(own)
    roundtrip(out, tmp_path, capsys, requests=21)


def test_merge_refuses_mixed_block_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_traces(tmp_path)
    c = tmp_path / "c.jsonl"
    write_trace(multiturn(clients=2, rounds=2, block_size=32), c)
    assert main(["trace", "merge", str(a), str(c), "--out", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "block sizes [32, 64]" in err


def test_slice_by_time_and_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = two_traces(tmp_path)
    reqs = list(read_trace(a).requests)
    t0 = reqs[0].timestamp
    out = tmp_path / "s.jsonl"
    assert main(["trace", "slice", str(a), str(out), "--start", "1", "--end", "4", "--json"]) == 0
    kept = list(read_trace(out).requests)
    want = [r for r in reqs if 1000 <= r.timestamp - t0 < 4000]
    assert json.loads(capsys.readouterr().out)["requests"] == len(want) > 0
    assert [(r.timestamp, r.hash_ids) for r in kept] == [(r.timestamp, r.hash_ids) for r in want]
    out2 = tmp_path / "s2.jsonl"
    assert main(["trace", "slice", str(a), str(out2), "--skip", "2", "--count", "5"]) == 0
    capsys.readouterr()
    got = [(r.timestamp, r.session_id, r.turn) for r in read_trace(out2).requests]
    assert got == [(r.timestamp, r.session_id, r.turn) for r in reqs[2:7]]
    assert main(["trace", "slice", str(a), str(tmp_path / "e.jsonl"), "--start", "1e6"]) == 2
    assert "no request is left" in capsys.readouterr().err
    roundtrip(out2, tmp_path, capsys, requests=5)


def test_merge_warns_when_only_some_inputs_record_think_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "open.jsonl", tmp_path / "closed.jsonl"
    write_trace(multiturn(clients=2, rounds=2, block_size=64, closed_loop=False, seed=1), a)
    write_trace(multiturn(clients=2, rounds=2, block_size=64, closed_loop=True, seed=2), b)
    assert any(r.think_time_ms is not None for r in read_trace(b).requests)
    assert all(r.think_time_ms is None for r in read_trace(a).requests)
    assert main(["trace", "merge", str(a), str(b), "--out", str(tmp_path / "m.jsonl")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {a} record no think times" in err and "closed_loop = off" in err
    # inputs alike: no warning
    assert main(["trace", "merge", str(b), str(b), "--out", str(tmp_path / "n.jsonl")]) == 0
    assert "warning" not in capsys.readouterr().err
