"""The scheduler loop against SGLang 0.5.23's cache (``sglang.version = "0.5.23"``).

:class:`Scheduler0523` is :class:`sim.scheduler.Scheduler` with the steps SGLang changed between
0.5.14 and 0.5.23 replaced; the loop, the decode segments and their timing are the base
class's. ``conformance/v0523/SCHEDULER.md`` is the comparison of the two releases' scheduler
code this follows (file:line in both wheels). What changed, each in one method below:

* the request lifecycle is :class:`hicache.lifecycle_v0523.KVLifecycle0523` (the checkpoint with
  its watermark and prompt-boundary split; allocation evicts the shortfall only);
* admission (``add_one_req``, schedule_policy.py:1395-1590) chooses whole request, chunk, OTHER or
  NO_TOKEN *before* the load-back, with the host hit counted as cached; a truncated chunk that
  rounds to nothing is OTHER with no load started; a load that does not happen re-chooses with
  the device prefix only. The load-back runs under a host and device lock on
  ``best_match_node``; its budget check (``prepare_load_back``) always passes for a dense model;
* the decode memory check and the retraction evict the shortfall only;
* a chunk's checkpoint is the next iteration's stash (after ``check_hicache_events``), and the
  merged device->host writes are submitted after every batch result (``flush_pending_backups``,
  scheduler.py:5105-5106): a chunk's backup starts after the next chunk's forward;
* under ``lru`` with FCFS admission the first 128 waiting prefixes are touched, head last, on
  every 32nd scheduling pass (``_touch_waiting_prefixes``, schedule_policy.py:280-305).

The running batch's ``batch_is_full``, the budget arithmetic, the loop guards and the retraction
are SGLang's in both versions (SCHEDULER.md §7, items 1-6 and 8); what 0.5.23 changed there is
here: the flag is cleared by the every-step filter right after a finish and on an empty batch,
and the loop stops before matching once the prefill or chunk budget is spent.

With an L3 tier (``hicache.policy.v0523.l3``): the arrival's query (``_prefetch_kvcache``), the
retry pass after every ``check_hicache_events`` (:meth:`Scheduler0523._hicache_events`), the
admission loop's checks with the device-hit-loss re-query, and the credit kept until admission.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

import simpy

from hicache.lifecycle_v0523 import KVLifecycle0523, ReqKV23
from hicache.policy.storage import PrefetchOp
from hicache.policy.v0523 import UnifiedRadixCache
from hicache.policy.v0523.l3 import RETRY_MAX_ATTEMPTS, RETRY_POLL_INTERVAL, StorageAttachment
from sim.admission import NO_TOKEN, OTHER, SKIP, PrefillBudget
from sim.cache_types import AnyCache, AnyKV, AnyLife
from sim.scheduler import Scheduler, SimReq

#: ``WAITING_QUEUE_PREFIX_MATCH_MAX`` and ``WAITING_PREFIX_REFRESH_INTERVAL``
#: (schedule_policy.py:136-139): how many waiting prefixes a refresh touches, and how often.
TOUCH_MAX = 128
TOUCH_INTERVAL = 32


class Scheduler0523(Scheduler):
    """See the module docstring."""

    def _make_life(self, cache: AnyCache, outputs: str) -> AnyLife:
        assert isinstance(cache, UnifiedRadixCache), "Scheduler0523 drives SGLang 0.5.23's cache"
        self._touch_calls = 0
        self._stash: list[ReqKV23] = []
        return KVLifecycle0523(cache, outputs)

    def _v0523(self) -> tuple[KVLifecycle0523, UnifiedRadixCache]:
        life, cache = self.life, self.cache
        assert isinstance(life, KVLifecycle0523) and isinstance(cache, UnifiedRadixCache)
        return life, cache

    def _l3_0523(self) -> StorageAttachment:
        storage = self._v0523()[1].storage
        assert isinstance(storage, StorageAttachment)
        return storage

    # ------------------------------------------------------------------------- the L3 tier --
    def _enqueue(self, req: SimReq) -> None:
        """``_add_request_to_queue`` -> ``_prefetch_kvcache``: match and query L3 now (a
        retracted request starts its attempts afresh)."""
        if req.retractions:
            req.storage_prefetch_retry_attempts = 0
            req.storage_last_match = -1
        if self.cache.storage is not None:
            if self._drain_due:  # an idle SGLang loop would have drained meanwhile
                self._drain_due = False
                self._hicache_events()
            self._prefetch(req)
        self.waiting.append(req)

    def _prefetch(self, req: SimReq, storage_hit_end: int | None = None) -> None:
        life = self._v0523()[0]
        key = self._fill_key(req)
        req.storage_last_match = life.prefetch(
            req.rid, key, req.fill_len, self.env.now, storage_hit_end
        )

    def _hicache_events(self) -> None:
        """``_process_hicache_events``: the cache's events, then the L3 retry pass over the
        waiting queue (``_process_storage_prefetch_retries``: each due request re-issues its
        query, one attempt more)."""
        cache = self.cache
        cache.check_hicache_events()
        if cache.storage is None:
            return
        ready = self._l3_0523().retries.pop_ready(
            self.waiting, RETRY_POLL_INTERVAL, RETRY_MAX_ATTEMPTS
        )
        for req, end in ready:
            assert isinstance(req, SimReq)
            req.storage_prefetch_retry_attempts += 1
            self._prefetch(req, end)

    def _device_hit_lost(self, req: SimReq, matched: int) -> bool:
        """``_prefetch_after_device_hit_loss``: the match shrank since its last L3 query (a
        queue-time eviction): query again and leave it queued, up to the attempt cap."""
        last = req.storage_last_match
        if last <= 0 or matched >= last:
            return False
        if req.storage_prefetch_retry_attempts >= RETRY_MAX_ATTEMPTS:
            req.storage_last_match = matched
            return False
        req.storage_prefetch_retry_attempts += 1
        self._prefetch(req)
        return True

    def _prefetch_op(self, rid: int) -> PrefetchOp | None:
        info = self._l3_0523().ongoing_prefetch.get(rid)
        return info.op if info is not None else None

    def _take_credit(self, req: SimReq, credit: int) -> None:
        """``req.storage_hit_length`` is set only when the popped span is > 0 (0.5.16+): a
        credit survives a pass that does not admit the request."""
        if credit > 0:
            req.storage_credit = credit

    def _after_attempt(self, req: SimReq, credit: int, admitted: bool) -> None:
        """Admitted: the wait budget closes and its retry is cancelled."""
        if admitted:
            self._v0523()[0].admitted(req.rid)

    def _op_deadline(self, op: PrefetchOp) -> float | None:
        return self._l3_0523().deadline_of(op.rid)

    def _prefetch_deadline(self, rid: int) -> float | None:
        return self._l3_0523().deadline_of(rid)

    # ------------------------------------------------------------------- the loop's steps --
    def _before_prefill_attempt(self) -> None:
        """An empty running batch has nobody left to clear the flag (scheduler.py:4093-4096)."""
        if not self.running:
            self.batch_is_full = False

    def _pass_spent(self, budget: PrefillBudget) -> bool:
        """``if adder.budget_state() == OTHER: break`` (4207): a spent prefill or chunk budget
        stops the loop before the next request is matched (with the room gone it is still
        matched, and gets NO_TOKEN)."""
        return budget.state() == OTHER

    def _queued(self) -> bool:
        """With an L3 tier every iteration counts for a waiting request's retry pass (every
        8th re-queries storage), full batch or not: one decode step per call while any waits."""
        return super()._queued() or (self.cache.storage is not None and bool(self.waiting))

    def _left(self, n: int) -> None:
        """``n`` requests finished in a decode step: the every-step filter drops them before
        the next prefill attempt, clearing the flag (3962-3968)."""
        if n:
            self.batch_is_full = False

    def _get_new_batch_prefill(self) -> list[tuple[SimReq, int, int]] | None:
        """The chunk's stash (its checkpoint, after ``check_hicache_events``), then admission."""
        if self._stash:
            life = self._v0523()[0]
            for kv in self._stash:
                life.after_prefill(kv)
            self._stash = []
        return super()._get_new_batch_prefill()

    def _checkpoint(self, kv: AnyKV, chunked: bool = False) -> None:
        """An intermediate chunk's checkpoint waits for the next iteration's stash."""
        assert isinstance(kv, ReqKV23)
        if chunked:
            self._stash.append(kv)
        else:
            self._v0523()[0].after_prefill(kv)

    def _run_prefill(
        self, batch: list[tuple[SimReq, int, int]]
    ) -> Generator[simpy.Event, Any, None]:
        yield from super()._run_prefill(batch)
        self._v0523()[1].flush_pending_backups()

    def _run_decode(self, chain: bool = True) -> Generator[simpy.Event, Any, None]:
        yield from super()._run_decode(chain)
        self._v0523()[1].flush_pending_backups()

    def _evict_for_decode(self, num_tokens: int) -> None:
        """``check_decode_capacity`` / ``evict_from_tree_cache``: the shortfall only."""
        self._v0523()[0].evict_to_free(num_tokens)

    # ----------------------------------------------------------------------- priority --
    def _calc_priority(self) -> None:
        """``calc_priority``: LPM's sort as 0.5.14's, then ``_touch_waiting_prefixes``."""
        super()._calc_priority()
        p = self.p
        lpm_active = p.policy == "lpm" and len(self.waiting) <= p.lpm_max_queue
        cache = self._v0523()[1]
        if lpm_active or not self.waiting or cache.eviction_policy != "lru":
            return
        refresh = self._touch_calls % TOUCH_INTERVAL == 0
        self._touch_calls += 1
        if not refresh:
            return
        for i in range(min(TOUCH_MAX, len(self.waiting)) - 1, -1, -1):
            cache.touch_prefix(self._fill_key(self.waiting[i]))

    def _sort_lpm(self) -> None:
        """Longest prefix match first (stable), as 0.5.14's (device + host hit)."""
        life = self._v0523()[0]
        ps = self.p.page_size
        scored = []
        for r in self.waiting:
            m = life.match(self._fill_key(r), r.fill_len)
            scored.append((-(len(m.device_pages) * ps + m.host_hit_length), r))
        scored.sort(key=lambda x: x[0])
        self.waiting = deque(r for _, r in scored)

    # ---------------------------------------------------------------------- admission --
    def _select(
        self, budget: PrefillBudget, batch: list[tuple[SimReq, int, int]], req: SimReq,
        total: int, cached: int,
    ) -> int:  # fmt: skip
        """``_select_prefill_admission`` (side-effect free) with ``cached`` tokens counted as
        the prefix: the tokens to prefill this batch (the whole extend, or a page-aligned
        chunk), 0 for NO_TOKEN, -1 for OTHER."""
        if total >= budget.rem_total():
            return 0  # NO_TOKEN
        extend = req.fill_len - cached
        paged = budget.ceil(extend)
        if not budget.chunking and batch and paged >= budget.rem_input:
            return -1  # OTHER
        if not budget.chunking or paged <= budget.rem_chunk:
            return extend
        ps = self.p.page_size
        size = (cached + budget.rem_chunk // ps * ps) // ps * ps - cached
        return size if size > 0 else -1

    def _add_waiting(
        self, budget: PrefillBudget, batch: list[tuple[SimReq, int, int]], req: SimReq
    ) -> int:
        """``PrefillAdder.add_one_req`` (0.5.23) for ``req``, the waiting request the loop
        reaches: NO_TOKEN, OTHER, SKIP (re-queried after a device-hit loss) or (admitted) the
        budget's state."""
        life, cache = self._v0523()
        ps = self.p.page_size
        key = self._fill_key(req)
        m = life.match(key, req.fill_len)
        dev = len(m.device_pages) * ps
        if cache.storage is not None and self._device_hit_lost(req, dev + m.host_hit_length):
            return SKIP  # re-queried: it stays queued, the loop goes on
        host_hit = m.host_hit_length
        plan: Any = None
        buffer = cache.buffer
        if buffer is not None:  # buffer_only: the staged L3 span is the request's host hit
            plan = buffer.prepare_staged(req.rid, dev)
            if plan is False:
                return SKIP  # its device prefix shrank: re-fetched, it stays queued
            host_hit = plan.full_tokens if plan is not None else 0
        total = req.fill_len - dev + budget.new_tokens(req) + ps
        life.hold(m.last_device)  # _lock_node(req.last_node)
        try:
            size = self._select(budget, batch, req, total, dev + host_hit)
            if size <= 0:
                if size == 0 and plan is not None and not batch and not self.running:
                    buffer.defer_staged(req.rid)  # _defer_staged_for_capacity_if_idle
                return NO_TOKEN if size == 0 else OTHER  # nothing loaded
            prefix, last = m.device_pages, m.last_device
            if plan is not None:
                got = buffer.init_load_back_staged(req.rid, plan)
                if got is None:
                    return OTHER  # deferred: the staging is kept for the next pass
                last = got[1]
                prefix = cache.tree.path_device_pages(last, cache.root)
            elif m.host_hit_length > 0:  # needs_host_load_back
                prefix, last = life.load_back_pinned(m)
                loaded = (len(prefix) - len(m.device_pages)) * ps
                if 0 < loaded != m.host_hit_length:  # SGLang raises: all or nothing
                    raise RuntimeError(
                        f"load-back committed {loaded} of {m.host_hit_length} promised tokens"
                    )
                if not loaded:  # nothing loaded: choose again with the device prefix
                    size = self._select(budget, batch, req, total, dev)
                    if size <= 0:
                        return NO_TOKEN if size == 0 else OTHER
            kv = life.lock(key, prefix, last, len(self._prompt(req)))
        finally:
            life.release(m.last_device)
        self._admitted(req, kv, dev, len(prefix) * ps - dev, host_hit)
        cached = len(prefix) * ps
        batch.append((req, size, cached))
        if size == req.fill_len - cached:
            budget.take(size, budget.max_new(req))
        else:  # truncated: later chunks bring the rest
            budget.take(size, 0)
            self.chunked = req
        return budget.state()

    def _admitted(self, req: SimReq, kv: ReqKV23, dev: int, loaded: int, host_hit: int) -> None:
        """``req`` leaves the queue holding ``kv``; its first admission sets what the user sees
        as cached."""
        if self.waiting[0] is req:
            self.waiting.popleft()
        else:
            self.waiting.remove(req)
        if req.device_hit < 0:
            req.device_hit = dev
            from_l3 = min(loaded, req.storage_credit)
            req.storage_hit = from_l3
            req.host_hit = loaded - from_l3
            req.host_hit_recomputed = host_hit - loaded
            req.admitted = self.env.now
        req.storage_credit = 0
        req.kv = kv
        req.filled = len(kv.kv) * self.p.page_size
