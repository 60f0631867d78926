"""The SGLang-like scheduler loop (POLICY_CORE.md §5-§6), as one SimPy process.

Each iteration: process write/load acks; try to form a prefill batch (the chunked request first,
then waiting requests in FCFS order, matched, loaded back and admitted under PrefillAdder's
budgets); otherwise run decode. Time passes only in batch ends, decode segments, blocking
write_back waits and idle waits for arrivals or copy completions.

Simplifications (documented, deliberate):
* no overlap scheduler (results are processed right after each forward);
* mixed prefill+decode batches only with ``enable_mixed_chunk`` (off, as in SGLang);
* decode advances in *segments*: between two page boundaries, finishes or arrivals nothing can
  change a decision, so k steps cost one event (step time is linear in the batch's KV tokens);
* a retracted request re-enters the waiting queue and later re-prefills its prompt plus the
  tokens it had decoded (its outputs are unique tokens, so only the prompt can hit).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import simpy

from hicache.latency import layer_pipeline_end
from hicache.lifecycle import NO_KEY, KVLifecycle, PagedRequest, ReqKV
from hicache.lifecycle_v0523 import ReqKV23
from hicache.policy import HiRadixCache, PageAllocator, PageKey
from hicache.policy.radix import PrefixKey
from hicache.policy.storage import PrefetchOp
from sim.admission import CONTINUE, NO_TOKEN, OTHER, SKIP, PrefillBudget
from sim.cache_types import AnyCache, AnyKV, AnyLife
from sim.link import Job
from sim.params import SchedulerParams as SchedulerParams
from sim.prefetching import Prefetching


class CostModel(Protocol):
    """Timing the scheduler needs (``sim.costs.Costs`` is the one built from the latency
    model)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def tp_sync_s(self) -> float:
        """Seconds of one scheduler-thread all-reduce over the TP group (0 at tp 1)."""
        ...

    def prefill_time(self, reqs: list[tuple[int, int]]) -> float:
        """Seconds for one prefill batch of (new tokens, cached tokens) per request."""
        ...

    def decode_coeffs(self, batch_size: int) -> tuple[float, float]:
        """(a, b): one decode step of this batch takes ``a + b * kv_tokens``."""
        ...


class LinkControl(Protocol):
    """What the scheduler needs from the controller (``sim.controller.SimController``)."""

    def launch_loads(self) -> Job | None:
        """``ready_to_load_host_cache``: launch the batch's queued loads as one job (or None);
        the job's ``done`` event fires when it completes."""
        ...

    def take_stall(self) -> float:
        """Time until which a blocking write_back wait holds the scheduler (then cleared)."""
        ...

    def hold(self, seconds: float) -> None:
        """Block the scheduler ``seconds`` more (a synchronous call on its thread)."""
        ...


@dataclass(eq=False, slots=True)
class SimReq:
    """The scheduler's state of one :class:`~hicache.lifecycle.PagedRequest`: when it really
    arrived (closed-loop turns arrive after their predecessor), its progress and its metrics."""

    req: PagedRequest
    arrival: float = -1.0  # -1: the trace's arrival time
    output_length: int = 0  # tokens to generate (at least 1; set from the request)
    # builds ``req.symbols`` when first needed (None: ``req`` came with them); the keys are
    # dropped again at the finish, so a long trace holds only its live requests' keys
    keys: Callable[[int], PageKey] | None = None
    # SGLang aborts it at arrival: its prompt is over the context limit (traces.context)
    aborted: bool = False
    prompt: PageKey | None = None  # full prompt pages (built at the first need)
    # progress
    kv: AnyKV | None = None
    fill_len: int = 0  # tokens to prefill this admission (prompt, + decoded after retraction)
    filled: int = 0  # tokens prefilled so far in this admission
    decoded: int = 0  # output tokens generated (the prefill produces the first)
    kv_tokens: int = 0  # tokens whose KV is written (prefilled + decoded-and-written)
    out_symbols: list[Hashable] = field(default_factory=list)
    # metrics
    admitted: float = -1.0
    first_token: float = -1.0
    finish: float = -1.0
    device_hit: int = -1
    host_hit: int = 0
    host_hit_recomputed: int = 0
    computed: int = 0
    prefill_s: float = 0.0
    load_stall_s: float = 0.0
    retractions: int = 0
    # L3: when admission first reached it while its prefetch ran (-1: not now), the seconds
    # admission was held back by prefetches in all, its credit until admission, its L3 hit
    prefetch_held: float = -1.0
    prefetch_wait: float = 0.0
    prefetch_op: PrefetchOp | None = None
    storage_credit: int = 0
    storage_hit: int = 0
    # 0.5.23: L3 re-issues so far (``storage_prefetch_retry_attempts``) and the matched length
    # at its last L3 query (``storage_prefetch_last_match_len``; -1: none)
    storage_prefetch_retry_attempts: int = 0
    storage_last_match: int = -1

    def __post_init__(self) -> None:
        if self.arrival < 0:
            self.arrival = self.req.arrival_s
        self.output_length = max(1, self.req.output_length)

    @property
    def rid(self) -> int:
        return self.req.rid

    def with_symbols(self) -> PagedRequest:
        """``req``, its symbols built if they were left for later."""
        if self.keys is not None and not self.req.symbols and self.req.input_length:
            self.req = self.req.with_symbols(self.keys(self.req.rid))
        return self.req

    def release_keys(self) -> None:
        """Finished: drop the keys only a live request needs, if they can be rebuilt."""
        if self.keys is not None:
            self.prompt = None
            self.out_symbols = []
            self.req = self.req.with_symbols(NO_KEY)

    @property
    def input_length(self) -> int:
        return self.req.input_length


class Scheduler(Prefetching):
    def __init__(
        self,
        env: simpy.Environment,
        cache: AnyCache,
        cost: CostModel,
        params: SchedulerParams,
        ctrl: LinkControl,
        on_finish: Callable[[SimReq], None],
        sample: Callable[[], None],
        next_arrival: Callable[[], float],
    ) -> None:
        self.env = env
        self.cache = cache
        # the device pool, typed: the hot paths take its pages without going through either
        # version's cache
        self.dev: PageAllocator = cache.controller.device
        self.life = self._make_life(cache, params.outputs)
        self.cost = cost
        self.p = params
        self.ctrl = ctrl
        self.on_finish = on_finish
        self.sample = sample
        self.next_arrival = next_arrival  # the next known arrival time (inf: none)
        # False where a request may arrive unannounced (a closed-loop turn whose predecessor
        # finished on another instance): a decode segment then listens for arrivals ...
        self.announced = True
        # ... and segments run one per timeout (no _plan_span)
        self.span_ok = True
        self.waiting: deque[SimReq] = deque()
        self.running: list[SimReq] = []
        self.chunked: SimReq | None = None
        init = min(1.0, params.init_new_token_ratio * params.schedule_conservativeness)
        self.init_ratio = init
        self.min_ratio = init * params.min_new_token_ratio_factor
        self.ratio_decay = (init - self.min_ratio) / max(1, params.new_token_ratio_decay_steps)
        self.new_token_ratio = init
        self._wake: simpy.Event = env.event()
        self.spans: list[tuple[str, float, float, int]] = []  # compute: (kind, start, end, bs)
        self.record_spans = True  # False: no compute spans kept (nobody will read them)
        # decode steps a decode call has run but not yet added to the requests' counters
        self.pending_steps = 0
        # the running requests' kv_tokens, summed (kept exact, in integers, as they change)
        self.kv_total = 0
        # L3 runs (notify): idle, the decode segment in progress (start, first step, step
        # growth, steps), the step whose end has a check due, the step to stop a chain after
        self._idle = False
        self._seg: tuple[float, float, float, int] | None = None
        self._check_step = 0
        self._drain_due = False
        # the running batch is full (SGLang's batch_is_full): no admission is tried until a
        # request leaves it; and (0.5.14) the requests that finished in the last decode step,
        # still in the running batch until the next one filters them
        self.batch_is_full = False
        self._unfiltered = 0

    def _make_life(self, cache: AnyCache, outputs: str) -> AnyLife:
        """The request lifecycle on ``cache`` (0.5.14's here; overridden per version)."""
        assert isinstance(cache, HiRadixCache), "Scheduler drives SGLang 0.5.14's cache"
        return KVLifecycle(cache, outputs)

    # ---------------------------------------------------------------------------- inbox --
    def arrive(self, req: SimReq) -> None:
        req.fill_len = req.input_length
        self._enqueue(req)
        self.wake()

    def _enqueue(self, req: SimReq) -> None:
        """``_add_request_to_queue``: with an L3 tier, match and prefetch now."""
        if self.cache.storage is not None:
            if self._drain_due:  # an idle SGLang loop would have drained meanwhile
                self._drain_due = False
                self._hicache_events()
            self.life.prefetch(req.rid, self._fill_key(req), req.fill_len, self.env.now)
        self.waiting.append(req)

    def wake(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def run(self) -> Generator[simpy.Event, Any, None]:
        """``event_loop_normal``: one iteration per forward (the decode call may run several
        steps; ``sim/reference.py`` runs one)."""
        env = self.env
        while True:
            self._hicache_events()
            batch = self._get_new_batch_prefill()
            if batch is not None:
                yield from self._run_prefill(batch)
            elif self.running:
                yield from self._run_decode()
            elif self._unfiltered:  # the batch empties as its finished requests leave
                self._filter_finished()
            else:
                self._on_idle()
                self.sample()
                self._wake = env.event()
                self._wake_at_prefetch_deadline()
                self._idle = True
                yield self._wake
                self._idle = False
                self._drain_due = False  # the loop drains now
            self.sample()

    # ---------------------------------------------------------------------- admission --
    def _reserved(self) -> float:
        return self._reserved_at(0, self.new_token_ratio)

    def _reserved_at(self, steps: int, ratio: float) -> float:
        """The running requests' reservations (PrefillAdder's offset) after ``steps`` more
        decode steps than their counters show, at ``ratio``: the same float operations."""
        clip = self.p.clip_max_new_tokens
        return sum(min(r.output_length - r.decoded - steps, clip) * ratio for r in self.running)

    def _get_new_batch_prefill(self) -> list[tuple[SimReq, int, int]] | None:
        """``get_new_batch_prefill``: returns [(req, extend tokens this batch, cached tokens
        before)] or None. Nothing is tried while the running batch is full (``batch_is_full``:
        set by a NO_TOKEN or the running cap, cleared when a request leaves; SCHEDULER.md §1a),
        unless a chunked prefill goes on."""
        self._before_prefill_attempt()
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        p = self.p
        if self._allocatable() <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        self._calc_priority()
        # the reservations are summed when first read: nothing between here and there
        # changes the running batch or new_token_ratio
        budget = PrefillBudget(self.cache, p, self._reserved, self._mixed_rows())
        batch: list[tuple[SimReq, int, int]] = []
        if self.chunked is not None:
            self._add_chunked(budget, batch)
        self._admit_waiting(budget, batch)
        return batch or None

    def _before_prefill_attempt(self) -> None:
        """What the prefill attempt does first to the running batch's flag (0.5.14: nothing;
        0.5.23 clears it on an empty batch)."""

    def _allocatable(self) -> int:
        """``get_num_allocatable_reqs``: requests the running cap still admits (``1 << 30``:
        no cap). 0.5.14 still counts the requests that finished in the last decode step."""
        cap = self.p.max_running_requests
        return cap - len(self.running) - self._unfiltered if cap else 1 << 30

    def _pass_spent(self, budget: PrefillBudget) -> bool:
        """Whether the loop stops before trying the next request (0.5.14 never does: the head
        is matched and tried even with a spent chunk budget)."""
        return False

    def _admit_waiting(self, budget: PrefillBudget, batch: list[tuple[SimReq, int, int]]) -> None:
        """The loop over the waiting queue (``for req in waiting_queue``): the running cap, the
        L3 prefetch check (a request still prefetching is skipped, not blocking), then
        ``add_one_req``; it stops at the first result but CONTINUE, a NO_TOKEN marking the batch
        full when something runs or was admitted."""
        l3 = self.cache.storage is not None
        i = 0
        while i < len(self.waiting):
            if self._pass_spent(budget):
                break
            if len(batch) >= self._allocatable():
                self.batch_is_full = True
            if self.batch_is_full:
                break
            req = self.waiting[i]
            credit = self._prefetch_checked(req) if l3 else 0
            if credit < 0:  # still prefetching: skipped
                i += 1
                continue
            n = len(self.waiting)
            res = self._add_waiting(budget, batch, req)
            if res == SKIP:
                i += 1
                continue
            if l3:
                self._after_attempt(req, credit, len(self.waiting) < n)
            if res != CONTINUE:
                if res == NO_TOKEN:
                    self.batch_is_full = bool(batch) or bool(self.running) or self._unfiltered > 0
                break

    def _add_chunked(self, budget: PrefillBudget, batch: list[tuple[SimReq, int, int]]) -> None:
        """``add_chunked_req``: the next chunk of the request being prefilled in chunks goes
        first, as long as the chunk budget and the room allow (at least the chunk budget when
        the room is gone: it must make progress), not page-aligned; the final chunk reserves
        the request's outputs."""
        req = self.chunked
        assert req is not None
        left = req.fill_len - req.filled
        rem = min(budget.rem_chunk, int(budget.rem_total()))
        if rem <= 0:
            rem = budget.rem_chunk
        size = min(left, rem)
        batch.append((req, size, req.filled))
        last = size == left
        budget.take(size, budget.max_new(req) if last else 0)
        if last:
            self.chunked = None

    def _add_waiting(
        self, budget: PrefillBudget, batch: list[tuple[SimReq, int, int]], req: SimReq
    ) -> int:
        """``PrefillAdder.add_one_req`` (0.5.14) for ``req``, the waiting request the loop
        reaches: NO_TOKEN, OTHER or (admitted) the budget's state."""
        life = self._v0514()[0]
        ps = self.p.page_size
        key = self._fill_key(req)
        m = life.match(key, req.fill_len)
        dev = m.device_hit_length
        extend = req.fill_len - dev
        total = extend + budget.new_tokens(req) + ps
        if total >= budget.rem_total():
            return NO_TOKEN
        chunking = budget.chunking
        if not chunking and batch and budget.ceil(extend - m.host_hit_length) >= budget.rem_input:
            return OTHER
        life.hold(m.last_device_node)  # temporary lock, as PrefillAdder does
        if total >= budget.rem_total():  # locking shrank the evictable pool
            life.release(m.last_device_node)
            return NO_TOKEN
        prefix, last = life.load_back(m)
        loaded = (len(prefix) - m.device_pages) * ps
        cached = len(prefix) * ps
        extend = req.fill_len - cached
        paged = budget.ceil(extend)
        if not chunking and batch and paged >= budget.rem_input:
            # checked again on the extend after the load (a load below the threshold or short
            # of room leaves more to prefill); a load it started stays in the tree
            life.release(m.last_device_node)
            return OTHER
        # prefix + chunk page-aligned: the prefix is whole pages, so the chunk is too
        size = extend if not chunking or paged <= budget.rem_chunk else budget.rem_chunk // ps * ps
        if size <= 0:
            # SGLang returns OTHER here: the request stays queued (a load it started stays in
            # the tree, pinned until its ack)
            life.release(m.last_device_node)
            return OTHER
        kv = life.lock(key, prefix, last)  # the request's own lock
        life.release(m.last_device_node)
        if self.waiting[0] is req:
            self.waiting.popleft()
        else:
            self.waiting.remove(req)
        if req.device_hit < 0:  # first admission: what the user sees as cached
            req.device_hit = dev
            from_l3 = min(loaded, req.storage_credit)
            req.storage_hit = from_l3
            req.host_hit = loaded - from_l3
            req.host_hit_recomputed = m.host_hit_length - loaded
            req.admitted = self.env.now
            if req.storage_credit and loaded < m.host_hit_length:
                # SGLang's breakdown counts the matched host hit, loaded or not (D6)
                self.cache.defects["D6"] += 1
                self.cache.defect_tokens["D6"] += m.host_hit_length - loaded
        req.storage_credit = 0
        req.kv = kv
        req.filled = cached
        batch.append((req, size, cached))
        if size == extend:
            budget.take(size, budget.max_new(req))
        else:  # truncated: later chunks bring the rest; no outputs reserved yet
            budget.take(size, 0)
            self.chunked = req
        return budget.state()

    def _calc_priority(self) -> None:
        """``calc_priority``: under LPM the waiting queue is sorted (FCFS: kept as it is)."""
        p = self.p
        if p.policy == "lpm" and 1 < len(self.waiting) <= p.lpm_max_queue:
            self._sort_lpm()

    def _v0514(self) -> tuple[KVLifecycle, HiRadixCache]:
        """The lifecycle and cache as 0.5.14's steps take them (this class's own)."""
        life, cache = self.life, self.cache
        assert isinstance(life, KVLifecycle) and isinstance(cache, HiRadixCache)
        return life, cache

    def _checkpoint(self, kv: AnyKV, chunked: bool = False) -> None:
        """``cache_unfinished_req`` of ``kv`` (its key set to what was prefilled)."""
        life = self.life
        if isinstance(life, KVLifecycle):
            assert isinstance(kv, ReqKV)
            life.after_prefill(kv, chunked)
        else:
            assert isinstance(kv, ReqKV23)
            life.after_prefill(kv, chunked=chunked)

    def _release_kv(self, kv: AnyKV) -> None:
        """Retraction: the request's own pages freed, its lock released, nothing inserted."""
        life = self.life
        if isinstance(life, KVLifecycle):
            assert isinstance(kv, ReqKV)
            life.abort(kv)
        else:
            assert isinstance(kv, ReqKV23)
            life.abort(kv)

    def _sort_lpm(self) -> None:
        """Longest prefix match first (stable). Matching every waiting request touches and may
        split nodes, as SGLang's calc_priority does. (SGLang's in-batch prefix dedup is not
        modelled.)"""
        scored = []
        life = self._v0514()[0]
        for r in self.waiting:
            m = life.match(self._fill_key(r), r.fill_len)
            scored.append((-(m.device_hit_length + m.host_hit_length), r))
        scored.sort(key=lambda x: x[0])
        self.waiting = deque(r for _, r in scored)

    def _fill_key(self, req: SimReq) -> PageKey:
        """Paged key of everything to prefill: the prompt, plus decoded tokens after a
        retraction (unique symbols, never matched)."""
        key: PageKey = self.life.extend_key(self._prompt(req), req.out_symbols,
                                            req.fill_len // self.p.page_size)  # fmt: skip
        return key

    def _prompt(self, req: SimReq) -> PageKey:
        """``req``'s prompt key, built at its first need (a queued request that admission has
        not reached yet holds none)."""
        p = req.prompt
        if p is None:
            p = req.prompt = self.life.prompt_key(req.with_symbols())
        return p

    # -------------------------------------------------------------------------- prefill --

    def _run_prefill(
        self, batch: list[tuple[SimReq, int, int]]
    ) -> Generator[simpy.Event, Any, None]:
        env, life, ps = self.env, self.life, self.p.page_size
        # a write_back eviction during admission (load_back) blocked the CPU in its wait for
        # the writes: the batch's loads are launched (ready_to_load_host_cache) after it
        stall = self.ctrl.take_stall()
        if stall > env.now:
            yield env.timeout(stall - env.now)
        load_job = self.ctrl.launch_loads()  # ready_to_load_host_cache
        need_tokens = sum(ext for _, ext, _ in batch) + (len(batch) * ps if ps > 1 else 0)
        for req, ext, _ in batch:
            assert req.kv is not None
            need = -(-(req.filled + ext) // ps) - len(req.kv.kv)
            if need > 0:
                pages = life.alloc(need, need_tokens)
                if pages is None:
                    raise RuntimeError(
                        "device pool exhausted during prefill allocation: the admission budget "
                        "should have prevented this (please report with the config)"
                    )
                req.kv.kv += pages
        decoding = self._mix_with_running()
        start = max(env.now, self.ctrl.take_stall())
        rows = [(ext, cached) for _, ext, cached in batch]
        # a mixed batch's decode rows: one new token each over the KV it holds
        compute = self.cost.prefill_time(rows + [(1, r.kv_tokens) for r in decoding])
        end = start + compute
        if load_job is not None:
            if load_job.end < 0:
                assert load_job.done is not None
                yield load_job.done
            layers = self.cost.num_layers
            piped = layer_pipeline_end(start, compute, layers, load_job.start, load_job.end)
            end = max(end, float(piped))
        if end > env.now:
            yield env.timeout(end - env.now)
        self._span("prefill", start, end, len(batch) + len(decoding))
        stall = end - (start + compute)
        joined: list[SimReq] = []
        for req, ext, _ in batch:
            req.prefill_s += compute
            req.load_stall_s += stall
            req.computed += ext
            req.filled += ext
            assert req.kv is not None
            full = req.filled // ps
            if req.filled < req.fill_len:  # an intermediate chunk
                req.kv.key = PrefixKey(self._fill_key(req), full)
                self._checkpoint(req.kv, chunked=True)
                # the merge at the next iteration drops it from the batch: no longer full
                self.batch_is_full = False
                continue
            req.kv_tokens = req.filled
            if req.first_token < 0:
                req.first_token = env.now
                req.decoded = 1
            else:  # re-prefilled after a retraction: it produces the next token
                req.decoded += 1
            if req.decoded >= req.output_length:
                self._finish(req)
                self.batch_is_full = False  # dropped at the merge, as a chunk is
                continue
            req.kv.key = self._fill_key(req)
            self._checkpoint(req.kv)
            joined.append(req)
            self.kv_total += req.kv_tokens
        if decoding:
            self._end_mixed(joined)
        else:
            self.running += joined

    # ------------------------------------------------------------------ mixed chunk --
    def _mixed_rows(self) -> int:
        """``num_mixed_decode_tokens``: with ``--enable-mixed-chunk`` (and chunked prefill on:
        ``is_mixed_chunk``), the running batch's size, which 0.5.14 still counts its finished
        and unfiltered requests in (scheduler.py:2743, 2786; 0.5.23 4103, 4165)."""
        p = self.p
        if not p.enable_mixed_chunk or p.chunked_prefill_size <= 0:
            return 0
        return len(self.running) + self._unfiltered

    def _mix_with_running(self) -> list[SimReq]:
        """The mixed-chunk step after the batch's extend pages are taken (0.5.14
        scheduler.py:2946-2962, 0.5.23 4376-4411): the finished requests leave the running
        batch (``filter_batch``; the flag kept), then each running request's next token gets
        its page (``prepare_for_decode``) and the requests ride in this forward as one-token
        rows. 0.5.23 first checks the decode memory (``check_decode_mem``, evicting the
        shortfall) and, short of room, leaves them out of this step; 0.5.14 allocates
        without a check. Returns the requests mixed in (none: a plain prefill)."""
        if not self._mixed_rows():
            return []
        self._unfiltered = 0
        run, ps = self.running, self.p.page_size
        if not run:
            return []
        at_boundary = [r for r in run if r.kv_tokens % ps == 0]
        if not isinstance(self.cache, HiRadixCache):  # 0.5.23's check_decode_mem
            need = ps * len(at_boundary)
            self._evict_for_decode(need)
            if self.dev.available_size() < need:
                return []  # they sit this step out and decode at the next decode step
        if not self._alloc_decode(at_boundary):
            raise RuntimeError(
                "device pool exhausted by a mixed-chunk decode allocation (SGLang 0.5.14 "
                "allocates it without a check and fails the same way)"
            )
        return list(run)

    def _alloc_decode(self, at_boundary: list[SimReq]) -> bool:
        """``alloc_for_decode`` for the running batch (0.5.14 mem_cache/common.py:574-604,
        0.5.23 mem_cache/allocation.py:572-585): evict for one page per running request (the
        over-estimate ``len(seq_lens) * page_size``; 0.5.14 the whole of it when fewer are
        free, 0.5.23 the shortfall), then a page for each request at a page boundary. False
        when the pages are not there (SGLang raises)."""
        self._evict_for_decode(len(self.running) * self.p.page_size)
        if self.dev.available_size() < self.p.page_size * len(at_boundary):
            return False
        for r in at_boundary:
            self._new_page(r)
        return True

    def _end_mixed(self, joined: list[SimReq]) -> None:
        """``process_batch_result_prefill`` for the decode rows of a mixed batch (their token
        appended, the finished released after the new requests, in batch order), then the
        merge: the mixed batch becomes the running batch, its new requests first and its
        flag clear (``get_next_batch_to_run``: 0.5.14 scheduler.py:2607-2625, 0.5.23
        3947-3960: the filtered mixed batch replaces the emptied running batch)."""
        survivors = []
        for r in self.running:
            r.decoded += 1
            r.kv_tokens += 1
            self.kv_total += 1
            if r.decoded >= r.output_length:
                self.kv_total -= r.kv_tokens
                self._finish(r)
            else:
                survivors.append(r)
        self.running = joined + survivors
        self.batch_is_full = False

    # --------------------------------------------------------------------------- decode --
    def _run_decode(self, chain: bool = True) -> Generator[simpy.Event, Any, None]:
        """``update_running_batch`` and decode steps, in segments: runs of steps in which
        nothing can change a decision.

        The call starts as SGLang's does: the running batch drops the requests that finished
        (0.5.14), the write acks are flushed and the memory check runs (``check_decode_mem``: a
        request whose written KV fills whole pages needs a page now; short of pages, evict,
        then retract). With admission possible at the next iteration (requests waiting and the
        batch not full, or a chunked prefill going on) the call is one step. Otherwise nothing
        the loop would do between two steps reads the queue, so a segment runs to the next page
        boundary or finish, and stops before the step that would cross the next known arrival
        (open loop, or a closed-loop turn whose predecessor finished); an arrival nobody
        announced (a turn whose predecessor finished on another instance) wakes it, and the
        step under way ends it. Consecutive segments then follow inside this call exactly as
        the loop would run them, while nobody finishes, no arrival cut a segment and the free
        pages cover each boundary (the memory check would neither evict nor retract): same
        events, times and page order, but each request's counters move once per call (a heap
        finds the requests at each boundary). With open-loop arrivals and no L3 tier several
        segments run under one timeout (:meth:`_plan_span`). ``chain`` False: one segment
        (tests drive the scheduler segment by segment). ``sim/reference.py`` runs the same
        steps one per event; the differential test holds the two equal."""
        env, cache, ps = self.env, self.cache, self.p.page_size
        self._filter_finished()
        cache.writing_check()  # flush_write_through_acks
        run = self.running
        at_boundary, retracted = self._check_decode_mem()
        taken = self._alloc_decode(at_boundary)
        assert taken, "check_decode_mem left the pages of the requests at a boundary"
        owed = 1 if retracted else 0  # a step that retracted does not decay the ratio
        bs = len(run)
        a, b = self.cost.decode_coeffs(bs)
        kv0 = self.kv_total
        # fewer pages free than the batch's over-estimate: the next step's allocation evicts
        # again, so that step is a call of its own
        queued = self._queued() or self.dev.available_size() < bs * ps
        finish = 1 if queued else min(r.output_length - r.decoded for r in run)
        # nothing else reads the pool or the tree until the chain ends: several segments run
        # under one timeout (_plan_span)
        span = chain and self.span_ok and not queued and cache.storage is None
        # (steps from now to the request's next page boundary, its index in the batch)
        bounds = [] if queued else [(ps - r.kv_tokens % ps, i) for i, r in enumerate(run)]
        heapq.heapify(bounds)
        done = 0
        while True:
            if done:
                self._hicache_events()  # what the loop runs first at that iteration
                cache.writing_check()
                if not self._next_boundary_pages(bounds, done):
                    break
            if span:
                segs, cut = self._plan_span(bounds, done, finish, a, b, kv0, bs)
                yield env.timeout(segs[-1][1] - env.now)
                for start, end, k in segs:  # what the segments' own calls would leave
                    self._decay(k - owed)
                    owed = 0
                    self._span("decode", start, end, bs)
                    done += k
                self.pending_steps = done
                if done >= finish or cut or self._queued():
                    break  # as after any segment (an arrival may have come meanwhile)
                continue
            k = 1 if queued else min(finish - done, bounds[0][0] - done)
            step0 = a + b * (kv0 + bs * done)
            start = max(env.now, self.ctrl.take_stall())
            cut = False
            if not queued:  # stop before the step that would cross the next known arrival
                budget = self.next_arrival() - start
                kk, t = 1, step0
                while kk < k and t + step0 + b * bs * kk <= budget:
                    t += step0 + b * bs * kk
                    kk += 1
                cut, k = kk < k, kk
            end = start + (k * step0 + b * bs * k * (k - 1) / 2)  # steps a + b*(kv0 + j*bs)
            self._seg = (start, step0, b * bs, k)
            if self.announced or queued:
                yield env.timeout(end - env.now)
            else:  # an unannounced arrival may come: listen for its wake-up
                wake = self._wake = env.event()
                seg = env.timeout(end - env.now)
                got = yield seg | wake
                if seg not in got:  # woken mid-segment: the step under way ends, then stop
                    k = self._steps_until(env.now - start, k, step0, b * bs)
                    end = start + (k * step0 + b * bs * k * (k - 1) / 2)
                    cut = True
                    if end > env.now:
                        yield env.timeout(end - env.now)
            self._seg = None
            self._check_step = 0
            self._decay(k - owed)
            owed = 0
            self._span("decode", start, end, bs)
            done += k
            self.pending_steps = done
            if not chain or queued or done >= finish or cut or self._queued():
                break
        self._end_decode(done, bs)

    def _on_idle(self) -> None:
        """``on_idle``: fully idle (nothing running, waiting or chunked), the ratio is reset."""
        if not self.waiting and self.chunked is None:
            self.new_token_ratio = self.init_ratio

    def _queued(self) -> bool:
        """Whether the next iteration may admit: requests wait and the batch is not full, or a
        chunked prefill goes on."""
        return (bool(self.waiting) and not self.batch_is_full) or self.chunked is not None

    def _end_decode(self, done: int, bs: int) -> None:
        """``process_batch_result_decode`` for ``done`` steps at once: every running request's
        counters, then the finished ones released in batch order."""
        run = self.running
        self.pending_steps = 0
        self.kv_total += bs * done
        left = 0
        for r in list(run):
            r.decoded += done
            r.kv_tokens += done
            if r.decoded >= r.output_length:
                run.remove(r)
                self.kv_total -= r.kv_tokens
                self._finish(r)
                left += 1
        self._left(left)

    def _left(self, n: int) -> None:
        """``n`` requests finished in the last decode step. 0.5.14 filters them out of the
        running batch only at the next ``update_running_batch``: until then they count for the
        running cap and keep the batch full."""
        self._unfiltered += n

    def _filter_finished(self) -> None:
        """``update_running_batch``'s ``filter_batch`` (0.5.14): the finished requests leave
        the running batch, which is then no longer full."""
        if self._unfiltered:
            self._unfiltered = 0
            self.batch_is_full = False

    def steps_ended(self) -> int:
        """The decode steps of the call in progress that have ended by now (what a router
        reading this instance sees added to the running requests): those of its earlier
        segments, and of the segment under way those whose end has passed."""
        n = self.pending_steps
        seg = self._seg
        if seg is None:
            return n
        start, step0, inc, k = seg
        elapsed = self.env.now - start
        if elapsed <= 0:
            return n
        j = self._steps_until(elapsed, k, step0, inc)  # the step under way (or just ended)
        return n + (j if j * step0 + inc * j * (j - 1) / 2 <= elapsed else j - 1)

    def _check_decode_mem(self) -> tuple[list[SimReq], bool]:
        """``check_decode_mem`` and ``retract_decode``: a request whose written KV fills whole
        pages needs a page now; short of pages, evict; still short, retract (the request with
        the fewest outputs, ties: the longest prompt, then the last in the batch), each
        retraction followed by an eviction for 20 tokens per request left and the check again,
        until the pages fit; then ``new_token_ratio`` is re-estimated from the requests left.
        Returns the requests at a page boundary and whether any was retracted."""
        ps, run = self.p.page_size, self.running
        dev = self.dev
        at_boundary = [r for r in run if r.kv_tokens % ps == 0]
        need = ps * len(at_boundary)
        if not need:
            return at_boundary, False
        self._evict_for_decode(need)
        if dev.available_size() >= need:
            return at_boundary, False
        while len(run) > 1:
            self._retract_one()
            self._evict_for_decode(self.p.retract_decode_steps * len(run))  # release_req
            at_boundary = [r for r in run if r.kv_tokens % ps == 0]
            need = ps * len(at_boundary)
            self._evict_for_decode(need)  # check_decode_mem of the requests left
            if dev.available_size() >= need:
                break
        if dev.available_size() < need:
            raise RuntimeError(
                "device pool cannot hold even one decoding request (device_tokens too small "
                "for this trace's longest request)"
            )
        # estimate_new_token_ratio_after_retract (max_new_tokens not clipped)
        decoded = sum(r.decoded for r in run)
        budget = sum(r.output_length for r in run)
        steps = self.p.retract_decode_steps
        self.new_token_ratio = min(1.0, (decoded + steps * len(run)) / (budget + 1))
        return at_boundary, True

    def _evict_for_decode(self, num_tokens: int) -> None:
        """``evict_from_tree_cache``: 0.5.14 evicts the whole ``num_tokens`` when fewer are
        free."""
        if self.dev.available_size() < num_tokens:
            self.cache.evict(num_tokens)

    def _new_page(self, r: SimReq) -> None:
        page = self.dev.alloc_pages(1)
        assert page is not None and r.kv is not None
        r.kv.kv += page

    def _next_boundary_pages(self, bounds: list[tuple[int, int]], done: int) -> bool:
        """Between two segments of one decode call: what the scheduler loop runs first (the
        HiCache events, the write-through acks), then the memory check of the requests at a
        page boundary after ``done`` steps. True when their pages were taken (in batch order,
        as the check does); False when the free pages fall short (the check would evict or
        retract) or would leave fewer than one page per running request (the allocation's
        over-estimate, :meth:`_alloc_decode`, would evict at a later step): the caller stops,
        and the next call runs the check and the allocation in full."""
        cache, ps = self.cache, self.p.page_size
        cache.check_hicache_events()
        cache.writing_check()
        at = []
        while bounds and bounds[0][0] == done:
            at.append(heapq.heappop(bounds)[1])  # (step, index) order: batch order
        # the step after this one allocates for one page per request (alloc_for_decode)
        # and would evict if fewer were left free
        if self.dev.available_size() < ps * (len(at) + len(self.running)):
            return False
        for i in at:
            heapq.heappush(bounds, (done + ps, i))
            self._new_page(self.running[i])
        return True

    def _plan_span(
        self,
        bounds: list[tuple[int, int]],
        done: int,
        finish: int,
        a: float,
        b: float,
        kv0: int,
        bs: int,
    ) -> tuple[list[tuple[float, float, int]], bool]:
        """Consecutive segments of an empty-queue chain after ``done`` steps, as one segment
        per call would run them: each to the next page boundary or finish, cut before the
        next arrival, its start and end reached with the same float operations (the end of
        one is where its timeout from the last lands). Between two of them that call would
        only take the boundary's pages (taken here, in its order). Stops at a cut, the
        finish, a boundary whose pages the free pool does not cover, once an arrival may be
        due, or where one timeout from now would not land exactly. Returns the segments
        ``(start, end, steps)`` and whether the last was cut."""  # fmt: skip
        env, ps = self.env, self.p.page_size
        t0 = env.now
        start = max(t0, self.ctrl.take_stall())
        arrival = self.next_arrival()
        near = arrival - 1e-9 * (abs(arrival) + 1.0)
        free = self.dev.free_page_count()
        heap = list(bounds)  # a heap already: a copy to walk ahead
        bb = b * bs
        segs: list[tuple[float, float, int]] = []
        t, d, taken, cut = t0, done, 0, False
        while True:
            k = min(finish - d, heap[0][0] - d)
            step0 = a + b * (kv0 + bs * d)
            budget = arrival - start
            kk, acc = 1, step0
            while kk < k and acc + step0 + bb * kk <= budget:
                acc += step0 + bb * kk
                kk += 1
            end = start + (kk * step0 + bb * kk * (kk - 1) / 2)
            t_next = t + (end - t)  # where that call's timeout lands
            # a later segment joins only if it ends before the next arrival, where a router
            # may read the steps done so far (an arrival's own timeout may land an ulp before
            # its nominal time: well before), and one timeout from now lands on its end
            if segs and (t_next >= near or t0 + (end - t0) != t_next):
                break
            segs.append((start, end, kk))
            cut = kk < k
            d += kk
            if cut or d >= finish or t_next >= near:
                break
            at = _pass_boundary(heap, d, ps)  # the memory check at this boundary
            if taken + at + bs > free:
                break  # short (or the next allocation would evict): the loop's own check
            taken += at
            start = t = t_next
        self._take_boundary_pages(bounds, d)
        return segs, cut

    def _take_boundary_pages(self, bounds: list[tuple[int, int]], end: int) -> list[int]:
        """The pages of the boundaries before step ``end`` (one per request at each), in the
        memory checks' order: by step, then batch order (the planner saw they fit). Returns
        those boundaries' steps."""
        ps, running = self.p.page_size, self.running
        steps: list[int] = []
        while bounds[0][0] < end:
            step, i = bounds[0]
            heapq.heapreplace(bounds, (step + ps, i))
            self._new_page(running[i])
            if not steps or steps[-1] != step:
                steps.append(step)
        return steps

    def _retract_one(self) -> None:
        """``retract_decode``'s pop and ``release_req``: the victim leaves the batch, its KV is
        released without an insert, and it goes back to the waiting queue."""
        run = self.running
        # the last of the stable descending sort: on ties the last in batch order
        victim = min(reversed(run), key=lambda r: (r.decoded, -r.input_length))
        run.remove(victim)
        self.kv_total -= victim.kv_tokens
        assert victim.kv is not None
        self._release_kv(victim.kv)
        victim.kv = None
        victim.retractions += 1
        victim.fill_len = victim.input_length + victim.decoded
        victim.filled = 0
        self.batch_is_full = False  # the batch shrank
        self._enqueue(victim)

    def _span(self, kind: str, start: float, end: float, bs: int) -> None:
        """Record a compute span, if this run keeps them (``record_spans``)."""
        if self.record_spans:
            self.spans.append((kind, start, end, bs))

    def _decay(self, steps: int) -> None:
        """``new_token_ratio`` after ``steps`` decode steps: SGLang's ``decay_step`` once per
        step (``max(cur - decay, min)``), the same float subtractions."""
        r, lo, d = self.new_token_ratio, self.min_ratio, self.ratio_decay
        for _ in range(steps):
            if r <= lo:
                break
            r = max(r - d, lo)
        self.new_token_ratio = r

    def _finish(self, req: SimReq) -> None:
        assert req.kv is not None
        req.finish = self.env.now
        # the KV of prompt + outputs but the last token (SGLang's kv_committed_len)
        life, kv = self.life, req.kv
        if isinstance(life, KVLifecycle):
            assert isinstance(kv, ReqKV)
            life.finish(kv, self._prompt(req), req.out_symbols, req.kv_tokens)
        else:
            assert isinstance(kv, ReqKV23)
            life.finish(kv, self._prompt(req), req.out_symbols, req.kv_tokens)
        req.kv = None
        req.release_keys()
        self.on_finish(req)


def _pass_boundary(heap: list[tuple[int, int]], step: int, page_size: int) -> int:
    """Move every request whose page boundary is at ``step`` in ``heap`` (a planner's copy of
    the decode call's boundaries) on to its next one; returns how many pages that boundary
    takes (one per request there)."""
    n = 0
    while heap[0][0] == step:
        i = heap[0][1]
        heapq.heapreplace(heap, (step + page_size, i))
        n += 1
    return n
