"""The scheduler's admission arithmetic: SGLang's PrefillAdder budgets for one batch and what
admitting one request returns (used by :class:`sim.scheduler.Scheduler`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hicache.policy import HiRadixCache, PageAllocator
from hicache.policy.v0523 import UnifiedRadixCache
from sim.cache_types import AnyCache

if TYPE_CHECKING:
    from sim.scheduler import SchedulerParams, SimReq


#: ``AddReqResult``: what admitting one request returned (SGLang's names and meanings), plus
#: SKIP: not tried, the loop goes on to the next request (0.5.23's device-hit-loss re-query).
CONTINUE, NO_TOKEN, OTHER, SKIP = 0, 1, 2, 3


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
        "page_size",
        "rem_chunk",
        "rem_input",
        "reserved",
    )

    def __init__(
        self, cache: AnyCache, p: SchedulerParams, reserve: Callable[[], float], mixed: int = 0
    ) -> None:
        """``reserve()``: the running requests' remaining outputs x ``new_token_ratio`` (a sum
        over the batch), asked once, when ``rem_total`` is first read: a batch that stops
        before reading it (a chunk that fills the budget) does not pay for it. ``mixed``:
        ``num_mixed_decode_tokens``, the running requests a mixed-chunk batch will carry
        (one token each, taken from every budget: 0.5.14 schedule_policy.py:449-459, 0.5.23
        :638-657)."""
        self.dev: PageAllocator = cache.controller.device
        # the cache narrowed to its class: rem_total() is read on every admission attempt,
        # and a call through the version union is a dynamic one
        self._hi = cache if isinstance(cache, HiRadixCache) else None
        self._uni = cache if isinstance(cache, UnifiedRadixCache) else None
        self._reserve = reserve
        self.reserved: float | None = None
        self.offset = float(mixed)  # what this batch's admissions reserved so far
        self.rem_input = p.max_prefill_tokens - mixed
        self.chunking = p.chunked_prefill_size > 0
        self.rem_chunk = p.chunked_prefill_size - mixed if self.chunking else 1 << 62
        self.clip = p.clip_max_new_tokens
        self.page_size = p.page_size

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

    def state(self) -> int:
        """``budget_state``: NO_TOKEN when the room is gone, OTHER when the prefill or chunk
        budget is, else CONTINUE. (SGLang also checks the room without the outputs' reservations;
        it is never below the room with them, so the first test covers it.)"""
        if self.rem_total() <= 0:
            return NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return OTHER
        return CONTINUE

    def new_tokens(self, req: SimReq) -> int:
        """Output tokens a request may still need, clipped (``clip_max_new_tokens``): what
        ``add_one_req`` checks against the room."""
        return min(req.output_length - req.decoded, self.clip)

    def max_new(self, req: SimReq) -> int:
        """``min(max_new_tokens, CLIP_MAX_NEW_TOKENS)``: what an admitted whole request or final
        chunk reserves (its outputs so far not subtracted: a retracted request reserves its
        whole clipped budget again)."""
        return min(req.output_length, self.clip)

    def ceil(self, tokens: int) -> int:
        """``ceil_paged_tokens``: ``tokens`` rounded up to whole pages."""
        ps = self.page_size
        return -(-tokens // ps) * ps

    def take(self, extend: int, max_new: int) -> None:
        """``_update_prefill_budget``: a prefill of ``extend`` tokens admitted, reserving its
        pages, one page of alignment overhead and ``max_new`` output tokens; the prefill and
        chunk budgets are charged whole pages."""
        e = self.ceil(extend)
        self.offset += e + max_new + self.page_size
        self.rem_input -= e
        self.rem_chunk -= e
