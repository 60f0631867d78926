"""`trace convert --from weka`: AgentX / Weka agentic traces (block_size 64, per-request
hash_ids, subagent fan-out, think times) as closed-loop sessions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.test_import_common import one_line_error, roundtrip
from traces.io import read_trace


def _call(t: float, n_in: int, ids: list[int], **more: Any) -> dict[str, Any]:
    return {"t": t, "type": "n", "model": "claude", "in": n_in, "out": 20, "hash_ids": ids, **more}


def weka_session(name: str, *, relative_subagent: bool) -> dict[str, Any]:
    """One session object: three main-agent calls growing one context (ids 0.. as the
    corpus numbers them, so two objects reuse the same ids), and between calls 1 and 2 a
    subagent whose two calls start with the main agent's first two blocks. The subagent's
    ``t`` are absolute (at 5 s and 7 s) or, with `relative_subagent`, relative to its
    marker at 5 s (0 s and 2 s)."""
    sub_t = [0.0, 2.0] if relative_subagent else [5.0, 7.0]
    return {
        "id": name,
        "models": ["claude", "haiku"],
        "block_size": 64,
        "hash_id_scope": "local",
        "tool_tokens": 0,
        "system_tokens": 0,
        "requests": [
            _call(0.0, 300, [0, 1, 2, 3, 4], api_time=2.0),
            _call(4.0, 400, [0, 1, 2, 3, 4, 5, 6], api_time=1.0, think_time=0.5),
            {
                "t": 5.0,
                "type": "subagent",
                "agent_id": "explore-1",
                "subagent_type": "Explore",
                "status": "completed",
                "models": ["haiku"],
                "requests": [
                    _call(sub_t[0], 150, [0, 1, 20], api_time=1.0),
                    _call(sub_t[1], 200, [0, 1, 20, 21], api_time=1.0),
                ],
            },
            _call(12.0, 500, [0, 1, 2, 3, 4, 5, 6, 7], api_time=1.0),
        ],
    }


def write_weka_jsonl(path: Path) -> None:
    """Two session objects, one per line (the datasets' rows)."""
    rows = [
        weka_session("s-abs", relative_subagent=False),
        weka_session("s-rel", relative_subagent=True),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_sessions_subagents_think_times_and_id_scopes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "weka.jsonl"
    write_weka_jsonl(src)
    out = tmp_path / "weka_trace.jsonl"
    assert main(["trace", "convert", str(src), str(out)]) == 0  # detected from the content
    assert "10 requests, 4 sessions (block_size 64)" in capsys.readouterr().out
    trace = read_trace(out)
    assert trace.block_size == 64 and trace.header.extra["subagents_with_relative_times"] == 1
    reqs = list(trace.requests)
    sessions: dict[str, list[Any]] = {}
    for r in reqs:
        sessions.setdefault(r.session_id or "", []).append(r)
    assert sorted(sessions) == ["s-abs", "s-abs::sa:explore-1", "s-rel", "s-rel::sa:explore-1"]
    for name in ("s-abs", "s-rel"):
        main_turns, sub_turns = sessions[name], sessions[name + "::sa:explore-1"]
        assert [r.timestamp for r in main_turns] == [0.0, 4000.0, 12000.0]
        # both conventions put the subagent's calls at 5 s and 7 s
        assert [r.timestamp for r in sub_turns] == [5000.0, 7000.0]
        assert [r.turn for r in main_turns] == [0, 1, 2] and [r.turn for r in sub_turns] == [0, 1]
        # recorded think_time (0.5 s); else the gap less the previous api_time (12 - 4 - 1 s)
        assert [r.think_time_ms for r in main_turns] == [None, 500.0, 7000.0]
        assert [r.think_time_ms for r in sub_turns] == [None, 1000.0]
        # the subagent shares the main agent's first two blocks, then has its own
        assert sub_turns[0].hash_ids[:2] == main_turns[0].hash_ids[:2]
        assert sub_turns[0].hash_ids[2] not in main_turns[2].hash_ids
        assert main_turns[2].hash_ids[:7] == main_turns[1].hash_ids
    # the same source ids in two session objects are different blocks (hash_id_scope local)
    ids_abs = {h for r in reqs if (r.session_id or "").startswith("s-abs") for h in r.hash_ids}
    ids_rel = {h for r in reqs if (r.session_id or "").startswith("s-rel") for h in r.hash_ids}
    assert ids_abs.isdisjoint(ids_rel) and len(ids_abs) == len(ids_rel) == 10
    stats = roundtrip(out, tmp_path, capsys, requests=10)
    assert stats["sessions"]["sessions"] == 4  # type: ignore[index]
    assert stats["prefix_cache"]["infinite_capacity_hit_rate"]["64"] > 0.4  # type: ignore[index]


def test_a_json_file_and_a_folder_of_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for name in ("b", "a"):
        (folder / f"{name}.json").write_text(
            json.dumps(weka_session(name, relative_subagent=True), indent=2)
        )
    out = tmp_path / "one.jsonl"
    assert main(["trace", "convert", str(folder / "a.json"), str(out)]) == 0
    assert len(read_trace(out)) == 5
    assert (
        main(["trace", "convert", str(folder), str(tmp_path / "all.parquet"), "--from", "weka"])
        == 0
    )
    assert "10 requests, 4 sessions" in capsys.readouterr().out
    assert main(["trace", "stats", str(folder), "--json", "--no-reuse"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 10


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (lambda s: s["requests"][1].update({"in": "400"}), "requests[1].in", "integer >= 0"),
        (lambda s: s["requests"][1].update({"hash_ids": [0, 1]}), "requests[1].hash_ids",
         "2 ids, but in=400 with block_size 64 needs 7"),
        (lambda s: s["requests"][2]["requests"][0].pop("t"), "requests[2].requests[0].t",
         "seconds >= 0"),
        (lambda s: s["requests"][0].update({"type": "x"}), "requests[0].type", "expected one of"),
        (lambda s: s.update({"block_size": 32}), "block_size", "earlier sessions have 64"),
    ],
)  # fmt: skip
def test_malformed_session_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, field: str, says: str
) -> None:
    bad = weka_session("bad", relative_subagent=False)
    change(bad)
    src = tmp_path / "bad.jsonl"
    src.write_text(
        json.dumps(weka_session("ok", relative_subagent=False)) + "\n" + json.dumps(bad) + "\n"
    )
    assert main(["trace", "convert", str(src), str(tmp_path / "o.jsonl"), "--from", "weka"]) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["path"], m["line"], m["field"]) == (str(src), "2", field)
    assert says in m["problem"]
    # lenient: the bad session object is skipped, the good one kept
    out = tmp_path / "l.jsonl"
    assert main(["trace", "convert", str(src), str(out), "--from", "weka", "--lenient"]) == 0
    assert "skipped 1" in capsys.readouterr().err and len(read_trace(out)) == 5
