"""Reading, validating and writing trace files."""

from __future__ import annotations

import gzip
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.traces.trace_helpers import ERROR_LINE, HEADER, WriteLines, req
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import TraceSkipWarning, iter_requests, read_trace, write_trace
from traces.schema import Request, Trace, TraceError, TraceHeader, validate_request

# (lines after the header, expected line, expected field, fragment of the problem)
BAD_LINES: list[tuple[str, list[Any], int, str, str]] = [
    ("not json", ['{"timestamp": 0,'], 2, "line", "not valid JSON"),
    (
        "trailing junk",
        ['{"timestamp": 0, "input_length": 1, "output_length": 1} x'],
        2,
        "line",
        "not valid JSON",
    ),
    ("not an object", ["[1, 2]"], 2, "line", "not a JSON object"),
    (
        "missing output_length",
        [{"timestamp": 0, "input_length": 4, "hash_ids": [0]}],
        2,
        "output_length",
        "missing field",
    ),
    (
        "missing timestamp",
        [{"input_length": 4, "output_length": 1, "hash_ids": [0]}],
        2,
        "timestamp",
        "missing field",
    ),
    (
        "missing ids",
        [{"timestamp": 0, "input_length": 4, "output_length": 1}],
        2,
        "hash_ids",
        "missing field",
    ),
    ("negative input", [req(0, -4, hash_ids=[])], 2, "input_length", ">= 1"),
    ("zero input", [req(0, 0, hash_ids=[])], 2, "input_length", ">= 1"),
    ("negative output", [req(0, 4, -1)], 2, "output_length", ">= 0"),
    ("float length", [req(0, 3.5, hash_ids=[0])], 2, "input_length", "integer"),
    ("bool length", [req(0, True, hash_ids=[0])], 2, "input_length", "integer"),
    ("too few hash ids", [req(0, 9, hash_ids=[0, 1])], 2, "hash_ids", "ceil(9/4) = 3"),
    ("too many hash ids", [req(0, 4, hash_ids=[0, 1])], 2, "hash_ids", "ceil(4/4) = 1"),
    ("negative hash id", [req(0, 4, hash_ids=[-1])], 2, "hash_ids", ">= 0"),
    ("string hash id", [req(0, 4, hash_ids=["a"])], 2, "hash_ids", "only integers"),
    ("hash ids not a list", [req(0, 4, hash_ids=7)], 2, "hash_ids", "list"),
    ("huge hash id", [req(0, 4, hash_ids=[2**62])], 2, "hash_ids", "64 bits"),
    ("backwards", [req(10, 4), req(5, 4)], 3, "timestamp", "goes backwards (5 after 10)"),
    ("negative timestamp", [req(-1, 4)], 2, "timestamp", ">= 0"),
    (
        "nan timestamp",
        ['{"timestamp": NaN, "input_length": 4, "output_length": 1, "hash_ids": [0]}'],
        2,
        "timestamp",
        "finite",
    ),
    ("string timestamp", [req("0", 4)], 2, "timestamp", "number"),
    ("unknown field", [req(0, 4, hash_id=[0])], 2, "hash_id", "unknown field"),
    (
        "both id kinds",
        [req(0, 4, hash_ids=[0], token_ids=[1, 2, 3, 4])],
        2,
        "token_ids",
        "not both",
    ),
    ("token count", [req(0, 4, token_ids=[1, 2, 3])], 2, "token_ids", "input_length is 4"),
    ("mixed kinds", [req(0, 4), req(1, 4, token_ids=[1, 2, 3, 4])], 3, "token_ids", "mixes"),
    ("int session", [req(0, 4, session_id=3)], 2, "session_id", "string"),
    ("negative turn", [req(0, 4, turn=-1)], 2, "turn", ">= 0"),
    ("negative think", [req(0, 4, think_time_ms=-5)], 2, "think_time_ms", ">= 0"),
    ("string priority", [req(0, 4, priority="high")], 2, "priority", "integer"),
    ("int rid", [req(0, 4, rid=7)], 2, "rid", "string"),
    ("bad line later", [req(0, 4), req(1, 4), req(2, 4, 1.5)], 4, "output_length", "integer"),
]


@pytest.mark.parametrize(
    ("lines", "line", "field", "fragment"),
    [case[1:] for case in BAD_LINES],
    ids=[case[0] for case in BAD_LINES],
)
def test_bad_line(
    write_lines: WriteLines, lines: list[Any], line: int, field: str, fragment: str
) -> None:
    path = write_lines(HEADER, *lines)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert fragment in err.problem
    assert str(err) == f"{path}:{line}: {field}: {err.problem}"
    assert ERROR_LINE.match(str(err))


BAD_FILES: list[tuple[str, list[Any], int, str, str]] = [
    ("empty file", [], 0, "file", "empty file"),
    ("blank lines only", ["", "   "], 0, "file", "empty file"),
    ("header only", [HEADER], 0, "file", "no requests"),
    (
        "unknown version",
        [{**HEADER, "version": 2}, req(0, 4)],
        1,
        "version",
        "unsupported trace version 2",
    ),
    ("missing version", [{"format": "hicache-trace"}, req(0, 4)], 1, "version", "missing"),
    ("unknown format", [{**HEADER, "format": "other"}, req(0, 4)], 1, "format", "unknown"),
    ("bad block size", [{**HEADER, "block_size": 0}, req(0, 4)], 1, "block_size", "positive"),
]


@pytest.mark.parametrize(
    ("lines", "line", "field", "fragment"),
    [case[1:] for case in BAD_FILES],
    ids=[case[0] for case in BAD_FILES],
)
def test_bad_file(
    write_lines: WriteLines, lines: list[Any], line: int, field: str, fragment: str
) -> None:
    path = write_lines(*lines)
    for lenient in (False, True):  # whole-file problems are fatal even when lenient
        with pytest.raises(TraceError) as info:
            read_trace(path, lenient=lenient)
        assert (info.value.line, info.value.field) == (line, field)
        assert fragment in info.value.problem


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = json.dumps(req(0, 4)).encode()
    path.write_bytes(good + b"\n" + b'{"timestamp": "\xff"}\n')
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (2, "line")
    assert "UTF-8" in info.value.problem


def test_missing_file_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as info:
        read_trace(tmp_path / "nope.jsonl")
    assert (info.value.line, info.value.field) == (0, "file")
    (tmp_path / "t.csv").write_text("x\n")
    with pytest.raises(TraceError, match="unknown trace suffix"):
        read_trace(tmp_path / "t.csv")


def test_mooncake_file_needs_no_header(write_lines: WriteLines) -> None:
    path = write_lines(
        {"timestamp": 0, "input_length": 513, "output_length": 2, "hash_ids": [0, 1]}
    )
    trace = read_trace(path)
    assert trace.block_size == 512
    assert trace[0] == Request(0.0, 513, 2, [0, 1])
    assert len(trace) == 1
    assert list(trace) == trace.requests
    assert trace.path == path


def test_blank_lines_are_ignored(write_lines: WriteLines) -> None:
    path = write_lines("", HEADER, req(0, 4), "  ", req(1, 4), "")
    assert len(read_trace(path)) == 2


def test_header_extra_fields_kept(write_lines: WriteLines) -> None:
    path = write_lines({**HEADER, "generator": "x", "params": {"a": 1}}, req(0, 4))
    header = read_trace(path).header
    assert header.block_size == 4
    assert header.extra == {"generator": "x", "params": {"a": 1}}


def test_lenient_skips_and_counts(write_lines: WriteLines) -> None:
    path = write_lines(
        HEADER,
        req(0, 4),
        "garbage",
        req(5, 4, -1),
        req(3, 4),  # line 4 was skipped, so this follows 0: fine
        req(1, 4),  # backwards (1 after 3): skipped
        req(6, 8, hash_ids=[0]),
        req(7, 4),
    )
    with pytest.warns(TraceSkipWarning, match="skipped 4 bad lines"):
        trace = read_trace(path, lenient=True)
    assert [r.timestamp for r in trace] == [0, 3, 7]
    assert trace.skipped == 4
    assert trace.skipped_by_field == {"line": 1, "output_length": 1, "timestamp": 1, "hash_ids": 1}
    assert [e.line for e in trace.skipped_examples] == [3, 4, 6, 7]
    summary = trace.skip_summary()
    assert summary.startswith(f"{path}: skipped 4 bad lines (")
    assert "\n" not in summary


def test_lenient_with_nothing_valid(write_lines: WriteLines) -> None:
    path = write_lines(HEADER, "x", "y")
    with pytest.raises(TraceError, match=r":0: file: no valid requests \(2 bad lines"):
        read_trace(path, lenient=True)


def test_strict_read_has_no_skips(write_lines: WriteLines) -> None:
    path = write_lines(HEADER, req(0, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = read_trace(path, lenient=True)
    assert trace.skipped == 0
    assert trace.skip_summary() == ""


def test_iter_requests_streams(write_lines: WriteLines) -> None:
    path = write_lines(
        {**HEADER, "block_size": 8}, req(0, 8, hash_ids=[0]), req(1, 8, hash_ids=[1]), "not json"
    )
    reader = iter_requests(path)
    assert reader.header.block_size == 8  # known before iterating
    it = iter(reader)
    assert next(it).hash_ids == [0]
    assert next(it).hash_ids == [1]
    with pytest.raises(TraceError, match=":4: line:"):
        next(it)
    assert reader.count == 2

    lenient = iter_requests(path, lenient=True)
    with lenient:
        assert len(list(lenient)) == 2
    assert lenient.skipped == 1


def test_iter_requests_can_stop_early(write_lines: WriteLines) -> None:
    path = write_lines(HEADER, req(0, 4), req(1, 4))
    with iter_requests(path) as reader:
        for _ in reader:
            break
    assert reader.count == 1


def test_validate_request_direct() -> None:
    r = validate_request(
        {
            "timestamp": 1,
            "input_length": 3,
            "output_length": 0,
            "token_ids": [5, 6, 7],
            "session_id": "s",
            "turn": 2,
            "think_time_ms": 4,
            "priority": -1,
            "rid": "r",
        }
    )
    assert r == Request(1.0, 3, 0, None, [5, 6, 7], "s", 2, 4.0, -1, "r")
    assert isinstance(r.timestamp, float)
    with pytest.raises(TraceError) as info:
        validate_request({}, path="f.jsonl", line=9)
    assert str(info.value) == "f.jsonl:9: timestamp: missing field"


def test_trace_error_pickles() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(TraceError("f", 3, "x", "bad")))
    assert (err.path, err.line, err.field, err.problem, str(err)) == (
        "f",
        3,
        "x",
        "bad",
        "f:3: x: bad",
    )


# -- round trips --------------------------------------------------------------------------


def _rich_trace() -> Trace:
    reqs = [
        Request(0.0, 5, 1, hash_ids=[0, 1], session_id="a", turn=0, priority=2, rid="r0"),
        Request(1.25, 9, 0, hash_ids=[0, 1, 2], session_id="a", turn=1, think_time_ms=12.5),
        Request(1.25, 4, 7, hash_ids=[9]),
        Request(3e9, 4, 7, hash_ids=[10], rid='x\u00e9\n"y"'),
    ]
    return Trace(reqs, TraceHeader(block_size=4, extra={"note": "hi", "params": {"a": [1]}}))


@pytest.mark.parametrize("mid", ["t.parquet", "t.jsonl.gz", "t.jsonl"])
def test_round_trip_rich(tmp_path: Path, mid: str) -> None:
    trace = _rich_trace()
    first = write_trace(trace, tmp_path / "a.jsonl")
    middle = write_trace(read_trace(first), tmp_path / mid)
    last = write_trace(read_trace(middle), tmp_path / "b.jsonl")
    assert last.read_bytes() == first.read_bytes()
    back = read_trace(middle)
    assert back.requests == trace.requests
    assert back.header == trace.header


def test_round_trip_token_trace(tmp_path: Path) -> None:
    trace = Trace([Request(0.5, 3, 1, token_ids=[1, 2, 3]), Request(2, 2, 1, token_ids=[1, 9])])
    for name in ("t.parquet", "t.jsonl.gz"):
        assert read_trace(write_trace(trace, tmp_path / name)).requests == trace.requests


def test_round_trip_mooncake_lossless(tmp_path: Path) -> None:
    original = read_trace(MOONCAKE_CONVERSATION)
    pq = write_trace(original, tmp_path / "c.parquet")
    jl = write_trace(read_trace(pq), tmp_path / "c.jsonl")
    back = read_trace(jl)
    assert back.requests == original.requests
    assert back.header == original.header
    # apart from the header line the file is byte-identical to Mooncake's
    lines = jl.read_bytes().split(b"\n", 1)
    assert json.loads(lines[0]) == {"format": "hicache-trace", "version": 1, "block_size": 512}
    assert lines[1] == MOONCAKE_CONVERSATION.read_bytes()


def test_gzip_is_reproducible_and_corrupt_gzip_fails(tmp_path: Path) -> None:
    trace = _rich_trace()
    a = write_trace(trace, tmp_path / "a.jsonl.gz").read_bytes()
    b = write_trace(trace, tmp_path / "b.jsonl.gz").read_bytes()
    assert a == b
    assert gzip.decompress(a).startswith(b'{"format": "hicache-trace"')
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"this is not gzip\n")
    with pytest.raises(TraceError, match=":1: file: cannot read"):
        read_trace(bad)
    truncated = tmp_path / "trunc.jsonl.gz"
    truncated.write_bytes(a[: len(a) // 2])
    with pytest.raises(TraceError, match="file: cannot read"):
        read_trace(truncated)


def test_write_is_atomic_and_validates(tmp_path: Path) -> None:
    path = write_trace(_rich_trace(), tmp_path / "t.jsonl")
    before = path.read_bytes()
    mode = stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask
    bad = [Request(0, 4, 1, hash_ids=[0]), Request(-1, 4, 1, hash_ids=[1])]
    for name in ("t.jsonl", "t.parquet"):
        with pytest.raises(TraceError, match=r":\d+: timestamp: must be >= 0"):
            write_trace(bad, tmp_path / name, TraceHeader(block_size=4))
    assert path.read_bytes() == before
    assert not (tmp_path / "t.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]  # no temp files left
    with pytest.raises(TraceError, match="no requests"):
        write_trace([], tmp_path / "e.jsonl")
    with pytest.raises(TraceError, match=r"x\.jsonl:0: file: cannot write"):
        write_trace(_rich_trace(), tmp_path / "missing" / "x.jsonl")


def test_write_plain_requests_uses_default_header(tmp_path: Path) -> None:
    path = write_trace([Request(0, 600, 1, hash_ids=[3, 4])], tmp_path / "t.jsonl")
    assert read_trace(path).block_size == 512


# -- Parquet problems ---------------------------------------------------------------------


def _parquet(tmp_path: Path, columns: dict[str, list[Any]], metadata: bytes | None = None) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    if metadata is not None:
        table = table.replace_schema_metadata({b"hicache-trace": metadata})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    return path


def test_parquet_without_header_and_row_errors(tmp_path: Path) -> None:
    cols: dict[str, list[Any]] = {
        "timestamp": [0.0, 1.0, 0.5],
        "input_length": [600, 600, 600],
        "output_length": [1, 1, 1],
        "hash_ids": [[0, 1], [0, 1], [0, 1]],
    }
    path = _parquet(tmp_path, cols)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (3, "timestamp")
    with pytest.warns(TraceSkipWarning):
        assert len(read_trace(path, lenient=True)) == 2


def test_parquet_bad_schema(tmp_path: Path) -> None:
    path = _parquet(tmp_path, {"timestamp": [0.0], "input_length": [4], "hash_ids": [[0]]})
    with pytest.raises(TraceError, match=":0: output_length: missing column"):
        read_trace(path)
    path = _parquet(
        tmp_path,
        {
            "timestamp": [0.0],
            "input_length": [4],
            "output_length": [1],
            "hash_ids": [[0]],
            "extra": [1],
        },
    )
    with pytest.raises(TraceError, match=":0: extra: unknown column"):
        read_trace(path)
    meta = json.dumps({**HEADER, "version": 7}).encode()
    path = _parquet(
        tmp_path,
        {"timestamp": [0.0], "input_length": [4], "output_length": [1], "hash_ids": [[0]]},
        meta,
    )
    with pytest.raises(TraceError, match=":0: version: unsupported"):
        read_trace(path)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(TraceError, match=":0: file: not a Parquet file"):
        read_trace(junk)


def test_io_re_exports_the_reader_writer_and_formats() -> None:
    import traces.io
    from traces.formats import PARQUET_HEADER_KEY, file_kind
    from traces.reader import MAX_SKIPPED_EXAMPLES, TraceReader
    from traces.writer import write_trace as writer_write_trace

    assert traces.io.TraceReader is TraceReader
    assert traces.io.write_trace is writer_write_trace
    assert traces.io.file_kind is file_kind
    assert traces.io.MAX_SKIPPED_EXAMPLES == MAX_SKIPPED_EXAMPLES == 20
    assert traces.io.PARQUET_HEADER_KEY == PARQUET_HEADER_KEY == b"hicache-trace"
