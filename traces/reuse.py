"""Reuse (LRU stack) distances of a sequence of block references, and their histogram.

Used by `traces.stats.trace_stats`; `reuse_distances` is also importable from `traces.stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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


def distance_histogram(distances: list[int]) -> list[dict[str, int]]:
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
