"""Building blocks shared by the importers: JSON lines, typed field access, prefix-id
remapping and session reconstruction (turns and think times).

Every importer turns its source into `ImportedRow`s (one per request, times in
milliseconds) and hands them to `build_requests`, which sorts them by arrival, numbers the
turns of each session and derives the think times; the result goes through the one
validator (`traces.schema.validate_request`) like every other trace.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from traces.formats import cannot_open
from traces.reader import SkipCounts, record_skip
from traces.schema import Request, Trace, TraceError, TraceHeader, validate_request


@dataclass(slots=True)
class ImportedRow:
    """One request of a source, before sorting and session numbering.

    `time_ms` is the arrival in milliseconds; `think_ms` a recorded think time (the wait
    between the end of the previous turn of the session and this arrival, ms) or None;
    `latency_ms` the recorded end-to-end latency of this request (ms) or None, used to
    derive the next turn's think time when the source records none. `line` is the source
    line (or 1-based row) for error messages.
    """

    time_ms: float
    input_length: int
    output_length: int
    line: int
    hash_ids: list[int] | None = None
    token_ids: list[int] | None = None
    session: str | None = None
    think_ms: float | None = None
    latency_ms: float | None = None
    rid: str | None = None
    priority: int | None = None


def open_text(path: Path) -> IO[str]:
    """Open a UTF-8 text file (gzip when the name ends in .gz); `TraceError` if it cannot."""
    try:
        if path.name.lower().endswith(".gz"):
            return gzip.open(path, "rt", encoding="utf-8")
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise cannot_open(path, exc) from None


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (1-based line number, parsed JSON value) for every non-blank line of a JSONL
    file. A line that is not JSON or not valid UTF-8 raises `TraceError` (field ``line``)."""
    with open_text(path) as f:
        line_no = 0
        while True:
            try:
                text = f.readline()
            except (UnicodeDecodeError, OSError, EOFError) as exc:
                raise TraceError(path, line_no + 1, "line", f"cannot read: {exc}") from None
            if not text:
                return
            line_no += 1
            if not text.strip():
                continue
            try:
                yield line_no, json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(path, line_no, "line", f"not JSON: {exc.msg}") from None


def first_json_line(path: Path) -> Any:
    """The first non-blank line of a file, parsed as JSON; None if it is not JSON (or the
    file is empty or unreadable). Used for format detection only."""
    try:
        for _, obj in json_lines(path):
            return obj
    except TraceError:
        return None
    return None


def is_number(x: object) -> bool:
    """A finite JSON number that is not a bool."""
    return type(x) in (int, float) and math.isfinite(x)  # type: ignore[arg-type]


def get_number(
    obj: dict[str, Any], key: str, path: Path, line: int, *, field: str | None = None
) -> float | None:
    """`obj[key]` as a float if present (None if absent or null); `TraceError` unless it is
    a finite number. `field` names it in the error (default `key`)."""
    value = obj.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise TraceError(path, line, field or key, f"must be a number, got {value!r}")
    return float(value)


def get_int(
    obj: dict[str, Any], key: str, path: Path, line: int, *, field: str | None = None
) -> int | None:
    """`obj[key]` as an int if present (None if absent or null); `TraceError` unless it is a
    JSON integer >= 0."""
    value = obj.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise TraceError(path, line, field or key, f"must be an integer >= 0, got {value!r}")
    return value


class PrefixIds:
    """Maps source block ids to fresh trace hash ids with Mooncake prefix semantics.

    A trace id stands for its block *and everything before it*; a source id may not (a
    content hash, or an id that means something else in another file). The key of a block
    is (scope, id of the previous block, source id): equal keys get the same new id, in
    first-seen order from `start`. `scope` separates id spaces (one per source file or
    trace: ids that must not alias).
    """

    def __init__(self, start: int = 0) -> None:
        self._ids: dict[tuple[object, int, int], int] = {}
        self.next_id = start

    def map(self, scope: object, source_ids: list[int]) -> list[int]:
        """The trace ids of one prompt's block ids (in prompt order)."""
        out: list[int] = []
        parent = -1
        for sid in source_ids:
            key = (scope, parent, sid)
            new = self._ids.get(key)
            if new is None:
                new = self._ids[key] = self.next_id
                self.next_id += 1
            out.append(new)
            parent = new
        return out

    def fresh(self, n: int) -> list[int]:
        """`n` ids never used before (a prompt that shares nothing)."""
        out = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return out


def build_requests(rows: list[ImportedRow]) -> list[Request]:
    """Sort rows by arrival (stably), number the turns of each session (0-based, in arrival
    order) and set think times: a recorded `think_ms` as is; otherwise, on turns after the
    first, ``max(0, arrival - previous arrival - previous latency_ms)`` (latency 0 when not
    recorded, so the gap then includes the previous turn's service time). Rows without a
    session get neither turn nor think time. Times are shifted so the first arrival is 0."""
    order = sorted(rows, key=lambda r: r.time_ms)
    origin = order[0].time_ms if order else 0.0
    last: dict[str, tuple[int, ImportedRow]] = {}
    out: list[Request] = []
    for row in order:
        turn: int | None = None
        think: float | None = None
        if row.session is not None:
            prev = last.get(row.session)
            turn = 0 if prev is None else prev[0] + 1
            if prev is not None:
                if row.think_ms is not None:
                    think = max(0.0, row.think_ms)
                else:
                    p = prev[1]
                    think = max(0.0, row.time_ms - p.time_ms - (p.latency_ms or 0.0))
            last[row.session] = (turn, row)
        out.append(
            Request(
                timestamp=row.time_ms - origin,
                input_length=row.input_length,
                output_length=row.output_length,
                hash_ids=row.hash_ids,
                token_ids=row.token_ids,
                session_id=row.session,
                turn=turn,
                think_time_ms=think,
                rid=row.rid,
                priority=row.priority,
            )
        )
    return out


def finish_trace(
    trace: Trace, rows: list[ImportedRow], *, block_size: int, extra: dict[str, Any], lenient: bool
) -> Trace:
    """Fill `trace` (created by the importer, which counted its skipped entries on it) with
    the validated requests of `rows` and its header, and return it.

    Each request goes through `validate_request`; in a lenient import a request that fails
    is skipped and counted (reported at its source line) like a bad line. An import with no
    valid request is an error."""
    path = trace.path if trace.path is not None else Path("<trace>")
    requests: list[Request] = []
    by_time = sorted(rows, key=lambda r: r.time_ms)
    for req, row in zip(build_requests(rows), by_time, strict=True):
        try:
            validate_request(req.to_dict(), block_size=block_size, path=path, line=row.line)
        except TraceError as err:
            if not lenient:
                raise
            record_skip(trace, err)
            continue
        requests.append(req)
    if not requests:
        detail = f" ({trace.skipped} bad entries skipped)" if trace.skipped else ""
        raise TraceError(path, 0, "file", f"no valid requests{detail}")
    trace.requests = requests
    trace.header = TraceHeader(block_size=block_size, extra=extra)
    return trace


def skip_or_raise(counts: SkipCounts, err: TraceError, lenient: bool) -> None:
    """In a lenient import count `err` and go on; otherwise raise it."""
    if not lenient:
        raise err
    record_skip(counts, err)
