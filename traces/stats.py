"""Trace statistics: sizes, rates, length percentiles, block reuse, prefix hit ratio, reuse
distance, sessions. Definitions are in the docstrings and in `traces/README.md`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from traces.keys import check_page_size, page_symbols
from traces.schema import DEFAULT_BLOCK_SIZE, Request, Trace

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
) -> tuple[list[Request], int]:
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
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if requests and all(r.hash_ids is not None for r in requests):
        cached, total, _ = _hash_walk(requests, page_size, bs)
    else:
        cached, total = _symbol_walk(requests, page_size, bs)
    return cached / total if total else 0.0


def _symbol_walk(requests: list[Request], page_size: int, block_size: int) -> tuple[int, int]:
    """The definition of `infinite_capacity_hit_rate`, literally: a trie over page symbols."""
    trie: dict[tuple[int, Any], int] = {}
    cached = 0
    total = 0
    for req in requests:
        symbols = page_symbols(req, page_size, block_size)
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
        cached += min(matched, (req.input_length - 1) // page_size) * page_size
        total += req.input_length
    return cached, total


def _hash_walk(
    requests: list[Request], page_size: int, block_size: int
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


def _token_block_accesses(requests: list[Request], block_size: int) -> list[int]:
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


def reuse_distances(accesses: Sequence[int]) -> tuple[list[int], int]:
    """LRU stack distances of a sequence of block references.

    The reuse distance of a reference to block x at position t is the number of *distinct*
    blocks referenced strictly between the previous reference to x and t. A reference with
    no earlier reference is *cold* (no distance). An LRU cache holding C blocks would hit
    exactly the references with distance < C. Returns (distances of the non-cold references
    in position order, number of cold references). O(n log n), vectorised with numpy.
    """
    import numpy as np

    a = np.asarray(accesses, dtype=np.int64)
    n = len(a)
    if n == 0:
        return [], 0
    order = np.argsort(a, kind="stable")
    sa = a[order]
    same = sa[1:] == sa[:-1]
    # reuse intervals (p, t): consecutive references to the same block
    starts = order[:-1][same]
    ends = order[1:][same]
    cold = n - len(ends)
    if len(ends) == 0:
        return [], cold
    # distinct blocks in (p, t) = (t - p - 1) - #{reuse intervals (s, e): p < s and e < t}.
    # Ordering intervals by end, the count is "earlier elements greater than mine" over the
    # starts.
    # starts: in end (= position) order, which is also the order the result is reported in.
    by_end = np.argsort(ends)
    starts = starts[by_end]
    ends = ends[by_end]
    dist = (ends - starts - 1) - _count_previous_greater(starts)
    return dist.tolist(), cold


def _count_previous_greater(x: Any) -> Any:
    """For each i, #{j < i: x[j] > x[i]} for distinct non-negative ints (bottom-up merge
    counting, each level one sort and two searchsorted calls)."""
    import numpy as np

    n = len(x)
    out = np.zeros(n, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64)
    big = int(x.max()) + 1 if n else 1
    width = 1
    while width < n:
        run = idx // width
        left = run % 2 == 0
        right = ~left
        pair = idx // (2 * width)
        left_keys = np.sort(pair[left] * big + x[left])
        right_pair = pair[right] * big
        hi = np.searchsorted(left_keys, right_pair + big, side="left")
        lo = np.searchsorted(left_keys, right_pair + x[right], side="right")
        out[right] += hi - lo
        width *= 2
    return out


def _histogram(distances: list[int]) -> list[dict[str, int]]:
    """Power-of-two buckets: [0, 0], [1, 1], [2, 3], [4, 7], ... (empty buckets dropped)."""
    counts: dict[int, int] = {}
    for d in distances:
        b = d.bit_length()  # 0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3
        counts[b] = counts.get(b, 0) + 1
    out = []
    for b in sorted(counts):
        lo = 0 if b == 0 else 1 << (b - 1)
        hi = 0 if b == 0 else (1 << b) - 1
        out.append({"lo": lo, "hi": hi, "count": counts[b]})
    return out


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
        raise ValueError("trace has no requests")
    hash_trace = all(r.hash_ids is not None for r in requests)
    stats: dict[str, Any] = {
        "path": str(trace.path) if trace.path is not None else None,
        "requests": len(requests),
        "id_kind": "hash_ids" if hash_trace else "token_ids",
        "block_size": bs,
    }
    if trace.header.extra:
        stats["header"] = dict(trace.header.extra)

    first = requests[0].timestamp
    last = requests[-1].timestamp
    span_ms = last - first
    stats["time"] = {
        "first_ms": first,
        "last_ms": last,
        "span_ms": span_ms,
        "rate_per_s": len(requests) / (span_ms / 1000) if span_ms > 0 else None,
        "distinct_timestamps": len({r.timestamp for r in requests}),
    }
    stats["input_length"] = _summary([r.input_length for r in requests])
    stats["output_length"] = _summary([r.output_length for r in requests])

    page_sizes = [page_size] if page_size is not None else sorted({1, bs})
    hit: dict[str, float] = {}
    if hash_trace:
        accesses: list[int] = []
        for ps in page_sizes:
            cached, total, accesses = _hash_walk(requests, ps, bs)
            hit[str(ps)] = cached / total
    else:
        accesses = _token_block_accesses(requests, bs)
        for ps in page_sizes:
            cached, total = _symbol_walk(requests, ps, bs)
            hit[str(ps)] = cached / total
    unique = len(set(accesses))
    stats["blocks"] = {
        "total": len(accesses),
        "unique": unique,
        "unique_footprint_tokens": unique * bs,
        "block_reuse_ratio": 1 - unique / len(accesses),
    }
    stats["prefix_cache"] = {"infinite_capacity_hit_rate": hit}

    if reuse:
        distances, cold = reuse_distances(accesses)
        ordered = sorted(distances)
        rd: dict[str, Any] = {"unit": "blocks", "references": len(accesses), "cold": cold}
        if ordered:
            for p in PERCENTILES:
                rd[f"p{p}"] = percentile(ordered, p)
        rd["histogram"] = _histogram(distances)
        stats["reuse_distance"] = rd

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
    stats["sessions"] = sess
    stats["skipped"] = trace.skipped
    return stats


def _n(x: float) -> str:
    """Thousands separators; integers stay integers."""
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def format_stats(stats: dict[str, Any]) -> str:
    """Plain-text rendering of `trace_stats` output, one topic per line."""
    lines: list[str] = []

    def row(label: str, text: str) -> None:
        lines.append(f"{label:<16}{text}")

    if stats.get("path"):
        row("trace", str(stats["path"]))
    header = stats.get("header") or {}
    if "generator" in header:
        row("generator", str(header["generator"]))
    if "source" in header:
        row("source", str(header["source"]))
    if "note" in header:
        row("note", str(header["note"]))
    row(
        "requests",
        f"{_n(stats['requests'])} ({stats['id_kind']}, block_size {stats['block_size']})",
    )
    t = stats["time"]
    span_min = t["span_ms"] / 60000
    rate = f"{t['rate_per_s']:.2f} req/s" if t["rate_per_s"] is not None else "n/a req/s"
    row(
        "span",
        f"{_n(t['first_ms'])} - {_n(t['last_ms'])} ms ({span_min:.1f} min), {rate}, "
        f"{_n(t['distinct_timestamps'])} distinct timestamps",
    )
    for key, label in (("input_length", "input tokens"), ("output_length", "output tokens")):
        s = stats[key]
        pcts = "  ".join(f"p{p} {_n(s[f'p{p}'])}" for p in PERCENTILES)
        row(
            label,
            f"mean {s['mean']:,.0f}  min {_n(s['min'])}  {pcts}  max {_n(s['max'])}"
            f"  (total {_n(s['total'])})",
        )
    b = stats["blocks"]
    row(
        "blocks",
        f"{_n(b['total'])} total / {_n(b['unique'])} unique; unique footprint "
        f"{b['unique_footprint_tokens'] / 1e6:.1f} M tokens (unique x {stats['block_size']}); "
        f"block reuse ratio {100 * b['block_reuse_ratio']:.1f} %",
    )
    hit = stats["prefix_cache"]["infinite_capacity_hit_rate"]
    row(
        "prefix hit",
        "infinite-capacity token hit ratio: "
        + ", ".join(f"{100 * v:.1f} % at page {k}" for k, v in hit.items()),
    )
    rd = stats.get("reuse_distance")
    if rd is not None:
        pcts = "  ".join(f"p{p} {_n(rd[f'p{p}'])}" for p in PERCENTILES if f"p{p}" in rd)
        row(
            "reuse distance",
            f"(distinct blocks between references) {_n(rd['references'])} "
            f"references, {_n(rd['cold'])} cold  {pcts}",
        )
        for bucket in rd["histogram"]:
            rng = (
                f"{_n(bucket['lo'])}"
                if bucket["lo"] == bucket["hi"]
                else f"{_n(bucket['lo'])}-{_n(bucket['hi'])}"
            )
            row("", f"  {rng:>17}: {_n(bucket['count'])}")
    s = stats["sessions"]
    if s["sessions"]:
        extra = (
            f", think time mean {s['think_time_ms_mean']:,.0f} ms"
            if ("think_time_ms_mean" in s)
            else ""
        )
        row(
            "sessions",
            f"{_n(s['sessions'])} sessions, {_n(s['requests_in_sessions'])} "
            f"requests, turns mean {s['turns_mean']:.1f} max {s['turns_max']}{extra}",
        )
    else:
        row("sessions", "none")
    if stats.get("skipped"):
        row("skipped", f"{_n(stats['skipped'])} bad lines (lenient read)")
    return "\n".join(lines)
