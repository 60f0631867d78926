"""Reading and writing traces: JSONL (plain or gzip) and Parquet, chosen by file suffix.

The JSONL reader streams (one line in memory at a time). Every request goes through
`traces.schema.validate_request`; a bad line raises `TraceError` ("FILE:LINE: field:
problem") unless the read is lenient, in which case it is skipped and counted.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import uuid
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

from traces.schema import (
    REQUEST_FIELDS,
    REQUIRED_FIELDS,
    IdKind,
    Request,
    Trace,
    TraceError,
    TraceHeader,
    is_header_object,
    parse_header,
    validate_request,
)

FileKind = Literal["jsonl", "jsonl.gz", "parquet"]

# Parquet keeps the header as JSON under this schema-metadata key.
PARQUET_HEADER_KEY = b"hicache-trace"
# Lenient reads keep this many errors verbatim (the rest are only counted per field).
MAX_SKIPPED_EXAMPLES = 20
_PARQUET_BATCH = 8192


class _ByteLines(Protocol):
    def __iter__(self) -> Iterator[bytes]: ...
    def close(self) -> None: ...


class _ByteSink(Protocol):
    def write(self, data: bytes, /) -> int: ...


class TraceSkipWarning(UserWarning):
    """Issued by a lenient `read_trace` that skipped bad lines."""


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
            raise _os_error(self.path, exc) from None
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

    def _skip(self, err: TraceError) -> None:
        self.skipped += 1
        self.skipped_by_field[err.field] += 1
        if len(self.skipped_examples) < MAX_SKIPPED_EXAMPLES:
            self.skipped_examples.append(err)

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
        return self._jsonl_requests(lines, first)

    def _jsonl_requests(
        self, lines: Iterator[tuple[int, bytes]], first: tuple[int, bytes] | None
    ) -> Iterator[Request]:
        path = self.path
        block_size = self.header.block_size
        lenient = self.lenient
        parse_line = _parse_line
        prev: float | None = None
        kind: IdKind | None = None
        pending = [first] if first is not None else []
        lineno = first[0] if first is not None else 1
        try:
            for lineno, text in _chain(pending, lines):
                if text.isspace():
                    continue
                try:
                    obj = parse_line(text, path, lineno)
                    req = validate_request(
                        obj,
                        block_size=block_size,
                        path=path,
                        line=lineno,
                        prev_timestamp=prev,
                        id_kind=kind,
                    )
                except TraceError as err:
                    if not lenient:
                        raise
                    self._skip(err)
                    continue
                if kind is None:
                    kind = "hash_ids" if req.hash_ids is not None else "token_ids"
                prev = req.timestamp
                self.count += 1
                yield req
        except (OSError, EOFError) as exc:
            raise TraceError(path, lineno + 1, "file", f"cannot read: {exc}") from None
        finally:
            self.close()
        self._finish()

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
        return self._parquet_requests(pf, names)

    def _parquet_requests(self, pf: Any, names: list[str]) -> Iterator[Request]:
        path = self.path
        block_size = self.header.block_size
        prev: float | None = None
        kind: IdKind | None = None
        row = 0
        try:
            for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, columns=names):
                cols = [(name, batch.column(name).to_pylist()) for name in names]
                for i in range(batch.num_rows):
                    row += 1
                    obj = {name: col[i] for name, col in cols if col[i] is not None}
                    try:
                        req = validate_request(
                            obj,
                            block_size=block_size,
                            path=path,
                            line=row,
                            prev_timestamp=prev,
                            id_kind=kind,
                        )
                    except TraceError as err:
                        if not self.lenient:
                            raise
                        self._skip(err)
                        continue
                    if kind is None:
                        kind = "hash_ids" if req.hash_ids is not None else "token_ids"
                    prev = req.timestamp
                    self.count += 1
                    yield req
        finally:
            self.close()
        self._finish()


def _chain(
    first: list[tuple[int, bytes]], rest: Iterator[tuple[int, bytes]]
) -> Iterator[tuple[int, bytes]]:
    yield from first
    yield from rest


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
            msg = getattr(exc, "msg", str(exc))
            col = getattr(exc, "colno", None)
            where = f" at column {col}" if col is not None else ""
            raise TraceError(path, lineno, "line", f"not valid JSON ({msg}{where})") from None
    return obj


def _loads_or_none(text: bytes) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _os_error(path: Path, exc: OSError) -> TraceError:
    reason = exc.strerror or str(exc)
    return TraceError(path, 0, "file", f"cannot open: {reason}")


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
    `skipped_examples`) and issue one `TraceSkipWarning`.
    """
    with TraceReader(path, lenient=lenient) as reader:
        requests = list(reader)
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


# -- writing ------------------------------------------------------------------------------


def write_trace(
    trace_or_requests: Trace | Iterable[Request],
    path: str | Path,
    header: TraceHeader | None = None,
) -> Path:
    """Write a trace to `path` (format by suffix) atomically and return the path.

    The header is `header`, else the Trace's own header, else the default one. Every request
    is validated as it is written (against the header's block_size, in order), so a file
    this function writes always reads back. The data goes to a temporary file in the same
    directory, which then replaces `path` (`os.replace`): readers never see a half-written
    trace, and on any failure `path` is left as it was and the temporary file is removed.
    Raises `TraceError` for a bad request (naming the line it would have had), for an empty
    trace and for OS errors (line 0, field "file").
    """
    path = Path(path)
    kind = file_kind(path)
    if header is None:
        header = trace_or_requests.header if isinstance(trace_or_requests, Trace) else None
    if header is None:
        header = TraceHeader()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open with mode 0o666 (not mkstemp's 0o600): the result gets the usual umask-based
    # permissions, like any file the user writes.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise TraceError(path, 0, "file", f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as raw:
            if kind == "parquet":
                _write_parquet(trace_or_requests, header, raw, path)
            elif kind == "jsonl.gz":
                # mtime=0 and no file name: identical input gives identical bytes.
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    _write_jsonl(trace_or_requests, header, gz, path)
            else:
                _write_jsonl(trace_or_requests, header, raw, path)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise TraceError(path, 0, "file", f"cannot write: {exc.strerror or exc}") from None
        raise
    return path


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
