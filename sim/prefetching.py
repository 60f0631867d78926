"""The scheduler's part in the L3 tier (mixed into :class:`sim.scheduler.Scheduler`).

SGLang checks a waiting request's prefetch when its admission loop reaches it, skips a request
still prefetching without blocking the queue, and sees copy and storage events at its next
iteration. Here that is: the admission loop with prefetch checks, how long a request was held
back, the wake-ups (a timeout deadline, a copy or storage call that ended) and, inside a chain
of decode steps, the per-step check that SGLang's every iteration would run.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import simpy

from hicache.lifecycle import KVLifecycle
from hicache.policy import HiRadixCache
from sim.cache_types import AnyCache, AnyLife

if TYPE_CHECKING:
    from hicache.policy.storage import PrefetchOp
    from sim.scheduler import CostModel, LinkControl, SchedulerParams, SimReq


class Prefetching:
    """Mixed into ``Scheduler``; uses its queue, cache, lifecycle and wake-up event."""

    env: simpy.Environment
    # either version's cache and lifecycle, declared here only: the compiled Scheduler once
    # annotated ``life`` again in its __init__, and that build leaked a reference, so every
    # engine outlived its run (tests/sim/test_lazy_requests.py catches it)
    cache: AnyCache
    life: AnyLife
    p: SchedulerParams
    cost: CostModel
    ctrl: LinkControl
    waiting: deque[SimReq]
    running: list[SimReq]
    chunked: SimReq | None
    _wake: simpy.Event
    _idle: bool
    _seg: tuple[float, float, float, int] | None
    _check_step: int
    _drain_due: bool

    def wake(self) -> None:
        raise NotImplementedError

    def _hicache_events(self) -> None:
        """``_process_hicache_events``: the cache's events (0.5.23's scheduler adds the L3
        retry pass)."""
        self.cache.check_hicache_events()

    def notify(self, storage: str = "") -> None:
        """A copy or storage call ended (runs with an L3 tier): SGLang's loop sees it at its
        next iteration. Idle: wake now. Inside a chain of decode steps: at the end of the step
        under way, run that iteration's HiCache check (acks start backups, drains release
        slots and pins; a segment with requests waiting is one step, so the loop's own
        admission follows). In a prefill: the loop checks when it ends.

        ``storage``: the kind of a storage call that ended ("" for a copy). Its drain can only
        matter to a waiting request's prefetch check (a query or read; a backup ack only
        releases host pins) or to the next arrival's prefetch, which drains first when the
        loop is idle (:meth:`_enqueue`) and otherwise comes after a step boundary that drains
        (an open-loop arrival cuts a chain of steps there). So those need no wake-up; copy
        acks always do (each starts an L3 backup)."""
        if storage and (storage == "write" or not self.waiting):
            if self._idle:
                self._drain_due = True
            return
        if self._idle:
            self.wake()
            return
        seg = self._seg
        if seg is None:
            return
        start, step0, inc, k = seg
        j = self._steps_until(self.env.now - start, k, step0, inc)
        if j >= k:
            return  # that step ends the segment: the loop runs then
        at = start + j * step0 + inc * j * (j - 1) / 2
        if j == self._check_step:
            return  # already due
        self._check_step = j
        self.env.timeout(max(0.0, at - self.env.now)).callbacks.append(self._step_check)

    def _step_check(self, _event: simpy.Event) -> None:
        j, self._check_step = self._check_step, 0
        if self._seg is None or j == 0:
            return  # the segment it was meant for is over
        self._hicache_events()

    # ----------------------------------------------------------------------------- loop --

    def _l3(self) -> tuple[HiRadixCache, KVLifecycle]:
        """The cache and lifecycle as the L3 tier has them (SGLang 0.5.14's only)."""
        cache, life = self.cache, self.life
        assert isinstance(cache, HiRadixCache) and isinstance(life, KVLifecycle)
        return cache, life

    def _prefetch_checked(self, req: SimReq) -> int:
        """``check_prefetch_progress`` of ``req``, which the admission loop has reached: -1 if
        its prefetch still holds it back (the loop skips it), else the tokens its prefetch
        loaded (the popped credit, taken as the release does: :meth:`_take_credit`)."""
        now = self.env.now
        op = self._prefetch_op(req.rid)
        life, sync = self.life, self.cost.tp_sync_s
        before = life.prefetch_votes() if sync else 0
        credit = life.prefetch_done(req.rid, now)
        if sync and life.prefetch_votes() > before:
            # each vote is a blocking all-reduce on the scheduler thread: this iteration's
            # forward starts that much later (idle, nothing waits for it)
            self.ctrl.hold((life.prefetch_votes() - before) * sync)
        if credit < 0:  # reached, but held back by its prefetch
            if req.prefetch_held < 0:
                req.prefetch_held = now
                req.prefetch_op = op
            return -1
        if req.prefetch_held >= 0:
            req.prefetch_wait += self._held_until(req, now) - req.prefetch_held
            req.prefetch_held = -1.0
        self._take_credit(req, credit)
        return credit

    def _prefetch_op(self, rid: int) -> PrefetchOp | None:
        """The operation of ``rid``'s prefetch in flight (None: none)."""
        entry = self._l3()[0].ongoing_prefetch.get(rid)
        return entry.op if entry is not None else None

    def _take_credit(self, req: SimReq, credit: int) -> None:
        """0.5.14: the popped credit adds to what the request holds."""
        req.storage_credit += credit

    def _after_attempt(self, req: SimReq, credit: int, admitted: bool) -> None:
        """After ``_add_waiting`` tried ``req``. 0.5.14: a credit popped in a pass that did not
        admit is lost in SGLang (D5)."""
        if credit and not admitted:
            cache = self._l3()[0]
            cache.defects["D5"] += 1  # SGLang overwrites the credit with 0 next pass
            cache.defect_tokens["D5"] += credit

    def _op_deadline(self, op: PrefetchOp) -> float | None:
        """When ``op``'s timeout passes (None: no timeout policy)."""
        return self._l3()[0].deadline_of(op)

    def _prefetch_deadline(self, rid: int) -> float | None:
        """When the waiting request ``rid``'s prefetch stops holding it (None: never, by time)."""
        return self._l3()[0].prefetch_deadline(rid)

    def _held_until(self, req: SimReq, now: float) -> float:
        """When ``req``'s prefetch stopped holding it back: its I/O ended or its timeout
        passed (what came after, until admission reached it again, is queueing)."""
        op, req.prefetch_op = req.prefetch_op, None
        if op is None:
            return now
        end = op.done_time if op.done_time >= 0 else now
        deadline = self._op_deadline(op)
        if deadline is not None:
            end = min(end, deadline)
        return max(req.prefetch_held, min(now, end))

    def _wake_at_prefetch_deadline(self) -> None:
        """Idle with requests waiting on their prefetch: wake when the earliest timeout
        expires (stage progress wakes the scheduler through its listener)."""
        if self.cache.storage is None or not self.waiting:
            return
        now = self.env.now
        deadlines = [self._prefetch_deadline(r.rid) for r in self.waiting]
        # a deadline already passed changes nothing until admission reaches that request,
        # which only other events can make happen
        due = min((d for d in deadlines if d is not None and d >= now), default=None)
        if due is None:
            return
        wake = self._wake

        def ring(_event: simpy.Event) -> None:
            if not wake.triggered:
                wake.succeed()

        delay = due - now + 1e-9  # the comparison is strict
        self.env.timeout(delay).callbacks.append(ring)

    @staticmethod
    def _steps_until(elapsed: float, k: int, step0: float, inc: float) -> int:
        """The least j in 1..k whose first j steps (``step0 + i * inc`` each) last at least
        ``elapsed``: the step in progress at ``elapsed`` ends the segment."""
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi) // 2
            if mid * step0 + inc * mid * (mid - 1) / 2 >= elapsed:
                hi = mid
            else:
                lo = mid + 1
        return lo
