"""Composing traces: `merge` several into one (hash ids namespaced) and `slice` one by time
window or count. Used by ``hicache-sim trace merge`` and ``trace slice``.

Every generator and importer numbers its hash ids from 0, so two traces' id 0 are two
different blocks; `merge` shifts each input's ids past the previous inputs' (unless
`shared_ids`: the inputs come from one id space, e.g. slices of one trace), so nothing is
shared that was not. Token-id traces are merged as they are: tokens are content, and equal
tokens of one tokenizer are the same text.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace

from traces.schema import Request, Trace, TraceHeader, TraceParamError


def _kind(trace: Trace) -> str | None:
    first = trace.requests[0] if len(trace.requests) else None
    if first is None:
        return None
    return "hash_ids" if first.hash_ids is not None else "token_ids"


def merge(
    traces: Sequence[Trace],
    rate_scales: Sequence[float] | None = None,
    *,
    shared_ids: bool = False,
    names: Sequence[str] | None = None,
) -> Trace:
    """One trace of all requests of `traces`, in arrival order (ties: input order).

    Input i's times are made relative to its first arrival and divided by `rate_scales[i]`
    (default 1; 2 = twice the rate), think times too, as ``workload.rate_scale`` does.
    Hash ids are shifted past the previous inputs' largest id (not with `shared_ids`);
    session ids and rids get the prefix ``<i>/`` so sessions of two inputs stay apart.
    All inputs must have the same block size and id kind."""
    if not traces:
        raise TraceParamError("merge needs at least one trace")
    scales = list(rate_scales) if rate_scales is not None else [1.0] * len(traces)
    if len(scales) == 1 and len(traces) > 1:
        scales *= len(traces)
    if len(scales) != len(traces) or any(not s > 0 for s in scales):
        raise TraceParamError(f"--rate-scale: one value > 0, or one per trace ({len(traces)})")
    block_sizes = {t.block_size for t in traces}
    kinds = {_kind(t) for t in traces} - {None}
    if len(block_sizes) > 1 or len(kinds) > 1:
        raise TraceParamError(
            "merge needs traces of one block size and one id kind, got block sizes "
            f"{sorted(block_sizes)} and {sorted(k for k in kinds if k)}"
        )
    streams, offsets, offset = [], [], 0
    for i, (trace, scale) in enumerate(zip(traces, scales, strict=True)):
        offsets.append(offset)
        shifted = [_shift(r, i, scale, offset) for r in trace.requests]
        if shifted:
            origin = shifted[0].timestamp
            for r in shifted:
                r.timestamp -= origin
        top = max((h for r in trace.requests for h in r.hash_ids or []), default=-1)
        if not shared_ids:
            offset += top + 1
        streams.append(shifted)
    merged = list(heapq.merge(*streams, key=lambda r: r.timestamp))
    extra = {
        "source": "merge",
        "inputs": list(names) if names is not None else [str(t.path) for t in traces],
        "rate_scale": scales,
        "hash_id_offsets": offsets,
    }
    return Trace(requests=merged, header=TraceHeader(block_size=block_sizes.pop(), extra=extra))


def _shift(r: Request, i: int, scale: float, offset: int) -> Request:
    return replace(
        r,
        timestamp=r.timestamp / scale,
        hash_ids=[h + offset for h in r.hash_ids] if r.hash_ids is not None else None,
        think_time_ms=r.think_time_ms / scale if r.think_time_ms is not None else None,
        session_id=f"{i}/{r.session_id}" if r.session_id is not None else None,
        rid=f"{i}/{r.rid}" if r.rid is not None else None,
    )


def slice_trace(
    trace: Trace,
    *,
    start_s: float = 0.0,
    end_s: float | None = None,
    skip: int = 0,
    count: int | None = None,
) -> Trace:
    """The requests of `trace` that arrive in ``[start_s, end_s)`` seconds after its first
    arrival, then, of those, `count` (default all) after the first `skip`. Timestamps and
    every field are kept; a session cut at the front starts at its first kept turn (a
    closed-loop replay sends a session's first present turn at its timestamp)."""
    if start_s < 0 or (end_s is not None and end_s < start_s) or skip < 0:
        raise TraceParamError("slice: need 0 <= --start <= --end and --skip >= 0")
    if count is not None and count < 1:
        raise TraceParamError(f"slice: --count must be >= 1, got {count}")
    reqs = list(trace.requests)
    origin = reqs[0].timestamp if reqs else 0.0
    lo, hi = origin + start_s * 1000.0, None if end_s is None else origin + end_s * 1000.0
    window = [r for r in reqs if r.timestamp >= lo and (hi is None or r.timestamp < hi)]
    kept = window[skip : None if count is None else skip + count]
    if not kept:
        raise TraceParamError("slice: no request is left (check --start/--end/--skip)")
    extra = dict(trace.header.extra)
    extra["slice"] = {"start_s": start_s, "end_s": end_s, "skip": skip, "count": count}
    header = TraceHeader(block_size=trace.block_size, extra=extra)
    return Trace(requests=kept, header=header, path=trace.path)
