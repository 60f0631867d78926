"""Converters from length-only CSV traces, and whole-file conversion between formats.

vidur / Splitwise CSV: columns ``arrived_at`` (seconds), ``num_prefill_tokens``,
``num_decode_tokens`` (other columns are ignored). Azure LLM inference CSV: columns
``TIMESTAMP`` (a date-time such as ``2023-11-16 18:15:46.6805900``, or seconds),
``ContextTokens``, ``GeneratedTokens``.

These files carry no prefix information, so every converted request gets hash ids of its
own (fresh, consecutive ids): nothing is ever shared and every prefix hit ratio computed
from the result is 0. The output header says so (``prefix_info: false`` and a ``note``).
Rows out of time order are sorted (stably) and the header records how many there were.

`read_any` / `convert` also read what servers and benchmarks record through
`traces.importers` (``--from openai|weka|bench-serving|bench-multiturn|sglang-log|...``, or
detected from the content with ``--from auto``).
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Literal

from traces.formats import cannot_open, file_kind
from traces.importers import IMPORT_FORMATS, ImportOptions, detect, read_import
from traces.io import TraceSkipWarning, read_trace, write_trace
from traces.reader import record_skip
from traces.schema import (
    DEFAULT_BLOCK_SIZE,
    Request,
    Trace,
    TraceError,
    TraceHeader,
    TraceParamError,
)

CsvFormat = Literal["vidur", "azure"]
SOURCE_FORMATS: tuple[str, ...] = (
    "auto",
    "jsonl",
    "parquet",
    "vidur",
    "splitwise",
    "azure",
    *IMPORT_FORMATS,
)
#: The fields that mark a line as a request of our own format (or Mooncake's).
_TRACE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids", "token_ids")

VIDUR_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
NO_PREFIX_NOTE = (
    "converted from a lengths-only CSV: no prefix information, every request has unique "
    "blocks, so the prefix hit ratio of this trace is 0"
)


@dataclass(slots=True)
class _Row:
    time_ms: float
    input_length: int
    output_length: int


def _int_cell(text: str, path: Path, line: int, column: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, column, f"not a number: {text!r}") from None
    if not math.isfinite(value) or not value.is_integer():
        raise TraceError(path, line, column, f"not an integer: {text!r}")
    return int(value)


def _seconds_cell(text: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, column, f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(path, line, column, f"not a finite number: {text!r}")
    return value * 1000.0


def _azure_time_parser(path: Path) -> Callable[[str, int], float]:
    """Parse TIMESTAMP cells to milliseconds since the first date-time cell."""
    origin: list[datetime] = []

    def parse(text: str, line: int) -> float:
        try:
            return float(text) * 1000.0
        except ValueError:
            pass
        try:
            stamp = datetime.fromisoformat(text.strip())
        except ValueError:
            raise TraceError(path, line, "TIMESTAMP", f"not a date-time: {text!r}") from None
        if not origin:
            origin.append(stamp)
        try:
            delta = stamp - origin[0]
        except TypeError:
            raise TraceError(
                path, line, "TIMESTAMP", "mixes date-times with and without a time zone"
            ) from None
        return delta.total_seconds() * 1000.0

    return parse


def sniff_csv(path: str | Path) -> CsvFormat:
    """Which CSV flavour a file is, from its header row. Raises `TraceError` if neither."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    except OSError as exc:
        raise cannot_open(path, exc) from None
    except UnicodeDecodeError:
        raise TraceError(path, 1, "line", "not valid UTF-8") from None
    names = {h.strip() for h in header}
    if set(VIDUR_COLUMNS) <= names:
        return "vidur"
    if set(AZURE_COLUMNS) <= names:
        return "azure"
    if not header:
        raise TraceError(path, 0, "file", "empty file")
    raise TraceError(
        path,
        1,
        "header",
        "not a known CSV trace: expected columns "
        + ",".join(VIDUR_COLUMNS)
        + " (vidur/Splitwise) or "
        + ",".join(AZURE_COLUMNS)
        + " (Azure)",
    )


def read_csv_trace(
    path: str | Path,
    flavour: CsvFormat | None = None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    lenient: bool = False,
) -> Trace:
    """Convert a vidur/Splitwise or Azure CSV (flavour sniffed from the header row when None)
    to a hash-id `Trace` in which every request has unique blocks.

    Line numbers in errors count the CSV header as line 1. Strict reads raise `TraceError`
    on the first bad row; lenient reads skip and count bad rows like `read_trace`.
    """
    path = Path(path)
    if block_size < 1:
        raise TraceParamError(f"block_size must be >= 1, got {block_size}")
    flavour = flavour or sniff_csv(path)
    columns = VIDUR_COLUMNS if flavour == "vidur" else AZURE_COLUMNS
    requests: list[Request] = []
    trace = Trace(requests=requests, path=path)
    rows = list(_csv_rows(path, columns, trace, lenient))
    if not rows:
        if trace.skipped:
            raise TraceError(path, 0, "file", f"no valid rows ({trace.skipped} bad rows skipped)")
        raise TraceError(path, 0, "file", "no rows")

    out_of_order = sum(1 for a, b in pairwise(rows) if b.time_ms < a.time_ms)
    rows.sort(key=lambda r: r.time_ms)
    origin = min(0.0, rows[0].time_ms)
    next_id = 0
    for row in rows:
        n_blocks = -(-row.input_length // block_size)
        req = Request(
            timestamp=row.time_ms - origin,
            input_length=row.input_length,
            output_length=row.output_length,
            hash_ids=list(range(next_id, next_id + n_blocks)),
        )
        next_id += n_blocks
        requests.append(req)

    trace.header = TraceHeader(
        block_size=block_size,
        extra={
            "source": f"{'vidur/Splitwise' if flavour == 'vidur' else 'Azure'} CSV",
            "source_file": path.name,
            "prefix_info": False,
            "note": NO_PREFIX_NOTE,
            "rows_out_of_order": out_of_order,
        },
    )
    if trace.skipped:
        warnings.warn(trace.skip_summary(), TraceSkipWarning, stacklevel=2)
    return trace


def _csv_rows(
    path: Path, columns: tuple[str, str, str], trace: Trace, lenient: bool
) -> Iterator[_Row]:
    time_col, in_col, out_col = columns
    azure = time_col == "TIMESTAMP"
    parse_azure = _azure_time_parser(path)
    try:
        f = open(path, newline="", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise cannot_open(path, exc) from None
    with f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise TraceError(path, 0, "file", "empty file") from None
        index = {}
        for name in columns:
            if name not in header:
                raise TraceError(path, 1, name, "missing column")
            index[name] = header.index(name)
        width = max(index.values()) + 1
        line = 1
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as exc:
                raise TraceError(path, reader.line_num, "line", f"bad CSV: {exc}") from None
            line = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            try:
                if len(cells) < width:
                    raise TraceError(
                        path, line, "line", f"{len(cells)} cells, expected at least {width}"
                    )
                t_text = cells[index[time_col]]
                time_ms = (
                    parse_azure(t_text, line)
                    if azure
                    else _seconds_cell(t_text, path, line, time_col)
                )
                if time_ms < 0 and not azure:
                    raise TraceError(path, line, time_col, f"must be >= 0, got {t_text!r}")
                n_in = _int_cell(cells[index[in_col]], path, line, in_col)
                if n_in < 1:
                    raise TraceError(path, line, in_col, f"must be >= 1, got {n_in}")
                n_out = _int_cell(cells[index[out_col]], path, line, out_col)
                if n_out < 0:
                    raise TraceError(path, line, out_col, f"must be >= 0, got {n_out}")
            except TraceError as err:
                if not lenient:
                    raise
                record_skip(trace, err)
                continue
            yield _Row(time_ms, n_in, n_out)


def read_any(
    path: str | Path,
    from_format: str = "auto",
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    lenient: bool = False,
    options: ImportOptions | None = None,
) -> Trace:
    """Read a trace in any supported source format.

    `from_format` is one of `SOURCE_FORMATS`: "auto" picks by content where that is
    unambiguous (an importer's format, see `traces.importers.detect`; a .csv by its header
    row), else by suffix (.jsonl, .jsonl.gz, .parquet); "splitwise" is an alias of "vidur".
    `block_size` applies to sources without a block size of their own (CSV, OpenAI logs,
    bench_serving / bench_multiturn); trace files and Weka traces carry their own.
    `options` are the importers' (tokenizer, chat template, ...).
    """
    path = Path(path)
    if from_format not in SOURCE_FORMATS:
        raise TraceParamError(
            f"unknown source format {from_format!r} (choose from " + ", ".join(SOURCE_FORMATS) + ")"
        )
    base = options or ImportOptions()
    options = replace(base, block_size=block_size, chat=replace(base.chat, block_size=block_size))
    if from_format == "auto":
        if path.name.lower().endswith(".csv"):
            return read_csv_trace(path, None, block_size=block_size, lenient=lenient)
        found = detect(path)
        if found is not None:
            return read_import(path, found, options, lenient=lenient)
        file_kind(path)  # raises a TraceError for an unknown suffix
        _check_trace_like(path)
        return read_trace(path, lenient=lenient)
    if from_format in IMPORT_FORMATS:
        return read_import(path, from_format, options, lenient=lenient)
    if from_format in ("vidur", "splitwise"):
        return read_csv_trace(path, "vidur", block_size=block_size, lenient=lenient)
    if from_format == "azure":
        return read_csv_trace(path, "azure", block_size=block_size, lenient=lenient)
    kind = file_kind(path)
    if (from_format == "parquet") != (kind == "parquet"):
        raise TraceError(
            path, 0, "file", f"--from {from_format} does not match the file suffix ({kind})"
        )
    return read_trace(path, lenient=lenient)


def _check_trace_like(path: Path) -> None:
    """Raise a `TraceError` that lists the known formats if the first line of a JSONL file
    is a JSON object that is neither a trace header nor a request of any known format
    (the reader would only say "unknown field")."""
    from traces.importers.common import first_json_line

    if file_kind(path) == "parquet":
        return
    obj = first_json_line(path)
    if not isinstance(obj, dict) or "format" in obj or any(k in obj for k in _TRACE_KEYS):
        return
    raise TraceError(
        path,
        1,
        "line",
        "not a known trace format: expected a hicache/Mooncake request (timestamp, "
        "input_length, output_length, hash_ids), an OpenAI chat request (messages), a Weka "
        "trace (requests, block_size), a bench_serving --output-details result (input_lens, "
        "output_lens) or a bench_multiturn log (summary); name it with --from",
    )


def convert(
    src: str | Path,
    dst: str | Path,
    from_format: str = "auto",
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    lenient: bool = False,
    options: ImportOptions | None = None,
) -> Trace:
    """Read `src` (see `read_any`) and write it to `dst` (format by suffix); returns the
    trace that was written."""
    trace = read_any(src, from_format, block_size=block_size, lenient=lenient, options=options)
    write_trace(trace, dst)
    return trace
