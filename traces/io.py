"""Reading and writing traces: JSONL (plain or gzip) and Parquet, chosen by file suffix.

The JSONL reader streams (one line in memory at a time). Every request goes through
`traces.schema.validate_request`; a bad line raises `TraceError` ("FILE:LINE: field:
problem") unless the read is lenient, in which case it is skipped and counted.

This module is the public entry point; the work is done in `traces.reader` (`TraceReader`),
`traces.writer` (`write_trace`) and `traces.formats` (`file_kind`), whose names it
re-exports.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from traces.formats import PARQUET_HEADER_KEY, FileKind, file_kind
from traces.reader import MAX_SKIPPED_EXAMPLES, TraceReader
from traces.schema import Trace
from traces.store import RequestColumns
from traces.writer import write_trace

__all__ = [
    "MAX_SKIPPED_EXAMPLES",
    "PARQUET_HEADER_KEY",
    "FileKind",
    "TraceReader",
    "TraceSkipWarning",
    "file_kind",
    "iter_requests",
    "read_trace",
    "write_trace",
]


class TraceSkipWarning(UserWarning):
    """Issued by a lenient `read_trace` that skipped bad lines."""


def iter_requests(path: str | Path, *, lenient: bool = False) -> TraceReader:
    """Stream the requests of a trace file in constant memory.

    Returns a `TraceReader`: iterate it for `Request`s; its `header` is available at once
    and its `skipped` counters after iteration. Raises `TraceError` on the first bad line
    (strict) or at the end if no request was valid.
    """
    return TraceReader(path, lenient=lenient)


def read_trace(path: str | Path, *, lenient: bool = False) -> Trace:
    """Read a whole trace file (format by suffix: .jsonl, .jsonl.gz, .parquet).

    A JSONL file without a header line (any Mooncake trace) gets the default header,
    block_size 512. Strict reads raise `TraceError` on the first bad line; lenient reads skip
    bad lines, record them on the returned `Trace` (`skipped`, `skipped_by_field`,
    `skipped_examples`) and issue one `TraceSkipWarning`. The requests are held column by
    column (`traces.store.RequestColumns`, about 0.3 KB per Mooncake request instead of 1.1 KB
    as `Request` objects).
    """
    with TraceReader(path, lenient=lenient) as reader:
        requests = RequestColumns(reader)
    trace = Trace(
        requests=requests,
        header=reader.header,
        path=Path(path),
        skipped=reader.skipped,
        skipped_by_field=reader.skipped_by_field,
        skipped_examples=reader.skipped_examples,
    )
    if trace.skipped:
        warnings.warn(trace.skip_summary(), TraceSkipWarning, stacklevel=2)
    return trace
