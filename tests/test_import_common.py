"""The importers' shared parts (prefix-id remapping, turns and think times), and the
round trip every imported trace must survive: `trace stats`, `hitrate` and `run`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli.main import main
from traces.importers.common import ImportedRow, PrefixIds, build_requests

#: what `run` and `hitrate` get in these tests: a small device pool, a few requests
SMALL = ["--set", "gpu.device_tokens=65536"]
#: FILE:LINE: field: problem, one line, after the CLI's prefix
ERROR = re.compile(
    r"^hicache-sim: (?P<path>.+?):(?P<line>\d+): (?P<field>[^:]+): (?P<problem>.+)\n$"
)


def roundtrip(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *, requests: int
) -> dict[str, object]:
    """Run `trace stats --json`, `hitrate` and `run` on a converted trace; check each
    replays `requests` requests (at most 40) and return the stats."""
    assert main(["trace", "stats", str(trace), "--json", "--no-reuse"]) == 0
    stats: dict[str, object] = json.loads(capsys.readouterr().out)
    assert stats["requests"] == requests
    n = str(min(requests, 40))
    assert (
        main(["hitrate", str(trace), "--device-tokens", "65536", "--max-requests", n, "--json"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and 0.0 <= rows[0]["hit_rate"] <= 1.0
    out = tmp_path / f"run-{trace.stem}"
    assert main(["run", str(trace), "--out", str(out), *SMALL, "--max-requests", n]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == int(n)
    return stats


def one_line_error(err: str) -> re.Match[str]:
    """The CLI's one-line error, parsed (fails the test if it is not one)."""
    m = ERROR.match(err)
    assert m is not None, err
    return m


def test_prefix_ids_namespace_and_prefix_semantics() -> None:
    ids = PrefixIds()
    a = ids.map("t1", [0, 1, 2])
    assert a == [0, 1, 2]
    assert ids.map("t1", [0, 1, 5]) == [0, 1, 3]  # shares the first two blocks
    assert ids.map("t2", [0, 1]) == [4, 5]  # another scope: nothing shared
    assert ids.map("t1", [1]) == [6]  # a source id under another parent is another block
    assert ids.fresh(2) == [7, 8]


def test_build_requests_turns_and_think_times() -> None:
    rows = [
        ImportedRow(3000.0, 8, 1, line=3, session="a", latency_ms=500.0),
        ImportedRow(1000.0, 8, 1, line=1, session="a", latency_ms=1500.0),
        ImportedRow(2000.0, 8, 1, line=2, session="b"),
        ImportedRow(9000.0, 8, 1, line=4, session="a", think_ms=250.0),
        ImportedRow(9500.0, 8, 1, line=5),
    ]
    reqs = build_requests(rows)
    assert [r.timestamp for r in reqs] == [0.0, 1000.0, 2000.0, 8000.0, 8500.0]
    assert [(r.session_id, r.turn) for r in reqs] == [
        ("a", 0), ("b", 0), ("a", 1), ("a", 2), (None, None)
    ]  # fmt: skip
    # a's turn 1: 2000 ms after turn 0 arrived, which ran 1500 ms; turn 2 recorded its own
    assert [r.think_time_ms for r in reqs] == [None, None, 500.0, 250.0, None]
