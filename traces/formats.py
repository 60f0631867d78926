"""The trace file formats: which one a file name implies, and where Parquet keeps the header.

Shared by the reader (`traces.reader`) and the writer (`traces.writer`); `traces.io`
re-exports all of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from traces.schema import TraceError

FileKind = Literal["jsonl", "jsonl.gz", "parquet"]

# Parquet keeps the header as JSON under this schema-metadata key.
PARQUET_HEADER_KEY = b"hicache-trace"


def file_kind(path: str | Path) -> FileKind:
    """The trace format implied by the file name: .jsonl, .jsonl.gz or .parquet.

    Raises `TraceError` (line 0) for any other suffix.
    """
    name = Path(path).name.lower()
    if name.endswith(".jsonl.gz"):
        return "jsonl.gz"
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise TraceError(
        path, 0, "file", "unknown trace suffix (expected .jsonl, .jsonl.gz or .parquet)"
    )


def cannot_open(path: str | Path, exc: OSError) -> TraceError:
    """The error for a file that could not be opened (line 0, field "file")."""
    return TraceError(path, 0, "file", f"cannot open: {exc.strerror or exc}")
