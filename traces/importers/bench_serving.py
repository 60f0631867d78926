"""SGLang ``bench_serving --output-details`` results (``--from bench-serving``).

``python -m sglang.bench_serving ... --output-file F --output-details`` appends one JSON
line per run to F: the run's settings and metrics (``request_rate``, ``max_concurrency``,
``duration``, ``completed``, ...) and, with ``--output-details``, per-request lists of equal
length: ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``generated_texts``,
``errors`` (and with ``--cache-report`` ``cached_tokens``). It records neither the prompt
tokens nor the send times, so the trace has **no prefix information** (every request gets
fresh block ids, as the lengths-only CSVs) and arrivals are spaced evenly at the run's
``request_rate`` (all at the run's start for ``inf``, ``"trace"`` or none). That is not what
bench_serving sent: it draws Poisson (or, with ``--burstiness``, gamma) gaps and caps the
requests in flight at ``--max-concurrency``, neither of which the output records, so the
converted arrivals match its rate, not its bursts. A failed request
(a non-empty ``errors`` entry) is left out and counted. Runs (lines) follow one another:
run k starts ``duration`` seconds after run k-1 started.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.importers.common import ImportedRow, PrefixIds, finish_trace, json_lines, skip_or_raise
from traces.schema import Trace, TraceError

NOTE = (
    "converted from bench_serving --output-details: no prompt tokens and no send times are "
    "recorded, so every request has unique blocks (prefix hit ratio 0) and arrivals are spaced "
    "evenly at the run's request_rate (bench_serving's Poisson gaps and concurrency cap are not "
    "recorded)"
)
_LISTS = ("input_lens", "output_lens")


def looks_like(obj: object) -> bool:
    """True if a parsed first line is a bench_serving result with details."""
    return isinstance(obj, dict) and all(k in obj for k in _LISTS)


def _lengths(obj: dict[str, Any], key: str, path: Path, line: int, minimum: int) -> list[int]:
    values = obj.get(key)
    if not isinstance(values, list):
        raise TraceError(
            path,
            line,
            key,
            "expected a list of per-request lengths (a bench_serving result written with "
            "--output-details)",
        )
    for i, v in enumerate(values):
        if type(v) is not int or v < minimum:
            raise TraceError(
                path, line, f"{key}[{i}]", f"expected an integer >= {minimum}, got {v!r}"
            )
    return values


def _gap_s(obj: dict[str, Any], path: Path, line: int) -> float:
    """Seconds between sends: 1 / request_rate; 0 for inf, "trace" or none."""
    rate = obj.get("request_rate")
    if rate is None or rate == "trace":
        return 0.0
    if type(rate) not in (int, float) or rate <= 0:
        raise TraceError(path, line, "request_rate", f"expected a rate > 0 or inf, got {rate!r}")
    return 0.0 if math.isinf(rate) else 1.0 / rate


def read_bench_serving(path: Path, *, block_size: int, lenient: bool = False) -> Trace:
    """Import a bench_serving --output-details file (see the module docstring)."""
    trace = Trace(requests=[], path=path)
    ids = PrefixIds()
    rows: list[ImportedRow] = []
    start_s = 0.0
    failed = runs = 0
    for line, obj in json_lines(path):
        try:
            if not looks_like(obj):
                raise TraceError(
                    path,
                    line,
                    "line",
                    "expected a bench_serving result with input_lens and output_lens (run "
                    "bench_serving with --output-details)",
                )
            ins = _lengths(obj, "input_lens", path, line, 1)
            outs = _lengths(obj, "output_lens", path, line, 0)
            errors = obj.get("errors") or [""] * len(ins)
            if len(outs) != len(ins) or not isinstance(errors, list) or len(errors) != len(ins):
                raise TraceError(
                    path,
                    line,
                    "output_lens",
                    "input_lens, output_lens and errors differ in length",
                )
            gap = _gap_s(obj, path, line)
            duration = obj.get("duration")
            span = float(duration) if type(duration) in (int, float) and duration > 0 else 0.0
        except TraceError as err:
            skip_or_raise(trace, err, lenient)
            continue
        runs += 1
        for i, (n_in, n_out, error) in enumerate(zip(ins, outs, errors, strict=True)):
            if error:
                failed += 1
                continue
            rows.append(
                ImportedRow(
                    time_ms=(start_s + i * gap) * 1000.0,
                    input_length=n_in,
                    output_length=n_out,
                    line=line,
                    hash_ids=ids.fresh(-(-n_in // block_size)),
                    rid=f"run{runs - 1}-{i}",
                )
            )
        start_s += max(span, len(ins) * gap)
    extra = {
        "source": "bench_serving --output-details",
        "source_file": path.name,
        "runs": runs,
        "failed_requests_left_out": failed,
        "prefix_info": False,
        "note": NOTE,
    }
    return finish_trace(trace, rows, block_size=block_size, extra=extra, lenient=lenient)
