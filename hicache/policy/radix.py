"""Radix-tree nodes and page-aligned keys (SGLang ``radix_cache.py``: ``RadixKey``, ``TreeNode``).

Keys are stored *paged*: a key is a tuple with one hashable symbol per page. With
``page_size == 1`` a symbol is a token id; with larger pages it is the tuple of the page's token
ids, or any other hashable that identifies the page's content *and everything before it is
compared separately* (e.g. the ints that :func:`traces.keys.page_symbols` derives from Mooncake
hash ids). Comparing two paged keys symbol by symbol is the same as comparing the token sequences
and rounding the common prefix down to a page multiple, which is SGLang's ``RadixKey.match``; so
splits can only fall on page boundaries and siblings never share a first page.

Values are lists of page ids (one per page of the key) from :class:`~hicache.policy.allocator
.PageAllocator`; lengths reported to callers are in tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

# re-exported: the key types' historical home
from hicache.policy.pagekey import ExtendedPageKey as ExtendedPageKey
from hicache.policy.pagekey import PageKey as PageKey
from hicache.policy.pagekey import PrefixKey as PrefixKey


def key_source(pkey: tuple[Hashable, ...]) -> tuple[Hashable, ...] | None:
    """The persistent key that node keys cut from ``pkey`` are recorded against (``key_memo``):
    ``pkey`` itself for a :class:`PageKey`, the ``base`` of an :class:`ExtendedPageKey`, the
    source of a :class:`PrefixKey`'s ``base``, and None for anything else (a key converted on
    the fly is not worth keeping alive). A source may be longer than ``pkey`` (a prefix's):
    a memo hit counts only where ``pkey`` reaches."""
    t = type(pkey)
    if t is PageKey:
        return pkey
    if t is ExtendedPageKey:
        return pkey.base  # type: ignore[attr-defined, no-any-return]
    if t is PrefixKey:
        return key_source(pkey.base)  # type: ignore[attr-defined]
    return None


def to_page_key(tokens: Sequence[Any], page_size: int) -> tuple[Hashable, ...]:
    """Page-align ``tokens`` and turn them into a paged key (see the module docstring).

    A :class:`PageKey` is returned unchanged (no copy). Token sequences are truncated to
    ``floor(len / page_size) * page_size`` tokens first (SGLang's ``page_aligned``).
    """
    if isinstance(tokens, PageKey):
        return tokens  # already paged (a tuple); its slices are plain tuples
    if page_size == 1:
        return tokens if type(tokens) is tuple else tuple(tokens)
    n = len(tokens) - len(tokens) % page_size
    return tuple(tuple(tokens[i : i + page_size]) for i in range(0, n, page_size))


def match_len(
    node_key: tuple[Hashable, ...], key: tuple[Hashable, ...], off: int, end: int | None = None
) -> int:
    """Length (in pages) of the common prefix of ``node_key`` and ``key[off:end]``.

    A full match is one slice comparison in C; a partial one is found by galloping then
    bisecting over slice comparisons, so no Python loop runs per page or token and the work
    grows with the matched length, not with the node's.
    """
    n = len(node_key)
    stop = min(off + n, len(key) if end is None else min(end, len(key)))
    m = stop - off
    if m <= 0:
        return 0
    a, b = key[stop - 1], node_key[m - 1]
    # the last pages agree: most likely a full match, one comparison
    if (a is b or a == b) and key[off:stop] == (node_key if m == n else node_key[:m]):
        return m
    # gallop: lo pages are known equal; then bisect inside the first unequal window [lo, hi)
    lo, step = 0, 8
    while True:
        hi = min(lo + step, m)
        if key[off + lo : off + hi] != node_key[lo:hi]:
            break
        lo = hi
        if lo == m:
            return m
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[off + lo : off + mid] == node_key[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class TreeNode:
    """One radix-tree node (SGLang ``TreeNode``).

    ``value is None`` means evicted from the device; ``host_value is None`` means not backed up.
    Times are ticks of the owning cache's logical clock. The ``_h*`` fields belong to the
    cache's lazily invalidated eviction heaps.
    """

    __slots__ = (
        "_hhkey",
        "_hhseq",
        "_hkey",
        "_hseq",
        "_kmemo",
        "children",
        "creation_time",
        "extra_key",
        "hash_value",
        "hit_count",
        "host_ref_counter",
        "host_value",
        "id",
        "key",
        "last_access_time",
        "lock_ref",
        "parent",
        "priority",
        "value",
        "write_through_pending_id",
    )

    def __init__(self, node_id: int, now: int, priority: int = 0) -> None:
        self.id = node_id
        self.children: dict[Hashable, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: tuple[Hashable, ...] = ()
        self.value: list[int] | None = None
        self.host_value: list[int] | None = None
        self.lock_ref = 0
        self.host_ref_counter = 0
        self.hit_count = 0
        self.last_access_time = now
        self.creation_time = now
        self.priority = priority
        self.write_through_pending_id: int | None = None
        self.extra_key: str | None = None
        self.hash_value: list[int] | None = None  # L3 page keys, computed when first needed
        self._hkey: Any = None
        self._hseq = -1
        self._hhkey: Any = None
        self._hhseq = -1
        self._kmemo: tuple[tuple[Hashable, ...], tuple[Hashable, ...], int] | None = None
        """``(key, src, off)``: this node's ``key`` object was cut as ``src[off:off + len]``
        (``key_source``); valid only while ``key`` is still that object."""

    @property
    def evicted(self) -> bool:
        return self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def protect_host(self) -> None:
        """Pin the host copy (L3 prefetch anchor / L3 backup): evict_host skips it."""
        self.host_ref_counter += 1

    def release_host(self) -> None:
        if self.host_ref_counter <= 0:
            raise RuntimeError(f"release_host on node {self.id} whose host_ref_counter is 0")
        self.host_ref_counter -= 1

    def __repr__(self) -> str:
        state = ("D" if self.value is not None else "") + ("H" if self.host_value else "")
        return (
            f"TreeNode(id={self.id}, pages={len(self.key)}, {state or '-'}, "
            f"lock={self.lock_ref}, hit={self.hit_count})"
        )


def child_key(key: tuple[Hashable, ...], off: int, extra_key: str | None) -> Hashable:
    """The dict key under which a child starting at ``key[off]`` is stored (first page)."""
    first = key[off]
    return first if extra_key is None else (extra_key, first)
