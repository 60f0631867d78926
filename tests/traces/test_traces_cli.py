"""`hicache-sim trace ...` through `cli.traces.main` (and once as a subprocess)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.traces import main, register
from tests.traces.trace_helpers import ERROR_LINE, HEADER, WriteLines, req
from traces.bundled import MOONCAKE_SYNTHETIC, synthetic_path
from traces.io import read_trace


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", str(MOONCAKE_SYNTHETIC))
    assert (code, err) == (0, "")
    assert "3,993" in out and "121,877 total / 43,924 unique" in out
    code, out, _ = run(
        capsys, "stats", str(MOONCAKE_SYNTHETIC), "--json", "--page-size", "64", "--no-reuse"
    )
    stats = json.loads(out)
    assert code == 0
    assert stats["requests"] == 3993
    assert list(stats["prefix_cache"]["infinite_capacity_hit_rate"]) == ["64"]
    assert "reuse_distance" not in stats


def test_stats_bad_page_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", str(MOONCAKE_SYNTHETIC), "--page-size", "48")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and "does not divide" in err


@pytest.mark.parametrize("command", ["stats", "validate"])
def test_bad_file_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], write_lines: WriteLines, command: str
) -> None:
    path = write_lines(HEADER, req(0, 4), req(1, 9, hash_ids=[0]))
    code, out, err = run(capsys, command, str(path))
    assert code == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1
    assert err.startswith("hicache-sim: ")  # the one error prefix of every command
    m = ERROR_LINE.match(err.rstrip("\n").removeprefix("hicache-sim: "))
    assert m is not None
    assert (m["path"], m["line"], m["field"]) == (str(path), "3", "hash_ids")


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "validate", str(tmp_path / "none.jsonl"))
    assert code == 2
    assert ERROR_LINE.match(err.rstrip("\n"))
    assert ":0: file: cannot open" in err


def test_validate_lenient(capsys: pytest.CaptureFixture[str], write_lines: WriteLines) -> None:
    path = write_lines(HEADER, req(0, 4), "oops", req(1, 4, -2), req(2, 4))
    code, out, err = run(capsys, "validate", str(path), "--lenient", "--json")
    assert code == 0
    assert json.loads(out) == {
        "file": str(path),
        "valid": True,
        "requests": 2,
        "skipped": 2,
        "block_size": 4,
    }
    assert "skipped 2 bad lines (1 x line, 1 x output_length)" in err
    code, out, err = run(capsys, "stats", str(path), "--lenient")
    assert code == 0
    assert err.count("\n") == 1 and "skipped 2 bad lines" in err
    assert "2 bad lines (lenient read)" in out


def test_convert_csv_says_no_prefix_info(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = tmp_path / "v.csv"
    src.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,1\n1,100,1\n")
    dst = tmp_path / "v.parquet"
    code, out, _ = run(capsys, "convert", str(src), str(dst), "--from", "vidur")
    assert code == 0
    assert "2 requests" in out and "no prefix information" in out
    assert len(read_trace(dst)) == 2


def test_convert_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "v.csv"
    src.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,1\n1,abc,1\n")
    code, _, err = run(capsys, "convert", str(src), str(tmp_path / "o.jsonl"))
    assert code == 2
    assert err == f"hicache-sim: {src}:3: num_prefill_tokens: not a number: 'abc'\n"
    assert not (tmp_path / "o.jsonl").exists()


def test_gen_matches_library(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "m.jsonl"
    code, out, _ = run(
        capsys,
        "gen",
        "multiturn",
        "--clients",
        "32",
        "--rounds",
        "5",
        "--request-rate",
        "4",
        "--seed",
        "1",
        "--out",
        str(out_path),
    )
    assert code == 0 and "160 requests" in out
    assert out_path.read_bytes() == synthetic_path("multiturn").read_bytes()
    code, out, _ = run(
        capsys,
        "gen",
        "agentic",
        "--sessions",
        "2",
        "--no-closed-loop",
        "--out",
        str(tmp_path / "a.parquet"),
        "--json",
    )
    assert code == 0
    assert json.loads(out)["params"]["closed_loop"] is False


def test_gen_bad_parameter(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(
        capsys, "gen", "shared-prefix", "--prefixes", "0", "--out", str(tmp_path / "x.jsonl")
    )
    assert code == 2
    assert err == "hicache-sim: trace gen: prefixes must be > 0, got 0\n"


def test_register_into_parent_parser(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="hicache-sim")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["trace", "validate", str(synthetic_path("agentic"))])
    assert args.func(args) == 0


def test_module_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cli.traces", "validate", str(synthetic_path("long-context-qa"))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok, 64 requests" in proc.stdout
