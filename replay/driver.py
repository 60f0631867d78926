"""The trace replay's driver: requests through the policy core, in batches, on real copies.

:class:`TraceReplayer` is sequential, like ``sim.hitrate.CacheReplay``, but serves requests in
*batches*: consecutive requests up to a prefill token budget (the scheduler's
``max_prefill_tokens``, as SGLang's PrefillAdder), a request cap and the device memory left.
Per batch:

1. match every request and load back its host hit (``init_load_back``); the batch's loads then
   go out as **one** merged layer-by-layer load (``ready_to_load_host_cache``), as SGLang does;
2. per request: allocate the rest of the prompt (evicting if short), insert it
   (``cache_unfinished_req``: write-through backups are issued here);
3. per request: allocate the outputs' KV, insert at finish (``cache_finished_req``).

Before each ``writing_check`` / ``loading_check`` the driver waits for the copies in flight, so
every decision equals the cache-only replay's (with one request per batch the hit counts are
exactly ``sim.hitrate``'s, which a test checks) and ops of the two directions never overlap. It
does **not** reproduce the timed engine's scheduling (arrivals, decode interleaving, chunked
prefill, retraction): the point is the cost of each copy op of the shapes the policy produces,
not end-to-end latency. Compute is not executed.

With ``verify`` every computed page is stamped with a value derived from its key prefix, and
every matched or loaded prefix is checked against the stamps (an ``AssertionError`` names the
request): a test that the copies move the right bytes to the right pages in both layouts.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from hicache.lifecycle import (
    Admitted,
    CacheCounters,
    KVLifecycle,
    PagedRequest,
    ReqKV,
    paged_requests,
)
from hicache.policy import HiRadixCache, PageKey
from replay.controller import TorchController

_MASK = (1 << 62) - 1


def trace_requests(trace: Any, page_size: int, limit: int = 0) -> list[PagedRequest]:
    """The requests of a ``traces.schema.Trace`` (first ``limit`` if > 0), in file order."""
    return paged_requests(trace, page_size, limit=limit)


@dataclass
class ReplayResult(CacheCounters):
    """The cache counters of a replay (:class:`hicache.lifecycle.CacheCounters`, the same as
    the cache-only replay's), plus batches served and pages whose bytes were verified."""

    batches: int = 0
    verified_pages: int = 0


def _stamps(key: Sequence[Hashable], upto: int) -> list[int]:
    # a page's KV depends on every token before it: a rolling hash of the key prefix
    out, h = [], 0
    for s in key[:upto]:
        h = hash((h, s)) & _MASK
        out.append(h)
    return out


@dataclass
class _Live:
    r: PagedRequest
    key: PageKey
    adm: Admitted

    @property
    def req(self) -> ReqKV:
        return self.adm.kv


class TraceReplayer:
    """Serves batches of requests through a :class:`HiRadixCache` on ``ctrl`` (see the module
    docstring). ``outputs``: ``"cache"`` inserts prompt + outputs at finish, ``"skip"`` the
    prompt only (as ``sim.hitrate``)."""

    def __init__(
        self,
        ctrl: TorchController,
        *,
        write_policy: str = "write_through",
        eviction: str = "lru",
        outputs: str = "cache",
        load_back_threshold: int = 10,
        verify: bool = False,
        forward: Callable[[], None] | None = None,
        sglang_version: str = "0.5.14",
    ) -> None:
        """``sglang_version``: whose cache decides (0.5.23: ``UnifiedRadixCache``, its merged
        device->host writes submitted once per batch result, its load acks drained with the
        step's events)."""
        self.ctrl = ctrl
        self.v0523 = sglang_version != "0.5.14"
        self.cache: Any
        if self.v0523:
            from hicache.lifecycle_v0523 import KVLifecycle0523
            from hicache.policy.v0523 import UnifiedRadixCache

            self.cache = UnifiedRadixCache(
                ctrl,
                write_policy=write_policy,
                eviction_policy=eviction,
                load_back_threshold=load_back_threshold,
            )
            self.life: Any = KVLifecycle0523(self.cache, outputs)
        else:
            self.cache = HiRadixCache(
                ctrl,
                write_policy=write_policy,
                eviction_policy=eviction,
                load_back_threshold=load_back_threshold,
            )
            self.life = KVLifecycle(self.cache, outputs)
        self.p = ctrl.page_size
        self.outputs = outputs
        self.verify = verify
        # stands in for a forward pass's effect on the caches (the replay does not run the
        # model): called before a batch's loads, before its prefill writes and before the
        # writes at its requests' finish
        self._forward = forward or (lambda: None)
        self.result = ReplayResult()

    def _check(self, live: _Live) -> None:
        n = len(live.req.kv)
        if not n:
            return
        ok = self.ctrl.pools.device_stamps_ok(live.req.kv, _stamps(live.key, n))
        if not ok:
            raise AssertionError(
                f"request {self.result.requests}: the KV of its {n}-page prefix is not what was "
                "computed for it (a copy moved the wrong bytes)"
            )
        self.result.verified_pages += n

    def _stamp(self, pages: list[int], key: Sequence[Hashable], first: int) -> None:
        if self.verify and pages:
            vals = _stamps(key, first + len(pages))[first:]
            self.ctrl.pools.stamp_device(pages, vals)

    def _sync(self) -> None:
        self.ctrl.synchronize()

    def run(
        self,
        reqs: Sequence[PagedRequest],
        max_tokens: int = 0,
        max_requests: int = 1,
        progress: bool | None = False,
    ) -> ReplayResult:
        """Serve ``reqs`` in order, in batches (module docstring), and :meth:`finish`.

        ``progress``: a bar over requests on stderr (None: only on a terminal; none either
        without tqdm, which a GPU image may lack).

        A batch takes the next request while its prompt tokens stay within ``max_tokens``, it
        has fewer than ``max_requests`` requests, and the request's prompt + outputs + one page
        fit in what is free or evictable on the device less what the batch has already
        reserved (SGLang's PrefillAdder budget, simplified). The first request of a batch is
        always taken, so ``max_tokens <= 0`` or ``max_requests <= 1`` serves one at a time.
        """
        bar_type: Any = None
        if progress is not False:
            with contextlib.suppress(ImportError):  # the device check's GPU image has no tqdm
                bar_type = importlib.import_module("tqdm").tqdm
        if bar_type is None:
            self._batches(reqs, max_tokens, max_requests, lambda n: None)
        else:
            # tqdm's disable=None: a bar only when stderr is a terminal
            disable = None if progress is None else False
            with bar_type(total=len(reqs), desc="replay", unit="req", disable=disable) as bar:
                self._batches(reqs, max_tokens, max_requests, bar.update)
        return self.finish()

    def _batches(
        self,
        reqs: Sequence[PagedRequest],
        max_tokens: int,
        max_requests: int,
        done: Callable[[int], object],
    ) -> None:
        cache, p, dev = self.cache, self.p, self.ctrl.device
        i = 0
        while i < len(reqs):
            admitted: list[_Live] = []
            tokens = reserved = 0
            while i < len(reqs):
                r = reqs[i]
                if admitted:
                    if len(admitted) >= max_requests or tokens + r.input_length > max_tokens:
                        break
                    room = dev.available_size() + cache.evictable_size() - reserved
                    if r.input_length + r.output_length + p > room:
                        break
                a = self._admit(r)
                admitted.append(a)
                i += 1
                tokens += r.input_length
                reserved += r.input_length - len(a.req.kv) * p + r.output_length + p
            self.serve(admitted)
            done(len(admitted))

    def _admit(self, r: PagedRequest) -> _Live:
        """Match ``r`` and queue the load of its host hit (step 1 for one request)."""
        res = self.result
        res.requests += 1
        res.prompt_tokens += r.input_length
        key = self.life.prompt_key(r)
        return _Live(r, key, self.life.admit(key, r.input_length))

    def serve(self, admitted: Sequence[_Live]) -> None:
        """Steps 1 (the merged load) to 3 for a batch of admitted requests."""
        if self.v0523:
            self._serve_0523(admitted)
            return
        cache, res = self.cache, self.result
        res.batches += 1
        self._forward()  # the previous batch's forward pass
        if any(a.adm.loaded_pages for a in admitted):
            cache.ready_to_load_host_cache()
            self._sync()
            cache.loading_check()
        if self.verify:
            for a in admitted:
                self._check(a)
        self._forward()  # this batch's prefill, which produces the KV its writes copy
        prefilled = []
        for a in admitted:
            have = len(a.req.kv)
            pages = self.life.alloc_prompt(a.req, a.r.input_length)
            if pages is None:
                res.oom_requests += 1
                continue
            self._stamp(pages[: max(0, len(a.key) - have)], a.key, have)
            self.life.after_prefill(a.req)
            self._sync()
            cache.writing_check()
            prefilled.append(a)
        if prefilled:
            self._forward()  # the decode steps between a request's prefill and its finish
        for a in prefilled:
            self._finish(a)

    def _serve_0523(self, admitted: Sequence[_Live]) -> None:
        """One batch as SGLang 0.5.23's loop runs it: the merged load goes out before the
        prefill and its ack is drained with the step's events after the batch result; the
        prompt inserts' backups go out as one merged copy at that result
        (``check_hicache_events`` submits, then drains), and the finishes' likewise."""
        cache, res, life = self.cache, self.result, self.life
        res.batches += 1
        self._forward()  # the previous batch's forward pass
        if any(a.adm.loaded_pages for a in admitted):
            cache.ready_to_load_host_cache()
            self._sync()
        if self.verify:
            for a in admitted:
                self._check(a)
        self._forward()  # this batch's prefill
        prefilled = []
        for a in admitted:
            have = len(a.req.kv)
            if not life.reserve_prompt(a.req, a.r.input_length):
                res.oom_requests += 1
                continue
            self._stamp(a.req.kv[have : max(have, len(a.key))], a.key, have)
            a.req.key = a.key
            life.after_prefill(a.req, len(a.key))
            prefilled.append(a)
        cache.flush_pending_backups()
        self._sync()
        cache.check_hicache_events()
        if prefilled:
            self._forward()  # the decode steps between a request's prefill and its finish
        for a in prefilled:
            self._finish(a, events=False)
        cache.flush_pending_backups()
        self._sync()
        cache.check_hicache_events()

    def _finish(self, a: _Live, events: bool = True) -> None:
        life, p, res, req = self.life, self.p, self.result, a.req
        total = a.r.kv_tokens
        if life.alloc_outputs(req, total):
            out: list[Hashable] = []  # the outputs' unique page symbols
            n, full = len(a.key), total // p
            if self.verify and life.outputs == "cache" and full > n:
                # stamp the outputs' KV before the insert issues its write-through copies
                self._stamp(req.kv[n:full], life.extend_key(a.key, out, full), n)
            life.finish(req, a.key, out, total)
            if events:
                self._sync()
                self.cache.writing_check()
        else:
            res.oom_requests += 1
        res.device_hit_tokens += a.adm.device_pages * p
        res.host_hit_tokens += a.adm.loaded_pages * p

    def finish(self) -> ReplayResult:
        """Wait for the last copies and fill in the controller and cache counters."""
        self._sync()
        self.result.collect(self.cache, self.ctrl)
        return self.result


__all__ = ["ReplayResult", "TraceReplayer", "trace_requests"]
