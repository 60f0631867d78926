"""Writing trace files atomically: JSONL (plain or gzip) and Parquet, chosen by file suffix.

Every request is validated as it is written (`traces.schema.validate_request`), so a file
written here always reads back. The entry point is `write_trace` (also exported by
`traces.io`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from traces.formats import PARQUET_HEADER_KEY, file_kind
from traces.fsutil import write_atomic
from traces.schema import (
    REQUEST_FIELDS,
    REQUIRED_FIELDS,
    IdKind,
    Request,
    Trace,
    TraceError,
    TraceHeader,
    validate_request,
)


class _ByteSink(Protocol):
    def write(self, data: bytes, /) -> int: ...


def write_trace(
    trace_or_requests: Trace | Iterable[Request],
    path: str | Path,
    header: TraceHeader | None = None,
) -> Path:
    """Write a trace to `path` (format by suffix) atomically and return the path.

    The header is `header`, else the Trace's own header, else the default one. Every request
    is validated as it is written (against the header's block_size, in order), so a file
    this function writes always reads back. The data goes to a temporary file in the same
    directory, which then replaces `path` (the one atomic writer, `traces.fsutil`): readers
    never see a half-written trace, and on any failure `path` is left as it was and the
    temporary file is removed.
    Raises `TraceError` for a bad request (naming the line it would have had), for an empty
    trace and for OS errors (line 0, field "file").
    """
    path = Path(path)
    kind = file_kind(path)
    if header is None:
        header = trace_or_requests.header if isinstance(trace_or_requests, Trace) else None
    if header is None:
        header = TraceHeader()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as raw:
            if kind == "parquet":
                _write_parquet(trace_or_requests, header, raw, path)
            elif kind == "jsonl.gz":
                # mtime=0 and no file name: identical input gives identical bytes.
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    _write_jsonl(trace_or_requests, header, gz, path)
            else:
                _write_jsonl(trace_or_requests, header, raw, path)

    try:
        write_atomic(path, write, make_parents=False)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    return path


def _cannot_write(path: Path, exc: OSError) -> TraceError:
    return TraceError(path, 0, "file", f"cannot write: {exc.strerror or exc}")


def _checked(
    requests: Iterable[Request], header: TraceHeader, path: Path, first_line: int
) -> Iterator[tuple[Request, dict[str, Any]]]:
    prev: float | None = None
    kind: IdKind | None = None
    for lineno, req in enumerate(requests, start=first_line):
        obj = req.to_dict()
        validate_request(
            obj,
            block_size=header.block_size,
            path=path,
            line=lineno,
            prev_timestamp=prev,
            id_kind=kind,
        )
        if kind is None:
            kind = "hash_ids" if req.hash_ids is not None else "token_ids"
        prev = req.timestamp
        yield req, obj


def _write_jsonl(
    requests: Iterable[Request], header: TraceHeader, out: _ByteSink, path: Path
) -> None:
    dumps = json.dumps
    out.write(dumps(header.to_dict()).encode() + b"\n")
    n = 0
    for _req, obj in _checked(requests, header, path, first_line=2):
        out.write(dumps(obj).encode() + b"\n")
        n += 1
    if n == 0:
        raise TraceError(path, 0, "file", "refusing to write a trace with no requests")


def _write_parquet(
    requests: Iterable[Request], header: TraceHeader, out: _ByteSink, path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {name: [] for name in REQUEST_FIELDS}
    for req, _obj in _checked(requests, header, path, first_line=1):
        columns["timestamp"].append(req.timestamp)
        columns["input_length"].append(req.input_length)
        columns["output_length"].append(req.output_length)
        columns["hash_ids"].append(req.hash_ids)
        columns["token_ids"].append(req.token_ids)
        columns["session_id"].append(req.session_id)
        columns["turn"].append(req.turn)
        columns["think_time_ms"].append(req.think_time_ms)
        columns["priority"].append(req.priority)
        columns["rid"].append(req.rid)
    if not columns["timestamp"]:
        raise TraceError(path, 0, "file", "refusing to write a trace with no requests")
    types = {
        "timestamp": pa.float64(),
        "input_length": pa.int64(),
        "output_length": pa.int64(),
        "hash_ids": pa.list_(pa.int64()),
        "token_ids": pa.list_(pa.int64()),
        "session_id": pa.string(),
        "turn": pa.int64(),
        "think_time_ms": pa.float64(),
        "priority": pa.int64(),
        "rid": pa.string(),
    }
    # Optional columns that are null everywhere are left out; the reader does not need them.
    keep = [
        name
        for name in REQUEST_FIELDS
        if name in REQUIRED_FIELDS or any(v is not None for v in columns[name])
    ]
    schema = pa.schema([pa.field(name, types[name]) for name in keep]).with_metadata(
        {PARQUET_HEADER_KEY: json.dumps(header.to_dict()).encode()}
    )
    table = pa.table(
        {name: pa.array(columns[name], type=types[name]) for name in keep}, schema=schema
    )
    pq.write_table(table, out)
