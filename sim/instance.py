"""One server of a timed run: HBM/DRAM pools (the policy core's allocators), the duplex PCIe
link, the SimController, the cache of the SGLang version (HiRadixCache for 0.5.14,
UnifiedRadixCache for 0.5.23), that version's scheduler and the recorder, on a SimPy
environment that a whole cluster shares (:mod:`sim.engine`).

An :class:`Instance` is also what a router sees of a server (``sim.routers.InstanceView``):
its in-flight request count, its queued prompt tokens, its running KV tokens and, read-only,
how much of a prompt its real cache holds on device and on host.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from hicache.lifecycle import PagedRequest
from hicache.policy import HiRadixCache, PageAllocator
from hicache.policy.allocator import device_pool
from hicache.policy.storage import StageCall
from hicache.policy.v0523 import UnifiedRadixCache
from sim.cache_types import AnyCache
from sim.controller import SimController
from sim.costs import Costs
from sim.link import DuplexLink
from sim.metrics import Recorder, RequestRow, TimelineRow
from sim.reference import ReferenceScheduler, ReferenceScheduler0523
from sim.scheduler import Scheduler, SchedulerParams, SimReq
from sim.scheduler_v0523 import Scheduler0523
from sim.storage import SimStorage
from sim.storage_setup import StorageSetup


class Instance:
    """One server (``index`` in its cluster). ``on_finished`` hears of every request it ends
    (finished or rejected); ``next_arrival`` tells its scheduler when the next arrival is due
    anywhere in the cluster (a decode segment ends there, so admission can run)."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        *,
        device_tokens: int,
        host_tokens: int,
        page_size: int,
        write_policy: str,
        eviction: str,
        costs: Costs,
        sched: SchedulerParams,
        on_finished: Callable[[SimReq], None],
        next_arrival: Callable[[], float],
        timeline_max_rows: int = 20_000,
        load_back_threshold: int = 10,
        storage: StorageSetup | None = None,
        sglang_version: str = "0.5.14",
        eviction_params: dict[str, int] | None = None,
    ) -> None:
        self.env = env
        self.index = index
        self.recorder = Recorder(timeline_max_rows=timeline_max_rows)
        p = page_size
        self.device = device_pool(device_tokens // p, p)
        self.host = PageAllocator(host_tokens // p, p, "host") if host_tokens else None
        self.link = DuplexLink(env, eta={"d2h": costs.eta_d2h, "h2d": costs.eta_h2d},
                               on_change=self._on_link_change)  # fmt: skip
        self.ctrl = SimController(env, self.device, self.host, self.link, costs, self.recorder)
        self.cache: AnyCache
        kind: type[Scheduler]
        if sglang_version == "0.5.14":
            self.cache, kind = (
                HiRadixCache(
                    self.ctrl,
                    write_policy=write_policy,
                    eviction_policy=eviction,
                    load_back_threshold=load_back_threshold,
                ),
                ReferenceScheduler if sched.engine == "reference" else Scheduler,
            )
        else:
            self.cache, kind = (
                UnifiedRadixCache(
                    self.ctrl,
                    write_policy=write_policy,
                    eviction_policy=eviction,
                    eviction_policy_config=eviction_params,
                    load_back_threshold=load_back_threshold,
                ),
                ReferenceScheduler0523 if sched.engine == "reference" else Scheduler0523,
            )
        self.sched = kind(env, self.cache, costs, sched, self.ctrl, self._finished,
                          self._sample, next_arrival)  # fmt: skip
        self._on_finished = on_finished
        self.routed = 0
        self.done = 0
        self.storage: SimStorage | None = None
        if storage is not None:
            self.storage = storage.attach(env, index, self.cache, self.host, device_tokens)
            self.storage.listeners.append(self._on_storage_call)

    # ------------------------------------------------------------------------- requests --
    def admit(self, r: SimReq) -> None:
        """``r`` arrives here now."""
        r.arrival = self.env.now
        self.routed += 1
        need = r.input_length + r.output_length + self.sched.p.page_size
        if r.aborted or need >= self.device.capacity_tokens:
            # its KV could never fit the pool, even alone with an empty cache: SGLang rejects
            # requests longer than its KV pool at arrival; we record it as rejected (finish = -1)
            self._finished(r)
            return
        self.sched.arrive(r)

    def release(self) -> None:
        """After the run: the compiled scheduler's and link's callbacks into this instance and
        its engine replaced by no-ops. mypyc's classes do not show the cycle collector their
        references to bound methods, so while they hold them every compiled run's engine (its
        caches, trees and requests) outlives the run (tests/sim/test_lazy_requests.py)."""
        s = self.sched
        s.on_finish = _ignore
        s.sample = _nothing
        s.next_arrival = _never
        self.link.on_change = None

    def _finished(self, r: SimReq) -> None:
        self.done += 1
        if r.finish < 0:  # rejected at arrival
            r.device_hit = 0
        self.recorder.add_request(
            RequestRow(r.rid, r.arrival, r.admitted, r.first_token, r.finish, r.prefill_s,
                       r.load_stall_s, r.input_length, r.output_length, r.device_hit, r.host_hit,
                       r.host_hit_recomputed, r.computed, r.retractions, r.storage_hit,
                       r.prefetch_wait)
        )  # fmt: skip
        self._on_finished(r)

    def _on_storage_call(self, call: StageCall) -> None:
        # a query, read or backup ended: SGLang's loop sees it at its next iteration (a
        # prefetch may be done, slots or pins released), even when it has nothing to run
        self.sched.notify(storage=call.kind)

    def _on_link_change(self) -> None:
        # a finished copy can unblock admission (pins released at the next check); with an
        # L3 tier its ack also starts a backup at the next iteration, queue or not
        if self.storage is not None:
            self.sched.notify()
        elif self.sched.waiting:
            self.sched.wake()

    def _sample(self) -> None:
        if not self.recorder.due():
            return
        c, dev = self.cache, self.device
        free = dev.available_size()
        tree = c.total_size()
        self.recorder.sample(
            TimelineRow(self.env.now, free, c.evictable_size(), c.protected_size(),
                        dev.capacity_tokens - free - tree,
                        (self.host.capacity_tokens - self.host.available_size()) if self.host
                        else 0,
                        len(self.sched.waiting), len(self.sched.running),
                        self.link.busy_time("d2h"), self.link.busy_time("h2d"))
        )  # fmt: skip

    # ---------------------------------------------------- what a router sees (InstanceView) --
    def in_flight(self) -> int:
        """Requests routed here and not ended yet (the SGLang gateway's "load")."""
        return self.routed - self.done

    def waiting_tokens(self) -> int:
        """Prompt tokens queued here and not yet prefilled."""
        return sum(r.input_length - r.filled for r in self.sched.waiting)

    def running_tokens(self) -> int:
        """KV tokens its running requests hold (with the steps of a decode call in progress that
        have ended, which the requests' own counters receive when the call ends)."""
        s = self.sched
        return s.kv_total + len(s.running) * s.steps_ended()

    def cached_prefix(self, req: PagedRequest) -> tuple[int, int]:
        """``(device, host-only)`` tokens of ``req``'s prompt prefix in this cache, matched as
        admission would (the first ``input_length - 1`` tokens), without touching it."""
        ps = self.sched.p.page_size
        return self.cache.peek_prefix(req.symbols, limit=max(0, req.input_length - 1) // ps * ps)


def _ignore(r: SimReq) -> None:
    """A released scheduler's ``on_finish``."""


def _nothing() -> None:
    """A released scheduler's ``sample``."""


def _never() -> float:
    """A released scheduler's ``next_arrival``: none is due."""
    return math.inf
