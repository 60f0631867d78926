"""Trace statistics: sizes, rates, length percentiles, block reuse, prefix hit ratio, reuse
distance, sessions. Definitions are in the docstrings and in `traces/README.md`.

The reuse-distance algorithm itself lives in `traces.reuse` (`reuse_distances` is
re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from traces.keys import check_page_size, page_symbols
from traces.reuse import distance_histogram, reuse_distances
from traces.schema import DEFAULT_BLOCK_SIZE, Request, Trace, TraceParamError

__all__ = [
    "PERCENTILES",
    "format_stats",
    "infinite_capacity_hit_rate",
    "infinite_capacity_prefixes",
    "percentile",
    "reuse_distances",
    "trace_stats",
]

PERCENTILES: tuple[int, ...] = (50, 90, 99)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values: the smallest value v such that at
    least p % of the values are <= v (numpy's ``method="inverted_cdf"``). Always one of the
    values, so integer data gives integer percentiles."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _summary(values: list[int]) -> dict[str, Any]:
    values = sorted(values)
    out: dict[str, Any] = {
        "total": sum(values),
        "mean": sum(values) / len(values),
        "min": values[0],
    }
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(values, p)
    out["max"] = values[-1]
    return out


def _requests_and_block_size(
    trace: Trace | Iterable[Request], block_size: int | None
) -> tuple[Sequence[Request], int]:
    if isinstance(trace, Trace):
        return trace.requests, block_size if block_size is not None else trace.block_size
    return list(trace), block_size if block_size is not None else DEFAULT_BLOCK_SIZE


def infinite_capacity_hit_rate(
    trace: Trace | Iterable[Request], page_size: int, block_size: int | None = None
) -> float:
    """Prefix-cache hit ratio of an infinite, page-aligned cache that never evicts.

    Requests are processed in trace order. For request i with page symbols S_i
    (`traces.keys.page_symbols`) and prompt length L_i, ``matched_i`` is the largest k such
    that S_i[:k] equals the first k symbols of some *earlier* request, and
    ``cached_i = min(matched_i, (L_i - 1) // page_size) * page_size`` (SGLang always
    recomputes at least the last prompt token: it matches only the first L_i - 1 tokens,
    page-aligned). The result is ``sum(cached_i) / sum(L_i)``.

    `block_size` defaults to the trace header's (512 for a plain list of requests). For
    hash-id requests the walk is done per block instead of per page (same result, a test
    checks it), so even page_size 1 is cheap.
    """
    requests, bs = _requests_and_block_size(trace, block_size)
    if page_size < 1:
        raise TraceParamError(f"page_size must be >= 1, got {page_size}")
    if requests and all(r.hash_ids is not None for r in requests):
        cached, total, _ = _hash_walk(requests, page_size, bs)
    else:
        cached, total = _symbol_walk(requests, page_size, bs)
    return cached / total if total else 0.0


def _symbol_walk(requests: Sequence[Request], page_size: int, block_size: int) -> tuple[int, int]:
    """The definition of `infinite_capacity_hit_rate`, literally: a trie over page symbols."""
    cached = sum(infinite_capacity_prefixes(requests, page_size, block_size))
    return cached, sum(r.input_length for r in requests)


def infinite_capacity_prefixes(
    trace: Trace | Iterable[Request], page_size: int, block_size: int | None = None
) -> list[int]:
    """Per request, in trace order, ``cached_i`` of `infinite_capacity_hit_rate`: the tokens an
    infinite, page-aligned cache that never evicts holds for it (the walk over a trie of page
    symbols that the hit rate's definition describes)."""
    requests, bs = _requests_and_block_size(trace, block_size)
    if page_size < 1:
        raise TraceParamError(f"page_size must be >= 1, got {page_size}")
    trie: dict[tuple[int, Any], int] = {}
    out = []
    for req in requests:
        symbols = page_symbols(req, page_size, bs)
        node = -1
        matched = 0
        for sym in symbols:
            nxt = trie.get((node, sym))
            if nxt is None:
                break
            node = nxt
            matched += 1
        for sym in symbols[matched:]:
            nxt = len(trie)
            trie[(node, sym)] = nxt
            node = nxt
        out.append(min(matched, (req.input_length - 1) // page_size) * page_size)
    return out


def _hash_walk(
    requests: Sequence[Request], page_size: int, block_size: int
) -> tuple[int, int, list[int]]:
    """Block-level equivalent of `_symbol_walk` for hash-id requests.

    A page-level trie path is a run of full blocks followed by some pages of one more block,
    so a block-level trie node keyed by (parent node, hash id) that remembers the most pages
    of its block any earlier request had answers the same question per block instead of per
    page. Also returns the block node of every block reference in trace order (for
    unique-block counts and reuse distances).
    """
    per_block = check_page_size(page_size, block_size)
    node_id: dict[tuple[int, int], int] = {}
    seen_pages: list[int] = []
    accesses: list[int] = []
    cached = 0
    total = 0
    for req in requests:
        hash_ids = req.hash_ids
        assert hash_ids is not None
        length = req.input_length
        last = len(hash_ids) - 1
        tail_pages = (length - last * block_size) // page_size
        parent = -1
        matched = 0
        walking = True
        for i, h in enumerate(hash_ids):
            pages = per_block if i < last else tail_pages
            key = (parent, h)
            node = node_id.get(key)
            if node is None:
                node = len(seen_pages)
                node_id[key] = node
                seen_pages.append(pages)
                walking = False
            else:
                seen = seen_pages[node]
                if walking:
                    m = seen if seen < pages else pages
                    matched += m
                    if m < per_block:
                        walking = False
                if pages > seen:
                    seen_pages[node] = pages
            accesses.append(node)
            parent = node
        cached += min(matched, (length - 1) // page_size) * page_size
        total += length
    return cached, total, accesses


def _token_block_accesses(requests: Sequence[Request], block_size: int) -> list[int]:
    """Block nodes (distinct block prefixes) referenced by token-id requests, in order;
    the partial last block is a block of its own content."""
    node_id: dict[tuple[int, tuple[int, ...]], int] = {}
    accesses: list[int] = []
    for req in requests:
        tokens = req.token_ids
        assert tokens is not None
        parent = -1
        for start in range(0, req.input_length, block_size):
            key = (parent, tuple(tokens[start : start + block_size]))
            node = node_id.get(key)
            if node is None:
                node = len(node_id)
                node_id[key] = node
            accesses.append(node)
            parent = node
    return accesses


def trace_stats(
    trace: Trace, page_size: int | None = None, *, reuse: bool = True
) -> dict[str, Any]:
    """Statistics of a trace as a JSON-ready dict.

    Keys: requests, id_kind, block_size, time (first/last ms, span, mean rate = requests /
    span), input_length and output_length (total, mean, min, nearest-rank p50/p90/p99,
    max), blocks (total block references, unique blocks = distinct block prefixes,
    unique footprint in tokens = unique x block_size, block reuse ratio = 1 - unique /
    total), prefix_cache (`infinite_capacity_hit_rate` at `page_size`, or at 1 and
    block_size when None), reuse_distance (see `reuse_distances`; skipped when `reuse` is
    False), sessions, skipped.
    """
    requests = trace.requests
    bs = trace.block_size
    if not requests:
        raise TraceParamError("trace has no requests")
    hash_trace = all(r.hash_ids is not None for r in requests)
    stats: dict[str, Any] = {
        "path": str(trace.path) if trace.path is not None else None,
        "requests": len(requests),
        "id_kind": "hash_ids" if hash_trace else "token_ids",
        "block_size": bs,
    }
    if trace.header.extra:
        stats["header"] = dict(trace.header.extra)
    stats["time"] = _time_stats(requests)
    stats["input_length"] = _summary([r.input_length for r in requests])
    stats["output_length"] = _summary([r.output_length for r in requests])
    page_sizes = [page_size] if page_size is not None else sorted({1, bs})
    hit, accesses = _prefix_walks(requests, page_sizes, bs, hash_trace)
    stats["blocks"] = _block_stats(accesses, bs)
    stats["prefix_cache"] = {"infinite_capacity_hit_rate": hit}
    if reuse:
        stats["reuse_distance"] = _reuse_distance_stats(accesses)
    stats["sessions"] = _session_stats(requests)
    stats["skipped"] = trace.skipped
    return stats


# -- sections of trace_stats --------------------------------------------------------------


def _time_stats(requests: Sequence[Request]) -> dict[str, Any]:
    first = requests[0].timestamp
    last = requests[-1].timestamp
    span_ms = last - first
    return {
        "first_ms": first,
        "last_ms": last,
        "span_ms": span_ms,
        "rate_per_s": len(requests) / (span_ms / 1000) if span_ms > 0 else None,
        "distinct_timestamps": len({r.timestamp for r in requests}),
    }


def _prefix_walks(
    requests: Sequence[Request], page_sizes: list[int], block_size: int, hash_trace: bool
) -> tuple[dict[str, float], list[int]]:
    """Infinite-capacity hit ratio per page size (keyed by str(page size)), and the block
    node of every block reference in trace order."""
    hit: dict[str, float] = {}
    if hash_trace:
        accesses: list[int] = []
        for ps in page_sizes:
            cached, total, accesses = _hash_walk(requests, ps, block_size)
            hit[str(ps)] = cached / total
    else:
        accesses = _token_block_accesses(requests, block_size)
        for ps in page_sizes:
            cached, total = _symbol_walk(requests, ps, block_size)
            hit[str(ps)] = cached / total
    return hit, accesses


def _block_stats(accesses: list[int], block_size: int) -> dict[str, Any]:
    unique = len(set(accesses))
    return {
        "total": len(accesses),
        "unique": unique,
        "unique_footprint_tokens": unique * block_size,
        "block_reuse_ratio": 1 - unique / len(accesses),
    }


def _reuse_distance_stats(accesses: list[int]) -> dict[str, Any]:
    distances, cold = reuse_distances(accesses)
    ordered = sorted(distances)
    rd: dict[str, Any] = {"unit": "blocks", "references": len(accesses), "cold": cold}
    if ordered:
        for p in PERCENTILES:
            rd[f"p{p}"] = percentile(ordered, p)
    rd["histogram"] = distance_histogram(distances)
    return rd


def _session_stats(requests: Sequence[Request]) -> dict[str, Any]:
    sessions: dict[str, int] = {}
    think: list[float] = []
    for r in requests:
        if r.session_id is not None:
            sessions[r.session_id] = sessions.get(r.session_id, 0) + 1
        if r.think_time_ms is not None:
            think.append(r.think_time_ms)
    sess: dict[str, Any] = {
        "sessions": len(sessions),
        "requests_in_sessions": sum(sessions.values()),
    }
    if sessions:
        sess["turns_mean"] = sum(sessions.values()) / len(sessions)
        sess["turns_max"] = max(sessions.values())
    if think:
        sess["think_time_ms_mean"] = sum(think) / len(think)
    return sess


# -- text rendering ------------------------------------------------------------------------


def _n(x: float) -> str:
    """Thousands separators; integers stay integers."""
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def format_stats(stats: dict[str, Any]) -> str:
    """Plain-text rendering of `trace_stats` output, one topic per line."""
    rows = _header_rows(stats)
    rows.append(
        (
            "requests",
            f"{_n(stats['requests'])} ({stats['id_kind']}, block_size {stats['block_size']})",
        )
    )
    rows.append(("span", _span_text(stats["time"])))
    for key, label in (("input_length", "input tokens"), ("output_length", "output tokens")):
        rows.append((label, _summary_text(stats[key])))
    rows.append(("blocks", _blocks_text(stats["blocks"], stats["block_size"])))
    hit = stats["prefix_cache"]["infinite_capacity_hit_rate"]
    rows.append(
        (
            "prefix hit",
            "infinite-capacity token hit ratio: "
            + ", ".join(f"{100 * v:.1f} % at page {k}" for k, v in hit.items()),
        )
    )
    rd = stats.get("reuse_distance")
    if rd is not None:
        rows += _reuse_distance_rows(rd)
    rows.append(("sessions", _sessions_text(stats["sessions"])))
    if stats.get("skipped"):
        rows.append(("skipped", f"{_n(stats['skipped'])} bad lines (lenient read)"))
    return "\n".join(f"{label:<16}{text}" for label, text in rows)


def _header_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    if stats.get("path"):
        rows.append(("trace", str(stats["path"])))
    header = stats.get("header") or {}
    for key in ("generator", "source", "note"):
        if key in header:
            rows.append((key, str(header[key])))
    return rows


def _span_text(t: dict[str, Any]) -> str:
    span_min = t["span_ms"] / 60000
    rate = f"{t['rate_per_s']:.2f} req/s" if t["rate_per_s"] is not None else "n/a req/s"
    return (
        f"{_n(t['first_ms'])} - {_n(t['last_ms'])} ms ({span_min:.1f} min), {rate}, "
        f"{_n(t['distinct_timestamps'])} distinct timestamps"
    )


def _summary_text(s: dict[str, Any]) -> str:
    pcts = "  ".join(f"p{p} {_n(s[f'p{p}'])}" for p in PERCENTILES)
    return (
        f"mean {s['mean']:,.0f}  min {_n(s['min'])}  {pcts}  max {_n(s['max'])}"
        f"  (total {_n(s['total'])})"
    )


def _blocks_text(b: dict[str, Any], block_size: int) -> str:
    return (
        f"{_n(b['total'])} total / {_n(b['unique'])} unique; unique footprint "
        f"{b['unique_footprint_tokens'] / 1e6:.1f} M tokens (unique x {block_size}); "
        f"block reuse ratio {100 * b['block_reuse_ratio']:.1f} %"
    )


def _reuse_distance_rows(rd: dict[str, Any]) -> list[tuple[str, str]]:
    pcts = "  ".join(f"p{p} {_n(rd[f'p{p}'])}" for p in PERCENTILES if f"p{p}" in rd)
    rows = [
        (
            "reuse distance",
            f"(distinct blocks between references) {_n(rd['references'])} "
            f"references, {_n(rd['cold'])} cold  {pcts}",
        )
    ]
    for bucket in rd["histogram"]:
        rng = (
            f"{_n(bucket['lo'])}"
            if bucket["lo"] == bucket["hi"]
            else f"{_n(bucket['lo'])}-{_n(bucket['hi'])}"
        )
        rows.append(("", f"  {rng:>17}: {_n(bucket['count'])}"))
    return rows


def _sessions_text(s: dict[str, Any]) -> str:
    if not s["sessions"]:
        return "none"
    extra = (
        f", think time mean {s['think_time_ms_mean']:,.0f} ms"
        if ("think_time_ms_mean" in s)
        else ""
    )
    return (
        f"{_n(s['sessions'])} sessions, {_n(s['requests_in_sessions'])} "
        f"requests, turns mean {s['turns_mean']:.1f} max {s['turns_max']}{extra}"
    )
