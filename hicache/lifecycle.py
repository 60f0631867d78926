"""How a request's KV enters the tree: SGLang's ``cache_unfinished_req`` / ``cache_finished_req``.

In SGLang these live on ``RadixCache`` and read the request's slot table; here a small
:class:`ReqKV` carries the same state: the request's paged key so far, the device pages holding
its KV (the first ``protected_pages`` of them are the tree's, pinned through ``last_node``), and
the lock it holds.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hicache.policy.hiradix import HiRadixCache
from hicache.policy.radix import PageKey, TreeNode


@dataclass(slots=True)
class ReqKV:
    """The KV a request holds. ``kv`` covers ``ceil(tokens / page_size)`` pages; ``key`` holds one
    symbol per *full* page of the sequence so far (prompt, then prompt + outputs)."""

    key: Sequence[Hashable]
    kv: list[int]
    last_node: TreeNode
    protected_pages: int = 0


def admit(
    cache: HiRadixCache, key: Sequence[Hashable], max_prefix_pages: int
) -> tuple[ReqKV, int, int]:
    """Match a new request and load its host hit, as ``PrefillAdder.add_one_req`` does.

    Matches only the first ``max_prefix_pages`` pages (SGLang matches ``input_len - 1`` tokens),
    loads a host hit back (``init_load_back``, with the device prefix temporarily locked), then
    locks the final last node for the request. Returns (state, device-hit pages, loaded pages).
    """
    key = key if isinstance(key, PageKey) else PageKey(key)
    m = cache.match_prefix(key, limit=max_prefix_pages * cache.page_size)
    prefix = m.device_indices
    last = m.last_device_node
    loaded = 0
    if m.host_hit_length > 0:
        cache.inc_lock_ref(last)
        pages, new_last = cache.init_load_back(m.best_match_node, m.host_hit_length)
        cache.dec_lock_ref(last)
        if pages:
            prefix = prefix + pages
            loaded = len(pages)
        last = new_last
    cache.inc_lock_ref(last)
    req = ReqKV(key=key, kv=list(prefix), last_node=last, protected_pages=len(prefix))
    return req, m.device_pages, loaded


def cache_unfinished_req(cache: HiRadixCache, req: ReqKV, chunked: bool = False) -> None:
    """Insert the request's full pages so far, free its duplicates, and re-pin the new path."""
    n = len(req.key)
    key = req.key if isinstance(req.key, PageKey) else PageKey(req.key)
    prefix_pages = cache.insert(key, req.kv[:n], chunked=chunked) // cache.page_size
    if prefix_pages > req.protected_pages:
        cache.controller.free_device(req.kv[req.protected_pages : prefix_pages])
    m = cache.match_prefix(key)
    if m.device_pages != n:
        raise AssertionError("cache_unfinished_req: re-match did not cover the inserted key")
    # the tree's pages now back the whole key: below protected_pages they already were the
    # request's; from prefix_pages on they are the request's own (inserted or adopted); only the
    # duplicates in between change
    if prefix_pages > req.protected_pages:
        req.kv[req.protected_pages : prefix_pages] = m.device_slice(
            req.protected_pages, prefix_pages
        )
    cache.dec_lock_ref(req.last_node)
    cache.inc_lock_ref(m.last_device_node)
    req.last_node = m.last_device_node
    req.protected_pages = n


def cache_finished_req(
    cache: HiRadixCache, req: ReqKV, insert: bool = True, insert_pages: int | None = None
) -> None:
    """Insert the finished sequence (or only its first ``insert_pages`` pages), free what the tree
    did not take (duplicates and the unaligned tail), and release the request's lock.

    ``insert=False`` is the retraction path: nothing is inserted, the request's own pages beyond
    the protected prefix are freed.
    """
    n = len(req.key) if insert_pages is None else min(insert_pages, len(req.key))
    ctrl = cache.controller
    if insert:
        key = (
            req.key if n == len(req.key) and isinstance(req.key, PageKey) else PageKey(req.key[:n])
        )
        prefix_pages = cache.insert(key, req.kv[:n]) // cache.page_size
        if prefix_pages > req.protected_pages:
            ctrl.free_device(req.kv[req.protected_pages : prefix_pages])
        tail = req.kv[n:]
    else:
        tail = req.kv[req.protected_pages :]
    if tail:
        ctrl.free_device(tail)
    cache.dec_lock_ref(req.last_node)
    req.kv = []
