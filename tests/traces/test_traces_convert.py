"""CSV converters (vidur/Splitwise, Azure) and format conversion."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces.convert import NO_PREFIX_NOTE, convert, read_any, read_csv_trace, sniff_csv
from traces.io import TraceSkipWarning, read_trace
from traces.schema import TraceError
from traces.stats import infinite_capacity_hit_rate

VIDUR = """arrived_at,num_prefill_tokens,num_decode_tokens
0.0,1000,10
0.5,512,3.0
0.25,1,0
"""

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,1025,0
"""


def _csv(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_vidur_csv(tmp_path: Path) -> None:
    path = _csv(tmp_path, VIDUR)
    assert sniff_csv(path) == "vidur"
    trace = read_csv_trace(path)
    # sorted by time; each request has unique, consecutive ids
    assert [r.timestamp for r in trace] == [0.0, 250.0, 500.0]
    assert [r.input_length for r in trace] == [1000, 1, 512]
    assert [r.output_length for r in trace] == [10, 0, 3]
    assert [r.hash_ids for r in trace] == [[0, 1], [2], [3]]
    extra = trace.header.extra
    assert extra["prefix_info"] is False
    assert extra["note"] == NO_PREFIX_NOTE
    assert extra["rows_out_of_order"] == 1
    assert infinite_capacity_hit_rate(trace, 1) == 0.0


def test_azure_csv(tmp_path: Path) -> None:
    path = _csv(tmp_path, AZURE)
    trace = read_any(path)
    assert [r.timestamp for r in trace] == pytest.approx([0.0, 4314.579, 4319.41])
    assert [len(r.hash_ids or []) for r in trace] == [1, 1, 3]
    assert trace.header.extra["source"] == "Azure CSV"
    small = read_csv_trace(path, "azure", block_size=16)
    assert [len(r.hash_ids or []) for r in small] == [24, 25, 65]


@pytest.mark.parametrize(
    ("text", "line", "field", "fragment"),
    [
        ("arrived_at,num_prefill_tokens\n0,1\n", 1, "header", "not a known CSV trace"),
        ("", 0, "file", "empty"),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,x,1\n",
            2,
            "num_prefill_tokens",
            "not a number",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,0,1\n",
            3,
            "num_prefill_tokens",
            ">= 1",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,-1\n",
            2,
            "num_decode_tokens",
            ">= 0",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1.5,1\n",
            2,
            "num_prefill_tokens",
            "not an integer",
        ),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n-1,1,1\n", 2, "arrived_at", ">= 0"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1\n", 2, "line", "2 cells"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n", 0, "file", "no rows"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n",
            2,
            "TIMESTAMP",
            "not a date-time",
        ),
    ],
)
def test_bad_csv(tmp_path: Path, text: str, line: int, field: str, fragment: str) -> None:
    path = _csv(tmp_path, text)
    with pytest.raises(TraceError) as info:
        read_any(path)
    assert (info.value.line, info.value.field) == (line, field)
    assert fragment in info.value.problem


def test_csv_lenient(tmp_path: Path) -> None:
    path = _csv(tmp_path, VIDUR + "1,x,1\n2,5,1\n")
    with pytest.warns(TraceSkipWarning, match="skipped 1 bad line"):
        trace = read_any(path, "splitwise", lenient=True)
    assert len(trace) == 4
    assert trace.skipped_by_field == {"num_prefill_tokens": 1}


def test_convert_formats(tmp_path: Path) -> None:
    src = _csv(tmp_path, AZURE)
    out = tmp_path / "a.parquet"
    written = convert(src, out, "azure")
    assert read_trace(out).requests == written.requests
    back = tmp_path / "b.jsonl.gz"
    convert(out, back)
    assert read_trace(back).header == written.header
    with pytest.raises(TraceError, match="does not match the file suffix"):
        read_any(out, "jsonl")
    with pytest.raises(ValueError, match="unknown source format"):
        read_any(out, "xml")
    with pytest.raises(TraceError, match="unknown trace suffix"):
        read_any(tmp_path / "x.txt")
