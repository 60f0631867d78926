"""The trace data model: `Request`, `TraceHeader`, `Trace`, `TraceError` and the one validator.

Every reader (JSONL, Parquet, CSV converters) and every writer goes through
`validate_request`, so a field means the same thing and fails the same way whatever the
file format. See `traces/README.md` for the schema in prose.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

FORMAT_NAME = "hicache-trace"
FORMAT_VERSION = 1
DEFAULT_BLOCK_SIZE = 512

# Field order used by every writer. Mooncake's own order comes first, so a Mooncake file
# written back out is byte-identical apart from the header line.
REQUEST_FIELDS: tuple[str, ...] = (
    "timestamp",
    "input_length",
    "output_length",
    "hash_ids",
    "token_ids",
    "session_id",
    "turn",
    "think_time_ms",
    "priority",
    "rid",
)
REQUIRED_FIELDS: tuple[str, ...] = ("timestamp", "input_length", "output_length")
_KNOWN = frozenset(REQUEST_FIELDS)
# Keys of the header line that TraceHeader stores as attributes; any other key goes to `extra`.
HEADER_FIELDS: tuple[str, ...] = ("format", "version", "block_size")

# Ids are stored as int64 (Parquet, numpy); hash ids are bounded so that the derived token
# ids h * block_size + k fit too.
_INT64_LIMIT = 2**63

IdKind = Literal["hash_ids", "token_ids"]


class TraceError(ValueError):
    """A problem with one line (or row) of a trace file.

    `str(err)` is exactly ``FILE:LINE: field: problem``. LINE is 1-based; for Parquet and CSV
    files it is the row number as a reader would count lines (header line included for
    CSV); LINE 0 means the file as a whole (missing, empty, unknown suffix).
    """

    def __init__(self, path: str | Path, line: int, field: str, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        super().__init__(f"{self.path}:{line}: {field}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Default exception pickling would call __init__ with the formatted message only.
        return (TraceError, (self.path, self.line, self.field, self.problem))


class TraceParamError(ValueError):
    """A bad parameter of a trace tool the user can fix (a generator's size, a page size that
    does not divide the trace's block size, an unknown source format): one line, no file
    position. Every other ``ValueError`` out of :mod:`traces` is a bug."""


@dataclass(slots=True)
class Request:
    """One request of a trace.

    `timestamp` is the arrival time in milliseconds (relative or absolute; only differences
    matter). The prompt is described either by `hash_ids` (one prefix-hash id per
    `block_size`-token block, Mooncake semantics, ``len == ceil(input_length / block_size)``)
    or by `token_ids` (``len == input_length``); exactly one of the two is set in a valid
    request. `think_time_ms`, when set on turn k of a session, is the delay between the end
    of turn k-1 and the arrival of turn k (closed-loop replay).
    """

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int] | None = None
    token_ids: list[int] | None = None
    session_id: str | None = None
    turn: int | None = None
    think_time_ms: float | None = None
    priority: int | None = None
    rid: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object for this request: fields in `REQUEST_FIELDS` order, None omitted.

        Integral float times are written as ints so that Mooncake files round-trip
        byte-for-byte.
        """
        out: dict[str, Any] = {
            "timestamp": _compact_number(self.timestamp),
            "input_length": self.input_length,
            "output_length": self.output_length,
        }
        if self.hash_ids is not None:
            out["hash_ids"] = self.hash_ids
        if self.token_ids is not None:
            out["token_ids"] = self.token_ids
        if self.session_id is not None:
            out["session_id"] = self.session_id
        if self.turn is not None:
            out["turn"] = self.turn
        if self.think_time_ms is not None:
            out["think_time_ms"] = _compact_number(self.think_time_ms)
        if self.priority is not None:
            out["priority"] = self.priority
        if self.rid is not None:
            out["rid"] = self.rid
        return out


def _compact_number(x: float) -> float | int:
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


@dataclass(slots=True)
class TraceHeader:
    """Trace-wide fields, stored as the optional first line of a JSONL file
    (``{"format": "hicache-trace", "version": 1, "block_size": 512, ...}``) or as Parquet
    schema metadata. Keys other than format/version/block_size are kept in `extra` and
    written back unchanged (generators record their name and parameters there)."""

    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    block_size: int = DEFAULT_BLOCK_SIZE
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The header line as a JSON object (format, version, block_size first)."""
        out: dict[str, Any] = {
            "format": self.format,
            "version": self.version,
            "block_size": self.block_size,
        }
        for key, value in self.extra.items():
            if key not in out:
                out[key] = value
        return out


def is_header_object(obj: object) -> bool:
    """True if a parsed first line is meant as a header (it has a "format" key)."""
    return isinstance(obj, dict) and "format" in obj


def parse_header(obj: Mapping[str, Any], *, path: str | Path, line: int = 1) -> TraceHeader:
    """Validate a header object and return it as a `TraceHeader`.

    Raises `TraceError` for a wrong format name, an unknown version or a bad block_size.
    """
    fmt = obj.get("format")
    if fmt != FORMAT_NAME:
        raise TraceError(
            path, line, "format", f"unknown trace format {fmt!r} (expected {FORMAT_NAME!r})"
        )
    version = obj.get("version")
    if version is None:
        raise TraceError(path, line, "version", "missing field")
    if type(version) is not int or version != FORMAT_VERSION:
        raise TraceError(
            path,
            line,
            "version",
            f"unsupported trace version {version!r} (this reader knows version {FORMAT_VERSION})",
        )
    block_size = obj.get("block_size", DEFAULT_BLOCK_SIZE)
    if type(block_size) is not int or block_size < 1:
        raise TraceError(
            path, line, "block_size", f"must be a positive integer, got {block_size!r}"
        )
    extra = {k: v for k, v in obj.items() if k not in HEADER_FIELDS}
    return TraceHeader(format=FORMAT_NAME, version=version, block_size=block_size, extra=extra)


@dataclass
class Trace:
    """A whole trace in memory: header plus requests in file order.

    `requests` is any sequence of `Request`: `read_trace` gives a compact
    `traces.store.RequestColumns` (each read builds a fresh `Request`), generators a list.

    `skipped` counts lines dropped by a lenient read; `skipped_by_field` counts them per
    offending field and `skipped_examples` keeps the first few errors verbatim.
    """

    requests: Sequence[Request]
    header: TraceHeader = field(default_factory=TraceHeader)
    path: Path | None = None
    skipped: int = 0
    skipped_by_field: Counter[str] = field(default_factory=Counter)
    skipped_examples: list[TraceError] = field(default_factory=list)

    @property
    def block_size(self) -> int:
        """Tokens per hash-id block (from the header; 512 for a headerless Mooncake file)."""
        return self.header.block_size

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> list[Request]: ...

    def __getitem__(self, index: int | slice) -> Request | list[Request]:
        if isinstance(index, slice):
            return list(self.requests[index])
        return self.requests[index]

    def skip_summary(self) -> str:
        """One line saying how many lines a lenient read skipped and why ('' if none)."""
        if not self.skipped:
            return ""
        reasons = ", ".join(f"{n} x {f}" for f, n in self.skipped_by_field.most_common())
        where = str(self.path) if self.path is not None else "trace"
        first = f"; first: {self.skipped_examples[0]}" if self.skipped_examples else ""
        noun = "line" if self.skipped == 1 else "lines"
        return f"{where}: skipped {self.skipped} bad {noun} ({reasons}){first}"


def _is_number(x: object) -> bool:
    if type(x) is float:
        return math.isfinite(x)
    return type(x) is int


def _check_id_list(ids: object, name: str, limit: int, path: str | Path, line: int) -> list[int]:
    if type(ids) is not list:
        raise TraceError(path, line, name, f"must be a list of integers, got {type(ids).__name__}")
    if ids:
        # map(type) and min() run in C: this is the hot part of reading a Mooncake file.
        if set(map(type, ids)) != {int}:
            bad = next(x for x in ids if type(x) is not int)
            raise TraceError(path, line, name, f"must contain only integers, found {bad!r}")
        if min(ids) < 0:
            raise TraceError(path, line, name, f"ids must be >= 0, found {min(ids)}")
        if max(ids) >= limit:
            raise TraceError(
                path,
                line,
                name,
                f"ids must be < {limit} so that token ids fit in 64 bits, found {max(ids)}",
            )
    return ids


def validate_request(
    obj: object,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    path: str | Path = "<trace>",
    line: int = 0,
    prev_timestamp: float | None = None,
    id_kind: IdKind | None = None,
) -> Request:
    """Check one parsed request object and return it as a `Request`.

    This is the only place where request fields are checked; every reader and writer calls
    it. `prev_timestamp` is the timestamp of the previous accepted request (timestamps must
    not go backwards) and `id_kind` the prompt representation of earlier requests (a trace
    may not mix hash_ids and token_ids requests, since their symbols would collide).
    Unknown fields are errors (a misspelt optional field would otherwise be dropped
    silently). The returned Request shares the id lists of `obj` (no copy).

    Raises `TraceError(path, line, field, problem)` on the first problem found.
    """
    if type(obj) is not dict:
        raise TraceError(path, line, "line", f"not a JSON object (got {type(obj).__name__})")
    if not _KNOWN.issuperset(obj):
        name = sorted(k for k in obj if k not in _KNOWN)[0]
        raise TraceError(
            path, line, name, "unknown field (known fields: " + ", ".join(REQUEST_FIELDS) + ")"
        )
    try:
        ts = obj["timestamp"]
        input_length = obj["input_length"]
        output_length = obj["output_length"]
    except KeyError as exc:
        missing = next(name for name in REQUIRED_FIELDS if name not in obj)
        raise TraceError(path, line, missing, "missing field") from exc
    _check_timestamp(ts, prev_timestamp, path, line)
    _check_lengths(input_length, output_length, path, line)

    hash_ids = obj.get("hash_ids")
    token_ids = obj.get("token_ids")
    if hash_ids is not None:
        _check_hash_ids(hash_ids, token_ids, input_length, block_size, id_kind, path, line)
    elif token_ids is not None:
        _check_token_ids(token_ids, input_length, id_kind, path, line)
    else:
        raise TraceError(
            path, line, "hash_ids", "missing field (a request needs hash_ids or token_ids)"
        )

    if len(obj) == 4:
        # Only the three required fields and the id list: a plain Mooncake line.
        return Request(float(ts), input_length, output_length, hash_ids, token_ids)
    return Request(
        float(ts),
        input_length,
        output_length,
        hash_ids,
        token_ids,
        *_optional_fields(obj, path, line),
    )


# Per-field checks of `validate_request`. Types are checked exactly: bool is an int subclass,
# and a JSON `true` is never a valid value.


def _check_timestamp(ts: Any, prev_timestamp: float | None, path: str | Path, line: int) -> None:
    tst = type(ts)
    if not (tst is int or (tst is float and math.isfinite(ts))):
        raise TraceError(path, line, "timestamp", f"must be a finite number, got {ts!r}")
    if ts < 0:
        raise TraceError(path, line, "timestamp", f"must be >= 0, got {ts!r}")
    if prev_timestamp is not None and ts < prev_timestamp:
        raise TraceError(
            path,
            line,
            "timestamp",
            f"goes backwards ({_fmt(ts)} after {_fmt(prev_timestamp)}); requests must be "
            "sorted by timestamp",
        )


def _check_lengths(input_length: Any, output_length: Any, path: str | Path, line: int) -> None:
    if type(input_length) is not int or input_length < 1:
        raise TraceError(
            path, line, "input_length", f"must be an integer >= 1, got {input_length!r}"
        )
    if type(output_length) is not int or output_length < 0:
        raise TraceError(
            path, line, "output_length", f"must be an integer >= 0, got {output_length!r}"
        )


def _check_hash_ids(
    hash_ids: object,
    token_ids: object,
    input_length: int,
    block_size: int,
    id_kind: IdKind | None,
    path: str | Path,
    line: int,
) -> None:
    if token_ids is not None:
        raise TraceError(path, line, "token_ids", "give either hash_ids or token_ids, not both")
    if id_kind == "token_ids":
        raise TraceError(
            path,
            line,
            "hash_ids",
            "trace mixes token_ids and hash_ids requests (earlier requests use token_ids)",
        )
    ids = _check_id_list(hash_ids, "hash_ids", _INT64_LIMIT // block_size, path, line)
    want = -(-input_length // block_size)
    if len(ids) != want:
        raise TraceError(
            path,
            line,
            "hash_ids",
            f"{len(ids)} ids, but input_length {input_length} with block_size "
            f"{block_size} needs ceil({input_length}/{block_size}) = {want}",
        )


def _check_token_ids(
    token_ids: object, input_length: int, id_kind: IdKind | None, path: str | Path, line: int
) -> None:
    if id_kind == "hash_ids":
        raise TraceError(
            path,
            line,
            "token_ids",
            "trace mixes hash_ids and token_ids requests (earlier requests use hash_ids)",
        )
    ids = _check_id_list(token_ids, "token_ids", _INT64_LIMIT, path, line)
    if len(ids) != input_length:
        raise TraceError(
            path,
            line,
            "token_ids",
            f"{len(ids)} ids, but input_length is {input_length}",
        )


def _optional_fields(
    obj: Mapping[str, Any], path: str | Path, line: int
) -> tuple[str | None, int | None, float | None, int | None, str | None]:
    """The checked optional fields, in `Request` order: session_id, turn, think_time_ms,
    priority, rid (None where absent)."""
    session_id = obj.get("session_id")
    if session_id is not None and type(session_id) is not str:
        raise TraceError(path, line, "session_id", f"must be a string, got {session_id!r}")
    turn = obj.get("turn")
    if turn is not None and (type(turn) is not int or turn < 0):
        raise TraceError(path, line, "turn", f"must be an integer >= 0, got {turn!r}")
    think = obj.get("think_time_ms")
    if think is not None:
        if not _is_number(think) or think < 0:
            raise TraceError(
                path, line, "think_time_ms", f"must be a finite number >= 0, got {think!r}"
            )
        think = float(think)
    priority = obj.get("priority")
    if priority is not None and type(priority) is not int:
        raise TraceError(path, line, "priority", f"must be an integer, got {priority!r}")
    rid = obj.get("rid")
    if rid is not None and type(rid) is not str:
        raise TraceError(path, line, "rid", f"must be a string, got {rid!r}")
    return session_id, turn, think, priority, rid


def _fmt(x: float) -> str:
    return str(_compact_number(x))
