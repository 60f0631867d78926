"""Streaming reader of trace files (JSONL, plain or gzip, and Parquet): `TraceReader`.

Every request goes through `traces.schema.validate_request`; a bad line raises `TraceError`
("FILE:LINE: field: problem") unless the read is lenient, in which case it is skipped and
counted (`record_skip`). The entry points are `traces.io.read_trace` and
`traces.io.iter_requests`.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from traces.formats import PARQUET_HEADER_KEY, FileKind, cannot_open, file_kind
from traces.schema import (
    REQUEST_FIELDS,
    REQUIRED_FIELDS,
    IdKind,
    Request,
    TraceError,
    TraceHeader,
    is_header_object,
    parse_header,
    validate_request,
)

# Lenient reads keep this many errors verbatim (the rest are only counted per field).
MAX_SKIPPED_EXAMPLES = 20
_PARQUET_BATCH = 8192


class _ByteLines(Protocol):
    def __iter__(self) -> Iterator[bytes]: ...
    def close(self) -> None: ...


class SkipCounts(Protocol):
    """What a lenient read records about the lines it dropped (a `TraceReader`, a `Trace`)."""

    skipped: int
    skipped_by_field: Counter[str]
    skipped_examples: list[TraceError]


def record_skip(counts: SkipCounts, err: TraceError) -> None:
    """Count a line that a lenient read dropped, per field; keep the first
    `MAX_SKIPPED_EXAMPLES` errors verbatim."""
    counts.skipped += 1
    counts.skipped_by_field[err.field] += 1
    if len(counts.skipped_examples) < MAX_SKIPPED_EXAMPLES:
        counts.skipped_examples.append(err)


class TraceReader:
    """A streaming reader over the requests of one trace file.

    The header is read when the reader is created (`header`); iterating yields validated
    `Request`s in file order, holding one line (JSONL) or one row group batch (Parquet) in
    memory. After iteration, `count` is the number of requests yielded and `skipped`,
    `skipped_by_field`, `skipped_examples` describe what a lenient read dropped. Header
    problems, an empty file and a file with no valid request are errors even when lenient.
    A reader can be iterated once; use it as a context manager to close the file early.
    """

    def __init__(self, path: str | Path, *, lenient: bool = False) -> None:
        self.path = Path(path)
        self.lenient = lenient
        self.kind: FileKind = file_kind(self.path)
        self.header = TraceHeader()
        self.count = 0
        self.skipped = 0
        self.skipped_by_field: Counter[str] = Counter()
        self.skipped_examples: list[TraceError] = []
        self._closers: list[Any] = []
        self._iter: Iterator[Request]
        try:
            if self.kind == "parquet":
                self._iter = self._open_parquet()
            else:
                self._iter = self._open_jsonl()
        except OSError as exc:
            self.close()
            raise cannot_open(self.path, exc) from None
        except BaseException:
            self.close()
            raise

    # -- public -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Request]:
        return self._iter

    def close(self) -> None:
        """Close the underlying file (idempotent)."""
        while self._closers:
            self._closers.pop().close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- shared -------------------------------------------------------------------------

    def _validated(
        self, rows: Iterator[tuple[int, Any]], parse: Callable[[Any, Path, int], object] | None
    ) -> Iterator[Request]:
        """Validate `rows` ((line, raw) pairs in file order, each raw turned into a request
        object by `parse`, or already one when it is None) into requests. A bad row raises
        or, in a lenient read, is skipped; closes the file and checks the count when done."""
        path = self.path
        block_size = self.header.block_size
        lenient = self.lenient
        prev: float | None = None
        kind: IdKind | None = None
        try:
            for line, raw in rows:
                try:
                    obj = raw if parse is None else parse(raw, path, line)
                    req = validate_request(
                        obj,
                        block_size=block_size,
                        path=path,
                        line=line,
                        prev_timestamp=prev,
                        id_kind=kind,
                    )
                except TraceError as err:
                    if not lenient:
                        raise
                    record_skip(self, err)
                    continue
                if kind is None:
                    kind = "hash_ids" if req.hash_ids is not None else "token_ids"
                prev = req.timestamp
                self.count += 1
                yield req
        finally:
            self.close()
        self._finish()

    def _finish(self) -> None:
        self.close()
        if self.count == 0:
            if self.skipped:
                raise TraceError(
                    self.path, 0, "file", f"no valid requests ({self.skipped} bad lines skipped)"
                )
            raise TraceError(self.path, 0, "file", "no requests")

    # -- JSONL --------------------------------------------------------------------------

    def _open_jsonl(self) -> Iterator[Request]:
        raw: _ByteLines
        # Binary lines: json.loads decodes UTF-8 itself, so a bad byte is reported on its
        # own line instead of failing somewhere inside a text buffer.
        # The file outlives this method: close() and the request generator close it.
        opener = gzip.open if self.kind == "jsonl.gz" else open
        raw = opener(self.path, "rb")
        self._closers.append(raw)
        lines = enumerate(raw, start=1)
        first: tuple[int, bytes] | None = None
        try:
            for lineno, text in lines:
                if text.isspace():
                    continue
                first = (lineno, text)
                break
        except (OSError, EOFError) as exc:
            raise TraceError(self.path, 1, "file", f"cannot read: {exc}") from None
        if first is None:
            raise TraceError(self.path, 0, "file", "empty file (no header and no requests)")
        lineno, text = first
        obj = _loads_or_none(text)
        if is_header_object(obj):
            assert isinstance(obj, dict)
            self.header = parse_header(obj, path=self.path, line=lineno)
            first = None
        return self._validated(self._jsonl_rows(lines, first), _parse_line)

    def _jsonl_rows(
        self, lines: Iterator[tuple[int, bytes]], first: tuple[int, bytes] | None
    ) -> Iterator[tuple[int, bytes]]:
        """The non-blank lines after the header (`first`, if given, is the first of them)."""
        pending = [first] if first is not None else []
        lineno = first[0] if first is not None else 1
        try:
            for lineno, text in itertools.chain(pending, lines):
                if not text.isspace():
                    yield lineno, text
        except (OSError, EOFError) as exc:
            raise TraceError(self.path, lineno + 1, "file", f"cannot read: {exc}") from None

    # -- Parquet ------------------------------------------------------------------------

    def _open_parquet(self) -> Iterator[Request]:
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except OSError:
            raise
        except Exception as exc:  # pyarrow raises ArrowInvalid (a ValueError) on junk
            raise TraceError(self.path, 0, "file", f"not a Parquet file ({exc})") from None
        self._closers.append(pf)
        meta = pf.schema_arrow.metadata or {}
        if PARQUET_HEADER_KEY in meta:
            try:
                obj = json.loads(meta[PARQUET_HEADER_KEY])
            except ValueError:
                raise TraceError(
                    self.path, 0, "header", "Parquet header metadata is not valid JSON"
                ) from None
            if not is_header_object(obj):
                raise TraceError(self.path, 0, "format", "missing field in Parquet header")
            self.header = parse_header(obj, path=self.path, line=0)
        names = list(pf.schema_arrow.names)
        for name in names:
            if name not in REQUEST_FIELDS:
                raise TraceError(
                    self.path,
                    0,
                    name,
                    "unknown column (known columns: " + ", ".join(REQUEST_FIELDS) + ")",
                )
        for name in REQUIRED_FIELDS:
            if name not in names:
                raise TraceError(self.path, 0, name, "missing column")
        if pf.metadata.num_rows == 0:
            raise TraceError(self.path, 0, "file", "no requests")
        return self._validated(_parquet_rows(pf, names), None)


def _parquet_rows(pf: Any, names: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, request object) per row of a Parquet file; nulls are left out."""
    row = 0
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, columns=names):
        cols = [(name, batch.column(name).to_pylist()) for name in names]
        for i in range(batch.num_rows):
            row += 1
            yield row, {name: col[i] for name, col in cols if col[i] is not None}


_raw_decode = json.JSONDecoder().raw_decode


def _parse_line(text: bytes, path: Path, lineno: int) -> object:
    """One JSON value from one line, or a TraceError naming the line."""
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(path, lineno, "line", "not valid UTF-8") from None
    try:
        # raw_decode skips json.loads' encoding sniffing and whitespace regexes (about a
        # third of the parse time); it leaves trailing text, which is checked here.
        obj, end = _raw_decode(s)
        if end != len(s) and not s[end:].isspace():
            json.loads(s)  # raises "Extra data" with the right column
    except ValueError:
        try:
            return json.loads(s)  # leading whitespace is legal: let json.loads decide
        except ValueError as exc:
            # json's messages may end in "at" ("Unterminated string starting at"): the column
            # says where
            msg = getattr(exc, "msg", str(exc)).removesuffix(" at")
            col = getattr(exc, "colno", None)
            where = f" at column {col}" if col is not None else ""
            raise TraceError(path, lineno, "line", f"not valid JSON ({msg}{where})") from None
    return obj


def _loads_or_none(text: bytes) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
