"""The decode server's own radix cache (``pd.decode_radix_cache``): SGLang 0.5.23's
``--disaggregation-decode-enable-radix-cache``, with the decode role's host tier when that
role runs HiCache (``cache.enable_host``, SGLang's ``--enable-hierarchical-cache`` on the
decode server).

What SGLang 0.5.23 does (``disaggregation/``, ``mem_cache/``; file:line of the installed
0.5.23 wheel):

- **Enabling.** ``--disaggregation-decode-enable-radix-cache`` (default off,
  arg_groups/fields/disagg.py:88-91) keeps the decode server's radix cache
  (``disable_radix_cache=False``, arg_groups/pd_disaggregation_hook.py:98-119; without it the
  decode server has none, :120-127). Decode-side HiCache is on when the decode server also
  has ``--enable-hierarchical-cache`` (``enable_decode_hicache``, managers/scheduler.py:520-523).
- **Pre-allocation: match and lock** (``pop_preallocated``, decode.py:1496-1530;
  ``_match_prefix_and_lock``, decode.py:860-877). The prompt (``origin_input_ids``) is matched
  in the decode tree with **no** ``input_len - 1`` limit (``match_kv_cache`` with
  ``max_prefix_len=None`` for a dense model, decode.py:861-874, mem_cache/common.py:193-212,
  221-263: only an SWA tail or a re-prefill tail caps it), page-aligned; the last device node
  is locked at once (decode.py:876). A re-bootstrapped request (weight update) skips the match
  (decode.py:1498-1501).
- **What it reports.** ``DecodePrefixMatch`` (decode_hicache_mixin.py:27-52): ``l1`` = device
  prefix, ``l2`` = the match's ``host_hit_length``, ``l3`` = an L3 hit-length query past them,
  only with a storage backend (decode_hicache_mixin.py:78-111); ``decode_prefix_len = l1 + l2 +
  l3`` (:40-42) is what the decode side sends the prefill side in its KV metadata
  (``decode_prefix_len``, decode.py:1813-1820), after a declined L3 prefetch zeroed ``l3``
  (decode_hicache_mixin.py:121-166, decode.py:1606-1610).
- **Budget.** ``_required_alloc_tokens(fill_len, prefix_len=l1)``: the pages past the *device*
  prefix (decode.py:2214-2224), so the L2/L3 gap is charged too;
  ``_required_admission_tokens`` subtracts ``l1`` from the prompt (decode.py:508-517); the
  budget is recomputed after the lock (decode.py:1528-1536) and counts the tree's evictable
  pages as free (decode.py:2109-2116); a misfit unlocks and stops the pass (decode.py:1575-1580).
  Pending restores' tokens are held back from later requests' budget
  (``_hicache_pending_restore_tokens``, decode_hicache_mixin.py:168-176; decode.py:1381-1382).
- **Allocation.** ``_pre_alloc`` (decode.py:2238-2387) writes the device prefix into the row
  and allocates ``fill_len - decode_prefix_len`` new tokens at position ``decode_prefix_len``
  (``alloc_for_decode_prealloc``, decode.py:2435-2511), evicting the shortfall of the pages
  past ``l1`` first (decode.py:2280-2300); the ``[l1, decode_prefix_len)`` gap gets its pages
  from the load-back. ``cache_protected_len = decode_prefix_len`` (decode.py:1636).
- **The prefill side sends only the suffix.** ``finalize_bootstrap`` sets ``start_send_idx =
  decode_prefix_len`` and counts ``kv_to_page_num(len(origin_input_ids) - decode_prefix_len)``
  pages (prefill.py:429-450); each send covers ``[start_send_idx, end)`` and a non-last chunk
  whose page-floored end is below the start is skipped (prefill.py:1537-1564); the early send
  of the prefill's own device-cached prefix happens only past the start (prefill.py:1460-1499).
  The prefill server still prefills the whole prompt with its own cache.
- **Host hits: a local restore.** In the transfer queue, each iteration
  (``_process_hicache_local_restores``, decode_hicache_mixin.py:279-325, called from
  ``pop_transferred``, decode.py:2837-2839): when fewer than 3 loads are in flight
  (``has_free_load_back_slot``, :301), the promised prefix is re-matched and loaded back
  (``init_load_back``, :208-275), the pass's loads go out as one ``ready_to_load_host_cache``
  (:313-325); the KV poll reports success only once the transfer *and* the restore are done
  (``HiCacheRestoreGatedKVReceiver``, :179-193). A short load fails the request (:253-267).
- **Decoded KV enters the decode tree at the finish** (``release_kv_cache(checkpoint=True)``,
  mem_cache/common.py:400-439, also for a one-token request at the prebuilt batch,
  managers/scheduler_components/batch_result_processor.py:117-132): prompt + outputs, the
  protected prefix not freed; with HiCache the insert's write-through backs it up to host as
  on any server.
- **Offload stride** (a different feature, ``--disaggregation-decode-enable-offload-kvcache``,
  managers/scheduler.py:639-650): ``DecodeKVCacheOffloadManager`` copies decoded KV past the
  page-aligned prompt to its own host pool in ``offload_stride`` chunks
  (``SGLANG_HICACHE_DECODE_OFFLOAD_STRIDE``, default = page size, rounded down to pages,
  decode_kvcache_offload_manager.py:61-68, 187-246), backs each chunk up to L3 and frees the
  host copy after the backup (:330-367); it does not insert into the decode tree.
- **Retraction.** With the decode radix cache the default
  ``--disaggregation-decode-retraction-backup`` is ``cpu_tensor``, not ``host_pool``
  (mem_cache/kv_cache_builder.py:225-241); a retracted request is re-allocated without a
  prefix match on resumption (decode.py:2271-2273), as without the radix cache.

What this module does with that: :class:`RadixDecodeRole` replaces
:class:`~sim.pd.decode_side.DecodeRole`'s pre-allocation and transfer polling. The match, the
locks, the load-back and the insert at the finish are the decode instance's own 0.5.23
``UnifiedRadixCache`` (``hicache.policy.v0523``) through its lifecycle, so the hits are the
policy core's. A request with a promised host or L3 part (``l2 + l3 > 0``) takes SGLang's
steps in SGLang's order: its suffix pages at pre-allocation (evicting for the pages past
``l1``), the promised gap held back from later requests' budget, the L3 prefetch if any
(:mod:`sim.pd.decode_l3`), then, in the transfer queue after the pass, the restore
(re-match, load-back, lock) while fewer than three load-backs are in flight; a restore short
of the promise aborts the request. So every request of a pass is matched before any of them
loads its host part back. The offload manager is :mod:`sim.pd.offload`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from hicache.lifecycle_v0523 import KVLifecycle0523, ReqKV23
from hicache.policy.v0523 import UnifiedRadixCache
from sim.instance import Instance
from sim.link import Job
from sim.pd.decode_l3 import PendingRestore, decode_l3_for
from sim.pd.decode_side import DecodeRole
from sim.pd.request import PdReq

#: Load-backs in flight (issued, not yet acknowledged) above which the decode side queues no
#: new restore: ``has_free_load_back_slot`` (unified_radix_cache.py:3733-3736) compares
#: ``len(ack_load_queue)`` with the layer-done counter's ``num_counters``, 3
#: (managers/cache_controller.py:87).
LOAD_BACK_SLOTS = 3


class RadixDecodeRole(DecodeRole):
    """A decode server with its radix cache on (see the module docstring)."""

    chunk_cache = False  # finished requests' KV stays in the decode tree

    def __init__(
        self, inst: Instance, reserved: int, on_preallocated: Callable[[PdReq], None],
        backup: str = "cpu_tensor",
    ) -> None:  # fmt: skip
        super().__init__(inst, reserved, on_preallocated, backup)
        life, cache = self.sched.life, self.sched.cache
        if not isinstance(life, KVLifecycle0523) or not isinstance(cache, UnifiedRadixCache):
            raise ValueError("pd.decode_radix_cache needs sglang.version 0.5.23")
        self.life: KVLifecycle0523 = life
        self.cache: UnifiedRadixCache = cache
        # SGLang's decode loop polls without sleeping: a copy that ends (a load-back, a
        # write-through backup) is acknowledged at its next iteration, which releases the
        # copy's locks. An idle simulated loop is woken for it.
        self._link_changed = inst.link.on_change
        inst.link.on_change = self._copy_ended
        # decode-side L3 (sim.pd.decode_l3): with a storage tier on this server
        self.l3 = decode_l3_for(cache, inst.storage, inst.sched.cost.tp_sync_s)
        self.on_failed: Callable[[PdReq], None] = _ignore  # set by the engine
        self._deadline_armed: set[int] = set()
        if self.l3 is not None and inst.storage is not None:
            inst.storage.listeners.append(self._storage_call_ended)

    def _copy_ended(self) -> None:
        if self._link_changed is not None:
            self._link_changed()
        if self.sched._idle:
            self.sched.wake()

    def pump(self) -> bool:
        """``process_decode_queue`` opens with ``check_hicache_events`` (decode.py:3458-3460):
        here when a request waits on its L3 prefetch (its progress is drained there; the
        loop's own per-iteration check covers the rest)."""
        if self._restores_waiting():
            self.sched._hicache_events()
        return super().pump()

    def _restores_waiting(self) -> bool:
        return any(r.restore is not None and not r.restore.started for r in self.transfer)

    def _pop_preallocated(self) -> None:
        """``pop_preallocated`` with the decode radix cache (decode.py:1496-1636): match and
        lock, the budget past the device prefix, the host part loaded back, the rest
        allocated; the pass's loads go out as one job."""
        retractable = self._retractable()
        clip = self.sched.p.clip_max_new_tokens
        ps = self.sched.p.page_size
        life, cache = self.life, self.cache
        restoring = self._pending_restore_tokens()  # _hicache_pending_restore_tokens
        while self.queue:
            r = self.queue[0]
            d = r.dec
            prompt = d.prompt
            if prompt is None:
                prompt = d.prompt = life.prompt_key(d.with_symbols())
            m = cache.match_prefix(tuple(prompt), len(prompt))  # no input_len - 1 limit
            life.hold(m.last_device)  # _match_prefix_and_lock
            l1 = len(m.device_pages) * ps
            l3 = 0
            if self.l3 is not None:  # _build_decode_prefix_match's L3 query, synchronous
                l3, seconds = self.l3.query(m, tuple(prompt))
                if seconds > 0:
                    self.inst.ctrl.hold(seconds)
            budget = self._allocatable(count_retracted=True, single=True) - restoring
            fill = d.input_length  # _pre_alloc_fill_len of a new request
            pages = -(-fill // ps)
            alloc = pages * ps - l1  # _required_alloc_tokens(fill, prefix_len=l1)
            need = max(alloc + self.reserved, fill - l1 + min(d.output_length, clip) - retractable)
            if need > budget:
                life.release(m.last_device)
                break
            # _start_hicache_prefetch: the L3 promise stands only if the prefetch was taken
            taken = (
                l3 > 0
                and self.l3 is not None
                and self.l3.start(r.rid, m, tuple(prompt), fill, l3, self.env.now)
            )
            if not taken:
                l3 = 0
            if m.host_hit_length > 0 or l3 > 0:  # needs_local_restore: the transfer queue's
                if not self._prealloc_restoring(r, m, l3, pages, taken):
                    break
                restoring += r.decode_prefix - l1
                continue
            got = life.alloc(pages - len(m.device_pages), alloc)
            if got is None:
                life.release(m.last_device)
                break
            self._take(r, m, m.device_pages, m.last_device, got, (l1, 0, 0))

    def _prealloc_restoring(self, r: PdReq, m: Any, l3: int, pages: int, prefetching: bool) -> bool:
        """``_pre_alloc`` of a request promised ``l1 + l2 + l3``: the pages past the promise
        now (evicting for the pages past ``l1``, decode.py:2280-2300), the gap later from its
        restore (``prefetching``: after its L3 prefetch). False: no room (the prefetch is
        aborted, the pass stops)."""
        ps = self.sched.p.page_size
        life = self.life
        l1 = len(m.device_pages)
        promised = l1 + (m.host_hit_length + l3) // ps
        got = life.alloc(pages - promised, (pages - l1) * ps)
        if got is None:
            if prefetching and self.l3 is not None:
                self.l3.abort(r.rid)
            life.release(m.last_device)
            return False
        r.restored = False
        r.restore = PendingRestore(l1, promised, registered=prefetching)
        self._take(r, m, list(m.device_pages), m.last_device, got, (l1 * ps, m.host_hit_length, l3))
        return True

    def _take(
        self, r: PdReq, m: Any, prefix: list[int], last: Any, got: list[int],
        hits: tuple[int, int, int],
    ) -> None:  # fmt: skip
        """``r`` leaves the queue pre-allocated: its lock on ``last`` (the match's temporary
        one dropped), its row ``prefix + got``, its decode prefix per tier (``hits``: device,
        host, L3 tokens; their sum is ``decode_prefix_len``, what the prefill side is promised
        and hears of now)."""
        d = r.dec
        assert d.prompt is not None
        r.decode_prefix = sum(hits)
        kv = self.life.lock(d.prompt, prefix, last, prompt_pages=len(d.prompt))
        self.life.release(m.last_device)
        kv.kv += got
        self.queue.popleft()
        r.kv = kv
        r.prealloc_s = self.env.now
        r.decode_device_hit, r.decode_host_hit, r.decode_storage_hit = hits
        self.transfer.append(r)
        self.on_preallocated(r)

    def _pending_restore_tokens(self) -> int:
        """``_hicache_pending_restore_tokens``: the promised gaps of the transfer queue's
        requests that hold no restore lock yet."""
        return sum(
            (r.restore.promised - r.restore.l1) * self.sched.p.page_size
            for r in self.transfer
            if r.restore is not None and not r.restore.started
        )

    def _restore_pending(self) -> None:
        """``_process_hicache_local_restores``: for each request with a promised host/L3 part,
        its L3 prefetch checked (if any), then the promised prefix re-matched and loaded back
        (``_try_hicache_queue_load_back``); the pass's loads go out as one job."""
        l3 = self.l3
        waiting = [r for r in self.transfer if r.restore is not None and not r.restore.started]
        if not waiting:
            return
        if len(self.cache.controller.load_queue) >= LOAD_BACK_SLOTS:
            return  # has_free_load_back_slot: no new load-back (nor prefetch poll) this pass
        now = self.env.now
        started: list[PdReq] = []
        for r in waiting:
            st = r.restore
            assert st is not None
            if st.failed:
                continue
            if st.registered:
                assert l3 is not None
                done, votes_s = l3.progress(r.rid, now)
                if votes_s > 0:
                    self.inst.ctrl.hold(votes_s)
                if not done:
                    self._wake_at_deadline(r.rid)
                    continue
                st.registered = False
            prompt = r.dec.prompt
            assert prompt is not None
            m = self.cache.match_prefix(tuple(prompt), st.promised)
            prefix, last = m.device_pages, m.last_device
            if m.host_hit_length > 0:
                prefix, last = self.life.load_back_pinned(m)
            if len(prefix) < st.promised:  # the load fell short: HiCacheRestoreResult.FAILED
                st.failed = r.restored = r.restore_failed = True
                continue
            self.cache.inc_lock_ref(last)  # the restore lock, held until the commit
            st.node, st.prefix, st.started = last, prefix, True
            started.append(r)
        self._launch_restores(started)

    def _wake_at_deadline(self, rid: int) -> None:
        """A timeout-policy prefetch holds ``rid``: poll again when its deadline passes."""
        assert self.l3 is not None
        due = self.l3.deadline(rid)
        if due is None or rid in self._deadline_armed:
            return
        self._deadline_armed.add(rid)

        def ring(_event: simpy.Event) -> None:
            self._deadline_armed.discard(rid)
            self.poke()

        self.env.timeout(max(0.0, due - self.env.now) + 1e-9).callbacks.append(ring)

    def _storage_call_ended(self, _call: object) -> None:
        """A storage call of this server ended: a request waiting on its prefetch is
        re-polled at the loop's next iteration (SGLang's decode loop never sleeps)."""
        if self._restores_waiting():
            self.poke()

    def _commit(self, r: PdReq) -> None:
        """``_commit_hicache_local_restore_to_req``: the restore's lock replaces the
        pre-allocation's, the restored pages fill the row up to the promise."""
        st, kv = r.restore, r.kv
        assert st is not None and st.prefix is not None and st.node is not None
        assert isinstance(kv, ReqKV23)
        self.cache.dec_lock_ref(kv.last_node)
        kv.kv = st.prefix + kv.kv[st.l1 :]
        kv.last_node = st.node
        kv.protected_pages = st.promised

    def _fail(self, r: PdReq) -> None:
        """A restore that fell short, seen at the KV poll: SGLang aborts the request
        (``prepare_abort``, status 500) and releases what it held."""
        assert r.kv is not None
        if self.l3 is not None:
            self.l3.abort(r.rid)
        self._release(r.kv)
        r.kv = None
        r.rejected = True
        self._of.pop(r.rid, None)
        self.inst.done += 1
        self.on_failed(r)

    def cancel(self, r: PdReq) -> None:
        """The prefill side rejected ``r``: its prefetch and restore lock go too."""
        st = r.restore
        if st is not None:
            if st.registered and self.l3 is not None:
                self.l3.abort(r.rid)
            if st.started and st.node is not None:
                self.cache.dec_lock_ref(st.node)
        super().cancel(r)

    def _launch_restores(self, reqs: list[PdReq]) -> None:
        """The pass's load-backs go out as one job (``ready_to_load_host_cache``); ``reqs``
        are restored when it ends."""
        if not reqs:
            return
        job = self.inst.ctrl.launch_loads()
        if job is None or 0 <= job.end <= self.env.now:
            for r in reqs:
                self._restored(r, self.env.now)
        else:
            self.env.process(self._await_restore(job, reqs))

    def _await_restore(self, job: Job, reqs: list[PdReq]) -> Generator[simpy.Event, Any, None]:
        if job.end < 0:
            assert job.done is not None
            yield job.done
        elif job.end > self.env.now:
            yield self.env.timeout(job.end - self.env.now)
        for r in reqs:
            self._restored(r, self.env.now)
        self.poke()

    def _restored(self, r: PdReq, t: float) -> None:
        r.restored = True
        r.restore_end_s = t

    def _pop_transferred(self) -> None:
        """``pop_transferred`` behind the restore gate (``HiCacheRestoreGatedKVReceiver``):
        the transfer and the local load-back both done."""
        self._restore_pending()
        done = [r for r in self.transfer if r.arrived and r.restored]
        for r in done:
            self.transfer.remove(r)
            if r.restore is not None:
                if r.restore.failed:
                    self._fail(r)
                    continue
                self._commit(r)
            r.dec.kv, r.kv = r.kv, None
            self.waiting.append(r.dec)


def _ignore(_r: PdReq) -> None:
    return None
