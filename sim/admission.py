"""The scheduler's admission arithmetic: SGLang's PrefillAdder budgets for one batch, and the
gate that predicts the admission attempts a blocked queue makes between decode steps (both used
by :class:`sim.scheduler.Scheduler`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hicache.policy import HiRadixCache, PageAllocator
from hicache.policy.v0523 import UnifiedRadixCache
from sim.cache_types import AnyCache

if TYPE_CHECKING:
    from sim.scheduler import Scheduler, SchedulerParams, SimReq


class PrefillBudget:
    """SGLang's PrefillAdder budgets for one batch: ``rem_total`` (free + evictable device
    tokens less the running requests' reservations and this batch's), ``rem_input``
    (``max_prefill_tokens``) and ``rem_chunk`` (``chunked_prefill_size``)."""

    __slots__ = (
        "_hi",
        "_reserve",
        "_uni",
        "chunking",
        "clip",
        "dev",
        "offset",
        "rem_chunk",
        "rem_input",
        "reserved",
    )

    def __init__(self, cache: AnyCache, p: SchedulerParams, reserve: Callable[[], float]) -> None:
        """``reserve()``: the running requests' remaining outputs x ``new_token_ratio`` (a sum
        over the batch), asked once, when ``rem_total`` is first read: a batch that stops
        before reading it (a chunk that fills the budget) does not pay for it."""
        self.dev: PageAllocator = cache.controller.device
        # the cache narrowed to its class: rem_total() is read on every admission attempt,
        # and a call through the version union is a dynamic one
        self._hi = cache if isinstance(cache, HiRadixCache) else None
        self._uni = cache if isinstance(cache, UnifiedRadixCache) else None
        self._reserve = reserve
        self.reserved: float | None = None
        self.offset = 0.0  # what this batch's admissions reserved so far
        self.rem_input = p.max_prefill_tokens
        self.chunking = p.chunked_prefill_size > 0
        self.rem_chunk = p.chunked_prefill_size if self.chunking else 1 << 62
        self.clip = p.clip_max_new_tokens

    def rem_total(self) -> float:
        # recomputed each time, as PrefillAdder's property: locks and loads change it
        reserved = self.reserved
        if reserved is None:
            reserved = self.reserved = self._reserve()
        hi = self._hi
        if hi is not None:
            evictable = hi.evictable_size()
        else:
            uni = self._uni
            assert uni is not None
            evictable = uni.evictable_size()
        return self.dev.available_size() + evictable - reserved - self.offset

    def new_tokens(self, req: SimReq) -> int:
        """Output tokens a request may still need, clipped (``clip_max_new_tokens``)."""
        return min(req.output_length - req.decoded, self.clip)

    def take(self, size: int, reserve: float) -> None:
        """Admit ``size`` tokens of prefill that reserve ``reserve`` device tokens."""
        self.offset += reserve
        self.rem_input -= size
        self.rem_chunk -= size


class Gate:
    """The admission attempts a waiting queue makes between decode steps, predicted.

    Made right after the loop's attempt failed: the running cap was reached (no match), the
    device had no room left after the batch's reservations (no match), or the queue head was
    matched and needed more than the room (``total`` tokens; -1 when that match cannot be
    reused). Until a request finishes, the tree changes or a copy completes (the chain checks
    again then), the head's match cannot change, and the room after ``j`` more steps is what
    the loop would compute: free and evictable pages now, less the reservations at the
    ``new_token_ratio`` of that step. The reservations come from one integer sum, checked
    against the loop's own float sum whenever they come within rounding of a threshold."""

    __slots__ = ("big", "cap", "decay", "min_ratio", "n", "ratios", "sched", "sum_r", "ticks",
                 "total")  # fmt: skip

    def __init__(self, sched: Scheduler, cap: bool, total: int, ticks: int) -> None:
        self.sched = sched
        self.cap = cap
        self.total = total
        self.ticks = ticks  # clock ticks of one match of the head
        clip = sched.p.clip_max_new_tokens
        left = [r.output_length - r.decoded for r in sched.running]
        self.n = len(left)
        self.sum_r = sum(left)
        self.big = [x - clip for x in left if x > clip]  # steps each stays clipped
        self.ratios = [sched.new_token_ratio]
        self.min_ratio, self.decay = sched.min_ratio, sched.ratio_decay

    def ratio(self, j: int) -> float:
        """``new_token_ratio`` after ``j`` one-step decode calls (decayed step by step)."""
        rs = self.ratios
        while len(rs) <= j:
            rs.append(max(self.min_ratio, rs[-1] - self.decay * 1))
        return rs[j]

    def check(self, j: int, taken: int = 0) -> int:
        """The loop's attempt after ``j`` more steps, ``taken`` device tokens of page
        boundaries passed on the way allocated by then (not yet now): -1 if it may admit (or
        would match a head whose match cannot be reused): the loop must make it; 0 if it
        fails without matching; 1 if it fails after matching the head."""
        if self.cap:
            return 0
        s = self.sched
        ratio = self.ratio(j)
        owed = self.sum_r - self.n * j
        for over in self.big:
            if over > j:
                owed -= over - j
        room = s.dev.available_size() - taken + s.cache.evictable_size()
        approx = ratio * owed
        margin = 1e-9 * (approx + 1.0)  # far above the float sum's rounding (n ulps)
        rem = room - approx
        total = self.total
        if abs(rem) <= margin or (total >= 0 and abs(total - rem) <= margin):
            rem = room - s._reserved_at(j, ratio) - 0.0  # the loop's own arithmetic
        if not rem > 0:
            return 0
        if total < 0 or total < rem:
            return -1
        return 1
