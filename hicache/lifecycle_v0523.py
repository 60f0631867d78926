"""The request KV lifecycle against SGLang 0.5.23's cache (:mod:`hicache.policy.v0523`).

The same steps as :class:`hicache.lifecycle.KVLifecycle` (admit, allocate, checkpoint after
prefill, allocate decode pages, finish, abort), with what 0.5.23 changed around the cache:

* **allocation**: when the pool is short, ``evict_to_free_tokens`` asks the cache for the
  *shortfall* (``evict_for_alloc``, which walks until the pool has it), not the whole request
  (allocator/base.py:155-169); the paged-extend estimate is unchanged (one page per request);
* **checkpoint** (``checkpoint_into_tree``, unified_radix_cache.py:1164-1336): one insert with
  the request's protected prefix and its ``cache_inserted_len`` watermark -- the insert frees the
  duplicates itself -- then, once the key passes the prompt, a second insert of the page-aligned
  prompt with priority + 1 (the prompt-boundary split), and the lock moves to the new last node
  without a re-match (``path_device_indices``);
* **load back**: ``init_load_back`` whenever the best match is evicted or a host hit exists.

``sim.hitrate`` drives one request at a time through :meth:`KVLifecycle0523.admit`; the timed
scheduler (``sim.scheduler_v0523``) drives the same steps one by one (:meth:`match`,
:meth:`load_back`, :meth:`lock`, :meth:`alloc`, :meth:`after_prefill`, :meth:`finish`), with
the method names of :class:`hicache.lifecycle.KVLifecycle`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hicache.lifecycle import OUTPUT_MODES, PagedRequest, extend_page_key, prompt_page_key
from hicache.policy.radix import PageKey
from hicache.policy.v0523 import UnifiedRadixCache, UNode
from hicache.policy.v0523.l3 import prefetch_kvcache
from hicache.policy.v0523.tree import Match


def _as_tuple(key: Sequence[Hashable]) -> tuple[Hashable, ...]:
    """A paged key as the tree takes it (page keys are tuples already: no copy)."""
    return key if isinstance(key, tuple) else tuple(key)


@dataclass(slots=True)
class ReqKV23:
    """The KV a request holds: ``kv`` covers its pages; the first ``protected_pages`` are the
    tree's (``cache_protected_len``), pinned through ``last_node``; ``inserted_len`` is the
    ``cache_inserted_len`` watermark (tokens) that hit counting reads."""

    key: Sequence[Hashable]
    kv: list[int]
    last_node: UNode
    protected_pages: int = 0
    inserted_len: int = 0
    prompt_pages: int = 0
    """Full pages of the request's prompt (``origin_input_ids``, page-aligned): where the
    checkpoint splits a key that runs past it."""


@dataclass(slots=True)
class Admitted23:
    kv: ReqKV23
    device_pages: int
    loaded_pages: int


class KVLifecycle0523:
    """The lifecycle steps on one :class:`UnifiedRadixCache` (see the module docstring)."""

    def __init__(self, cache: UnifiedRadixCache, outputs: str = "cache") -> None:
        if outputs not in OUTPUT_MODES:
            raise ValueError(f"outputs must be one of {', '.join(OUTPUT_MODES)}, got {outputs!r}")
        self.cache = cache
        self.page_size = cache.page_size
        self.outputs = outputs
        self._uniq = 0
        # checkpoints pass the request's locked node as the insert walk's hint (False: the
        # plain walk from the root, which tests/policy/test_fast_paths_v0523.py compares)
        self.hints = True
        # the checkpoint's shortcuts, each with SGLang's step beside it (False: SGLang's steps;
        # tests/test_v0523_fast_paths.py compares the two): the prompt insert reads the key's
        # first pages in place (no slice), the request's pages are spliced from the inserted
        # path below its protected prefix only, and the lock moves in one walk
        self.shortcuts = True

    # ---------------------------------------------------------------------------- keys --
    def prompt_key(self, req: PagedRequest) -> PageKey:
        return prompt_page_key(req, self.page_size)

    def extend_key(self, prompt: PageKey, out_symbols: list[Hashable], full: int) -> PageKey:
        key, self._uniq = extend_page_key(prompt, out_symbols, full, self._uniq)
        return key

    # ----------------------------------------------------------------------- admission --
    def admit(self, key: Sequence[Hashable], fill_len: int) -> Admitted23:
        """Match the first ``fill_len - 1`` tokens, load back a host hit, lock the last node.

        0.5.22+ admission also pins ``best_match_node`` on both tiers while it checks the
        load-back budget (schedule_policy.py:1470-1522); a lone request has no budget to
        check, and the load's own lock guards it against its own eviction."""
        m = self.match(key, fill_len)
        dev_pages = len(m.device_pages)
        prefix, last = self.load_back(m)
        kv = self.lock(key, prefix, last)
        return Admitted23(kv, dev_pages, len(prefix) - dev_pages)

    # ------------------------------------------------- admission, step by step (timed) --
    def match(self, key: Sequence[Hashable], fill_len: int) -> Match:
        """``match_prefix`` on the first ``fill_len - 1`` tokens, page-aligned."""
        return self.cache.match_prefix(_as_tuple(key), max(0, (fill_len - 1) // self.page_size))

    def hold(self, node: UNode) -> None:
        """A temporary device lock (``_lock_node``)."""
        self.cache.inc_lock_ref(node)

    def release(self, node: UNode) -> None:
        self.cache.dec_lock_ref(node)

    def load_back_pinned(self, m: Match) -> tuple[list[int], UNode]:
        """:meth:`load_back` with its anchor pinned (a host lock and a device lock on
        ``m.best`` for the call, as the admission and the PD decode side both do)."""
        best = m.best
        uuid = self.cache.tree.inc_host_lock_ref(best)
        self.hold(best)
        try:
            return self.load_back(m)
        finally:
            self.release(best)
            self.cache.tree.dec_host_lock_ref(best, uuid)

    def load_back(self, m: Match) -> tuple[list[int], UNode]:
        """``init_load_back`` of ``m`` when its best node is evicted or it has a host hit;
        returns the request's device prefix pages and the node its lock goes on."""
        prefix, last = m.device_pages, m.last_device
        if m.best.evicted or m.host_hit_length > 0:
            loaded, node = self.cache.init_load_back(m.best, m.host_hit_length, m.last_device)
            if loaded:
                prefix = prefix + self.cache.tree.path_device_pages(node, m.last_device)
                last = node
        return prefix, last

    def lock(
        self, key: Sequence[Hashable], prefix: list[int], last: UNode, prompt_pages: int = 0
    ) -> ReqKV23:
        """The request's own lock on ``last``; its KV starts with ``prefix`` (tree-owned)."""
        self.cache.inc_lock_ref(last)
        return ReqKV23(key=key, kv=prefix, last_node=last, protected_pages=len(prefix),
                       prompt_pages=prompt_pages)  # fmt: skip

    def prefetch(
        self,
        rid: Hashable,
        key: PageKey,
        fill_len: int,
        now: float,
        storage_hit_end: int | None = None,
    ) -> int:
        """A request enters the waiting queue with an L3 tier attached (``_prefetch_kvcache``):
        match it now (with the match's side effects) and query L3 for what follows the cached
        prefix; returns the matched length (-1 without a tier). ``storage_hit_end``: a retry's
        known hit end."""
        storage = self.cache.storage
        if storage is None:
            return -1
        m = self.match(key, fill_len)
        limit = max(0, fill_len - 1)
        return prefetch_kvcache(storage, rid, _as_tuple(key), m, limit, now, storage_hit_end)

    def prefetch_votes(self) -> int:
        """The TP all-reduces the prefetch checks have made so far (``prefetch_tp_votes``)."""
        storage = self.cache.storage
        return 0 if storage is None else storage.stats.prefetch_tp_votes

    def prefetch_done(self, rid: Hashable, now: float) -> int:
        """The admission loop's check (``check_prefetch_progress``, then
        ``pop_prefetch_loaded_span``): -1 while the prefetch must go on, else the tokens L3
        added to the host tier for it (its credit, often 0)."""
        storage = self.cache.storage
        if storage is None:
            return 0
        if not storage.check_prefetch_progress(rid, now):
            return -1
        loaded: int = storage.pop_prefetch_loaded_span(rid)[0]
        return loaded

    def admitted(self, rid: Hashable) -> None:
        """``finish_storage_prefetch_admission`` and the retry's cancel, once admitted."""
        storage = self.cache.storage
        if storage is not None:
            storage.finish_admission(rid)
            storage.retries.cancel(rid)

    # -------------------------------------------------------------------------- memory --
    def alloc(self, pages: int, evict_tokens: int) -> list[int] | None:
        """``pages`` device pages for ``evict_tokens`` tokens of need (the allocator's estimate),
        evicting the shortfall first (``evict_to_free_tokens``); None when still short."""
        self.evict_to_free(evict_tokens)
        return self.cache.controller.device.alloc_pages(pages)

    def evict_to_free(self, num_tokens: int) -> None:
        """``evict_to_free_tokens``: evict the shortfall of ``num_tokens`` (none if available)."""
        dev = self.cache.controller.device
        short = num_tokens - dev.available_size()
        if short > 0:
            self.cache.evict_for_alloc(short)

    def reserve_prompt(self, kv: ReqKV23, prompt_tokens: int) -> bool:
        """Pages for the rest of the prompt (``alloc_paged_token_slots_extend``: the extend
        plus one page when ``page_size > 1``). ``False``: aborted."""
        p = self.page_size
        have = len(kv.kv)
        need = -(-prompt_tokens // p) - have
        if need <= 0:
            return True
        self.evict_to_free(prompt_tokens - have * p + (p if p > 1 else 0))
        if not self.cache.controller.device.alloc_into(kv.kv, need):
            self.abort(kv)
            return False
        return True

    def alloc_outputs(self, kv: ReqKV23, kv_tokens: int) -> bool:
        """Decode pages up to ``kv_tokens``, one page per page boundary when the pool is short
        (``alloc_for_decode``: one page per request of estimate)."""
        p = self.page_size
        need = -(-kv_tokens // p) - len(kv.kv)
        if need <= 0:
            return True
        dev = self.cache.controller.device
        if dev.free_page_count() >= need:
            dev.alloc_into(kv.kv, need)
            return True
        for _ in range(need):
            self.evict_to_free(p)
            if not dev.alloc_into(kv.kv, 1):
                self.abort(kv)
                return False
        return True

    # ------------------------------------------------------------------------- insert --
    def checkpoint(self, kv: ReqKV23, prompt_pages: int) -> None:
        """``checkpoint_into_tree`` of ``kv.key`` (the caller sets it to what is cached)."""
        cache, ps = self.cache, self.page_size
        key = _as_tuple(kv.key)
        n = len(key)
        # the request's locked node spells the key's first protected pages: the walk follows
        # its path without comparing keys (TreeCore.insert's hint)
        _, last = cache.insert(
            key,
            kv.kv,
            prev_prefix_len=kv.protected_pages * ps,
            inserted_len=kv.inserted_len,
            priority=0,
            hint=kv.last_node if self.hints else None,
        )
        kv.inserted_len = max(kv.inserted_len, n * ps)
        fast = self.shortcuts
        if 0 < prompt_pages < n:
            cache.insert(
                key if fast else key[:prompt_pages],
                kv.kv,
                prev_prefix_len=prompt_pages * ps,
                inserted_len=prompt_pages * ps,
                priority=1,
                hint=last if self.hints else None,
                key_end=prompt_pages if fast else -1,
            )
        tree = cache.tree
        if fast:
            tree.copy_path_pages(last, kv.kv, kv.protected_pages, n)
            tree.move_lock_ref(kv.last_node, last)
        else:
            pages = tree.path_device_pages(last, cache.root)
            assert len(pages) == n, "checkpoint: the inserted path does not cover the key"
            kv.kv[kv.protected_pages : n] = pages[kv.protected_pages :]
            cache.dec_lock_ref(kv.last_node)
            cache.inc_lock_ref(last)
        kv.last_node = last
        kv.protected_pages = n

    def after_prefill(self, kv: ReqKV23, prompt_pages: int = -1, chunked: bool = False) -> None:
        """``cache_unfinished_req`` (a chunk or a whole prefill): the checkpoint of ``kv.key``;
        ``prompt_pages`` -1: ``kv.prompt_pages``. ``chunked`` changes nothing in 0.5.23 (the
        watermark replaced the flag); it is taken for the 0.5.14 lifecycle's signature."""
        self.checkpoint(kv, kv.prompt_pages if prompt_pages < 0 else prompt_pages)

    def finish(
        self, kv: ReqKV23, prompt: PageKey, out_symbols: list[Hashable], kv_tokens: int
    ) -> None:
        """The finished request's checkpoint (prompt + outputs, or the prompt only), then its
        release: the unaligned tail is freed and the lock dropped."""
        if self.outputs == "cache":
            kv.key = self.extend_key(prompt, out_symbols, kv_tokens // self.page_size)
        else:
            kv.key = prompt
        self.checkpoint(kv, len(prompt))
        self._release(kv)

    def _release(self, kv: ReqKV23) -> None:
        tail = kv.kv[kv.protected_pages :]
        if tail:
            self.cache.controller.free_device(tail)
        self.cache.dec_lock_ref(kv.last_node)
        kv.kv = []

    def abort(self, kv: ReqKV23) -> None:
        """Out of memory: free the request's own pages, release its lock, insert nothing."""
        self._release(kv)
