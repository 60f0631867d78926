"""A decode server of a PD cluster: SGLang 0.5.23's decode-side queues around one
:class:`~sim.instance.Instance`, whose scheduler decodes the running batch as without PD.

SGLang's decode loop (``event_loop_normal_disagg_decode``, decode.py:3123-3163) runs, each
iteration, ``process_decode_queue`` (decode.py:3458-3497), then merges the requests whose KV has
arrived into the running batch without a forward (``get_next_disagg_decode_batch_to_run``,
decode.py:3241-3271: the prebuilt batch streams its first token, then ``update_running_batch``
and the decode step of the merged batch). :meth:`DecodeRole.pump` is that iteration's queue
work, step by step:

1. ``resume_retracted_reqs`` (decode.py:1021-1102): a retracted request comes back when its
   KV plus the reserved decode tokens fit; while any stays retracted, nothing new is
   pre-allocated and no transfer is polled (decode.py:3470-3474).
2. ``pop_preallocated`` (decode.py:1333-1843): the queue in FIFO order, stopping at the first
   request whose KV does not fit the budget (``_allocatable_token_budgets``,
   decode.py:2083-2137); a fit gets its prompt pages now and its KV indices go to prefill.
3. ``pop_transferred`` (decode.py:2833): the requests whose KV has arrived wait to be merged.
4. ``_get_new_prebuilt_batch`` (decode.py:3375-3452): as many as the running cap admits join
   the running batch; the first token reaches the client now (``process_batch_result_prebuilt``
   streams it, batch_result_processor.py:117-132): the end of TTFT.

It runs where the scheduler loop is between two iterations (the hook on its per-iteration
``sample``) or, when that loop is idle, at once. Decode segments listen for the wake-ups this
sends (``announced`` off), so an arrival or a finished transfer is seen after the decode step
under way, as SGLang's loop sees it at its next iteration.

Retraction is the scheduler's own (``check_decode_mem`` / ``retract_decode``); in PD its victim
keeps its KV in a CPU backup (``--disaggregation-decode-retraction-backup``) and waits in the
retracted queue instead of being prefilled again: here it leaves the scheduler's waiting queue
for that queue and, resumed, gets its pages back without recompute; the backup's and the
restore's synchronous copies block the scheduler (:mod:`sim.pd.retraction`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import simpy

from hicache.lifecycle import KVLifecycle
from sim.cache_types import AnyKV
from sim.instance import Instance
from sim.pd.request import PdReq
from sim.pd.retraction import copy_seconds
from sim.scheduler import SimReq


class DecodeRole:
    """The decode-side queues of one decode server (``inst``). ``reserved``:
    ``--num-reserved-decode-tokens``; ``on_preallocated`` hears of each request whose KV pages
    were just pre-allocated (its prefill may start once bootstrapped)."""

    def __init__(
        self, inst: Instance, reserved: int, on_preallocated: Callable[[PdReq], None],
        backup: str = "host_pool",
    ) -> None:  # fmt: skip
        self.inst = inst
        self.backup = backup  # the retraction backup (sim.pd.retraction: host_pool / cpu_tensor)
        self.env: simpy.Environment = inst.env
        self.sched = inst.sched
        self.reserved = reserved
        self.on_preallocated = on_preallocated
        self.queue: deque[PdReq] = deque()  # DecodePreallocQueue.queue
        self.transfer: list[PdReq] = []  # DecodeTransferQueue.queue
        self.waiting: deque[SimReq] = deque()  # the scheduler's waiting_queue (KV is here)
        self.retracted: deque[SimReq] = deque()  # DecodePreallocQueue.retracted_queue
        self._of: dict[int, PdReq] = {}  # rid -> its PD request, while on this server
        s = self.sched
        s.announced = s.span_ok = False  # decode segments hear wake-ups (see the docstring)
        self._own_sample = inst._sample
        s.sample = self._iteration_end

    # ------------------------------------------------------------------- from outside --
    def add(self, r: PdReq) -> None:
        """``DecodePreallocQueue.add``: ``r`` reached this server (with its prefill's)."""
        self._of[r.rid] = r
        self.inst.routed += 1
        self.queue.append(r)
        self.poke()

    def kv_arrived(self, r: PdReq) -> None:
        """The last chunk of ``r``'s KV has landed (``KVPoll.Success``)."""
        r.arrived = True
        self.poke()

    def cancel(self, r: PdReq) -> None:
        """``r`` will not come (its prefill rejected it): its pre-allocated pages go back."""
        if r in self.transfer:
            self.transfer.remove(r)
        elif r in self.queue:
            self.queue.remove(r)
        if r.kv is not None:
            self._release(r.kv)
            r.kv = None
        self._of.pop(r.rid, None)
        self.inst.done += 1
        self.poke()

    def poke(self) -> None:
        """Something for the queues: an idle loop runs them now; a busy one after the step
        under way (woken, its decode segment stops there)."""
        if self.sched._idle:
            self.pump()
        self.sched.wake()

    def _iteration_end(self) -> None:
        """The scheduler's per-iteration hook: its own sampling, then the queues."""
        self._own_sample()
        was_empty = not self.sched.running
        if self.pump() and was_empty:
            # the loop may be about to wait idle: wake it once it does
            self.env.process(self._wake_if_idle())

    def _wake_if_idle(self) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(0)
        if self.sched._idle and self.sched.running:
            self.sched.wake()

    # ------------------------------------------------------------ one loop iteration --
    def pump(self) -> bool:
        """``process_decode_queue`` and the prebuilt merge; True if any request joined."""
        self._take_retracted()
        self._resume_retracted()
        if not self.retracted:
            self._pop_preallocated()
            self._pop_transferred()
        return self._merge() > 0

    def _take_retracted(self) -> None:
        """The scheduler retracted these (``_add_request_to_queue(is_retracted=True)``,
        scheduler.py:4538-4540, to the prealloc queue's ``retracted_queue``, decode.py:845)."""
        waiting = self.sched.waiting
        wait = 0.0
        while waiting:
            v = waiting.popleft()
            self.retracted.append(v)
            # backup_kv_cache: its KV to host memory, synchronously (sim.pd.retraction)
            wait += copy_seconds(self.backup, "d2h", self._fill_len(v), self.inst.ctrl.costs,
                                 self.sched.p.page_size)  # fmt: skip
        if wait > 0:
            self.inst.ctrl.hold(wait)

    def _resume_retracted(self) -> None:
        """``resume_retracted_reqs`` (decode.py:1021-1102), budget without the retracted ones
        and without the one-request headroom (``count_retracted=False``)."""
        budget = self._allocatable(count_retracted=False, single=False)
        while self.retracted:
            v = self.retracted[0]
            if self._prealloc_required(v) > budget:
                break
            kv = self._alloc_kv(v, self._fill_len(v))
            if kv is None:
                break
            self.retracted.popleft()
            v.kv = kv
            self.waiting.append(v)
            budget = self._allocatable(count_retracted=False, single=False)
            # restore_kv_cache: the backup back onto its new pages, synchronously
            wait = copy_seconds(self.backup, "h2d", self._fill_len(v), self.inst.ctrl.costs,
                                self.sched.p.page_size)  # fmt: skip
            self.inst.ctrl.hold(wait)

    def _pop_preallocated(self) -> None:
        """``pop_preallocated`` without a decode radix cache (decode.py:1448-1617): FIFO, the
        first misfit stops the pass."""
        retractable = self._retractable()
        budget = self._allocatable(count_retracted=True, single=True)
        clip = self.sched.p.clip_max_new_tokens
        ps = self.sched.p.page_size
        while self.queue:
            r = self.queue[0]
            fill = r.dec.input_length
            alloc = -(-fill // ps) * ps  # _required_alloc_tokens (prefix 0)
            # _required_admission_tokens (decode.py:508-517)
            need = max(alloc + self.reserved, fill + min(r.dec.output_length, clip) - retractable)
            if need > budget:  # _prealloc_reservation_fits (allocator/base.py:121-142)
                break
            kv = self._alloc_kv(r.dec, fill)
            if kv is None:
                break
            self.queue.popleft()
            r.kv = kv
            r.prealloc_s = self.env.now
            self.transfer.append(r)
            budget = self._allocatable(count_retracted=True, single=True)
            self.on_preallocated(r)

    def _pop_transferred(self) -> None:
        """``pop_transferred``: the requests whose KV arrived, in transfer-queue order."""
        done = [r for r in self.transfer if r.arrived]
        for r in done:
            self.transfer.remove(r)
            r.dec.kv, r.kv = r.kv, None
            self.waiting.append(r.dec)

    def _merge(self) -> int:
        """``_get_new_prebuilt_batch`` and the merge: up to the running cap
        (``min(req_to_token_pool.size, max_running_requests)``, decode.py:3391-3421)."""
        s = self.sched
        cap = s.p.max_running_requests
        room = cap - len(s.running) if cap else len(self.waiting)
        n = 0
        while self.waiting and n < room:
            self._join(self.waiting.popleft())
            n += 1
        return n

    def _join(self, d: SimReq) -> None:
        """``d`` enters the running batch as a prefill would leave it: its first token out
        (the prefill server's), the KV of its prompt (and of its decoded tokens but the last,
        resumed after a retraction) written."""
        s, now = self.sched, self.env.now
        if d.first_token < 0:
            d.first_token = d.admitted = now
            d.decoded = 1
            r = self._of[d.rid]
            d.device_hit, d.host_hit = r.decode_device_hit, r.decode_host_hit  # 0: no radix
            d.storage_hit = r.decode_storage_hit  # decode-side L3 (sim.pd.decode_l3)
            r.first_token_s = now
        d.kv_tokens = d.fill_len = d.filled = d.input_length + d.decoded - 1
        if d.decoded >= d.output_length:  # one output token: finished by the prebuilt step
            s._finish(d)
            return
        s.running.append(d)
        s.kv_total += d.kv_tokens

    #: No radix cache on this server (SGLang's decode server without
    #: ``--disaggregation-decode-enable-radix-cache`` runs a ChunkCache, pd_disaggregation_hook.py:
    #: 120-127): a finished request's pages are freed, not cached.
    chunk_cache = True

    def finished(self, d: SimReq) -> PdReq:
        """The scheduler finished ``d``: its PD request, now off this server. Without a radix
        cache its pages, which the scheduler's finish inserted into the tree, are freed now (the
        only unlocked pages in the tree are finished requests'), as SGLang's ChunkCache frees
        them: the same decisions (the budget counts evictable pages as free) and the pool use
        SGLang reports."""
        if self.chunk_cache:
            cache = self.sched.cache
            evictable = cache.evictable_size()
            if evictable:
                cache.evict(evictable)
        return self._of.pop(d.rid)

    # ---------------------------------------------------------------------- memory --
    def _retractable(self) -> int:
        """``retractable_tokens``: the running requests' prompt + output tokens."""
        return sum(r.input_length + r.decoded for r in self.sched.running)

    def _fill_len(self, r: SimReq) -> int:
        """``_pre_alloc_fill_len`` (decode.py:947-960): prompt + outputs but the last."""
        return r.input_length + max(r.decoded - 1, 0)

    def _prealloc_required(self, r: SimReq) -> int:
        """``_prealloc_required_tokens`` (decode.py:593-606): page-aligned KV + reserve."""
        ps = self.sched.p.page_size
        return -(-self._fill_len(r) // ps) * ps + self.reserved

    def _allocatable(self, *, count_retracted: bool, single: bool) -> int:
        """``_allocatable_token_budgets`` (decode.py:2083-2137) without a decode radix cache:
        free tokens minus the larger of the reserve of every active request and the one
        running request's headroom (``_need_space_for_single_req``, decode.py:2027-2043; only
        when ``retractable_tokens`` is given), minus the retracted requests' needs. Finished
        requests' pages sit evictable in this server's tree (SGLang frees them): they count as
        free."""
        s = self.sched
        run = s.running
        active = len(run) + len(self.transfer) + len(self.waiting)  # _active_req_count
        reserve = self.reserved * active
        head = 0
        if single and run:
            retractable = self._retractable()
            clip = s.p.clip_max_new_tokens
            head = max(min(r.output_length, clip) + r.input_length - retractable for r in run)
        free = s.dev.available_size() + s.cache.evictable_size()
        budget = free - max(reserve, head)
        if count_retracted:
            budget -= sum(self._prealloc_required(v) for v in self.retracted)
        return budget

    def _alloc_kv(self, d: SimReq, fill: int) -> AnyKV | None:
        """``_pre_alloc``: pages for ``fill`` tokens (evicting cached pages if short), under a
        KV state with no prefix (``prefix_len`` 0: no decode radix cache)."""
        s = self.sched
        life = s.life
        ps = s.p.page_size
        pages = -(-fill // ps)
        got = life.alloc(pages, pages * ps)
        if got is None:
            return None
        prompt = d.prompt
        if prompt is None:
            prompt = d.prompt = life.prompt_key(d.with_symbols())
        root: Any = s.cache.root
        kv: AnyKV
        if isinstance(life, KVLifecycle):
            kv = life.lock(prompt, [], root)
        else:
            kv = life.lock(prompt, [], root, prompt_pages=len(prompt))
        kv.kv += got
        return kv

    def _release(self, kv: AnyKV) -> None:
        """Pages of a request that will not run go back, nothing inserted."""
        life: Any = self.sched.life
        life.abort(kv)
