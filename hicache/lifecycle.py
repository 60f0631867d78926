"""ONE request KV lifecycle, shared by every driver: admit, allocate, insert, finish, retract.

The cache-only replay (``sim.hitrate``), the timed scheduler (``sim.scheduler``) and the
real-copy replay (``replay.driver``) keep only their own batching and timing; what happens to a
request's KV in the policy core happens here, once:

1. **admit**: ``match_prefix`` on the first ``fill_len - 1`` tokens, page-aligned (SGLang always
   recomputes at least one token); a host hit is loaded back (``init_load_back``, which applies
   the load-back threshold) with the device prefix temporarily locked; the request then locks
   its final last node (:meth:`KVLifecycle.admit`, or the steps :meth:`~KVLifecycle.match`,
   :meth:`~KVLifecycle.hold`, :meth:`~KVLifecycle.load_back`, :meth:`~KVLifecycle.lock` for a
   scheduler that checks its budgets in between, as SGLang's PrefillAdder does);
2. **allocate prefill pages** with eviction (:meth:`~KVLifecycle.alloc`: the one out-of-memory
   page rule — evict the requested tokens when the free pool is short, then allocate);
3. **after prefill**: ``cache_unfinished_req`` (insert the full pages so far, free duplicates,
   re-pin the new path); write-through backups are issued here;
4. **allocate decode pages** (:meth:`~KVLifecycle.alloc_outputs` for a lone request);
5. **finish**: ``cache_finished_req`` of prompt + outputs (``outputs="cache"``; output tokens
   get unique symbols: they take space and never hit) or of the prompt only (``"skip"``);
6. **retract / abort**: free the request's own pages, release its lock, insert nothing.

In SGLang ``cache_unfinished_req`` / ``cache_finished_req`` live on ``RadixCache`` and read the
request's slot table; here :class:`ReqKV` carries the same state: the request's paged key so
far, the device pages holding its KV (the first ``protected_pages`` of them are the tree's,
pinned through ``last_node``), and the lock it holds. :class:`PagedRequest` is the one request
type every driver reads: a trace request at one page size.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hicache.counters import CacheCounters as CacheCounters
from hicache.policy.hiradix import HiRadixCache, MatchResult
from hicache.policy.radix import ExtendedPageKey, PageKey, TreeNode, key_source
from traces.store import BuiltOnRead

if TYPE_CHECKING:
    from traces.schema import Request, Trace

OUTPUT_MODES = ("cache", "skip")


@dataclass(frozen=True, slots=True)
class PagedRequest:
    """A trace request at one page size: one symbol per *full* prompt page, lengths in tokens,
    and what an arrival process needs (trace time in seconds, session, turn, think time)."""

    symbols: Sequence[Hashable]  # a PageKey, or any sequence of page symbols (tests)
    input_length: int
    output_length: int
    rid: int = 0
    arrival_s: float = 0.0
    session: Hashable | None = None
    turn: int | None = None
    think_time_s: float = 0.0

    def with_symbols(self, symbols: Sequence[Hashable]) -> PagedRequest:
        """This request with other ``symbols`` (what ``dataclasses.replace`` does, in a
        constructor call: a timed run does it twice per request)."""
        return PagedRequest(symbols, self.input_length, self.output_length, self.rid,
                            self.arrival_s, self.session, self.turn, self.think_time_s)  # fmt: skip

    @property
    def kv_tokens(self) -> int:
        """Tokens whose KV a finished request holds: prompt + outputs but the last token, whose
        KV is never computed (SGLang's ``kv_committed_len``); at least one output token."""
        return self.input_length + max(1, self.output_length) - 1


NO_KEY = PageKey()  # the symbols of a request whose keys are not built (yet, or any more)


def paged_requests(
    trace: Trace, page_size: int, *, rate_scale: float = 1.0, limit: int = 0, keys: bool = True
) -> list[PagedRequest]:
    """The requests of a ``traces.schema.Trace`` at ``page_size`` (the first ``limit`` if > 0),
    in file order; timestamps and think times divided by ``rate_scale``.

    ``keys`` False: every ``symbols`` is empty; :func:`page_keys` builds them when needed (a
    long trace's keys would otherwise all sit in memory from the start). :class:`PagedTrace`
    gives the same requests built one at a time when read.

    Arrival times count from the first request (a trace's timestamps may be absolute; only
    their differences matter), so a simulation's clock starts near 0 whatever the trace's
    epoch, and shifting every timestamp of a trace changes nothing.
    """
    from traces.keys import page_symbols

    bs = trace.block_size
    origin = 0.0
    out: list[PagedRequest] = []
    for i, r in enumerate(trace):
        if limit and i >= limit:
            break
        if i == 0:
            origin = r.timestamp
        symbols = PageKey(page_symbols(r, page_size, bs)) if keys else NO_KEY
        out.append(_paged(r, i, symbols, origin, rate_scale))
    return out


def _paged(r: Request, rid: int, symbols: PageKey, origin: float, rate: float) -> PagedRequest:
    return PagedRequest(
        symbols,
        r.input_length,
        r.output_length,
        rid=rid,
        arrival_s=(r.timestamp - origin) / 1000.0 / rate,
        session=r.session_id,
        turn=r.turn,
        think_time_s=(r.think_time_ms or 0.0) / 1000.0 / rate,
    )


class PagedTrace(BuiltOnRead[PagedRequest]):
    """:func:`paged_requests` with ``keys`` False, each request built when read (index ``i``
    gives ``paged_requests(...)[i]``). It holds the trace and one arrival time per request
    (``arrivals``), so a long trace's requests exist as objects only while someone uses them."""

    def __init__(
        self, trace: Trace, page_size: int, *, rate_scale: float = 1.0, limit: int = 0
    ) -> None:
        self._reqs = trace.requests
        self.page_size = page_size
        self.rate_scale = rate_scale
        n = len(trace) if limit <= 0 else min(limit, len(trace))
        self._origin = trace.requests[0].timestamp if n else 0.0
        stamps = (r.timestamp for r in itertools.islice(trace.requests, n))
        self.arrivals = array("d", ((t - self._origin) / 1000.0 / rate_scale for t in stamps))

    def __len__(self) -> int:
        return len(self.arrivals)

    def _get(self, i: int) -> PagedRequest:
        return _paged(self._reqs[i], i, NO_KEY, self._origin, self.rate_scale)


def page_keys(trace: Trace, page_size: int) -> Callable[[int], PageKey]:
    """Builds the ``symbols`` of request ``rid`` (its index in ``trace``) on demand: what
    :func:`paged_requests` with ``keys`` would have given it."""
    from traces.keys import page_symbols

    reqs, bs = trace.requests, trace.block_size

    def build(rid: int) -> PageKey:
        return PageKey(page_symbols(reqs[rid], page_size, bs))

    return build


@dataclass(slots=True)
class ReqKV:
    """The KV a request holds. ``kv`` covers ``ceil(tokens / page_size)`` pages; ``key`` holds one
    symbol per *full* page of the sequence so far (prompt, then prompt + outputs)."""

    key: Sequence[Hashable]
    kv: list[int]
    last_node: TreeNode
    protected_pages: int = 0
    # between chunks of a chunked prefill: the nodes from the root to last_node, the cache's
    # split count when they were recorded (unchanged: no node was split since, so they are
    # still the whole path) and the key source their keys were checked against
    path: list[TreeNode] | None = None
    path_splits: int = -1
    path_src: Any = None


@dataclass(slots=True)
class Admitted:
    """What :meth:`KVLifecycle.admit` returns: the request's KV state and its hits in pages."""

    kv: ReqKV
    device_pages: int
    loaded_pages: int


class KVLifecycle:
    """The lifecycle steps of the module docstring on one :class:`HiRadixCache`.

    ``outputs``: what ``finish`` inserts (``"cache"``: prompt + outputs, ``"skip"``: the prompt).
    Unique output symbols are negative ints, numbered -1, -2, ... in the order they are needed.
    """

    def __init__(self, cache: HiRadixCache, outputs: str = "cache") -> None:
        if outputs not in OUTPUT_MODES:
            raise ValueError(f"outputs must be one of {', '.join(OUTPUT_MODES)}, got {outputs!r}")
        self.cache = cache
        self.page_size = cache.page_size
        self.outputs = outputs
        self._uniq = 0

    # --------------------------------------------------------------------------- keys --
    def prompt_key(self, req: PagedRequest) -> PageKey:
        """The paged key of ``req``'s full prompt pages."""
        return prompt_page_key(req, self.page_size)

    def extend_key(self, prompt: PageKey, out_symbols: list[Hashable], full: int) -> PageKey:
        """The first ``full`` pages of prompt + outputs; ``out_symbols`` (the request's own
        list, kept across retractions) grows with fresh unique symbols as needed."""
        key, self._uniq = extend_page_key(prompt, out_symbols, full, self._uniq)
        return key

    # ---------------------------------------------------------------------- admission --
    def match(self, key: Sequence[Hashable], fill_len: int) -> MatchResult:
        """``match_prefix`` on the first ``fill_len - 1`` tokens, page-aligned."""
        ps = self.page_size
        return self.cache.match_prefix(key, limit=max(0, (fill_len - 1) // ps) * ps)

    def prefetch(self, rid: Hashable, key: PageKey, fill_len: int, now: float) -> bool:
        """A request enters the waiting queue with an L3 tier attached (SGLang's
        ``_add_request_to_queue`` -> ``_prefetch_kvcache``): match it now (with the match's side
        effects) and prefetch what follows the cached prefix. False: nothing was issued."""
        cache = self.cache
        if cache.storage is None:
            return False
        m = self.match(key, fill_len)
        limit = max(0, (fill_len - 1) // self.page_size)
        return cache.prefetch_kvcache(rid, key, m, limit, now)

    def prefetch_votes(self) -> int:
        """The TP all-reduces the prefetch checks have made so far (``prefetch_tp_votes``)."""
        return self.cache.storage_stats.prefetch_tp_votes

    def prefetch_done(self, rid: Hashable, now: float) -> int:
        """The admission loop's check before matching a request (``check_prefetch_progress``
        then ``pop_prefetch_loaded_tokens``): -1 while its prefetch must go on (skip it this
        round), else the tokens its prefetch added to the tree (its L3 credit, often 0)."""
        cache = self.cache
        if not cache.check_prefetch_progress(rid, now):
            return -1
        return cache.pop_prefetch_loaded_tokens(rid)

    def hold(self, node: TreeNode) -> None:
        """A temporary lock (PrefillAdder locks the device prefix while it decides)."""
        self.cache.inc_lock_ref(node)

    def release(self, node: TreeNode) -> None:
        self.cache.dec_lock_ref(node)

    def load_back(self, m: MatchResult) -> tuple[list[int], TreeNode]:
        """Load ``m``'s host hit back (``init_load_back``: all or nothing, the threshold, the
        eviction it needs); returns the request's device prefix pages and its last node."""
        prefix = list(m.device_indices)
        last = m.last_device_node
        if m.host_hit_length > 0:
            pages, last = self.cache.init_load_back(m.best_match_node, m.host_hit_length)
            prefix += pages
        return prefix, last

    def lock(self, key: Sequence[Hashable], prefix: list[int], last: TreeNode) -> ReqKV:
        """The request's own lock on its last node; its KV state starts with ``prefix``."""
        self.cache.inc_lock_ref(last)
        return ReqKV(key=key, kv=prefix, last_node=last, protected_pages=len(prefix))

    def admit(self, key: Sequence[Hashable], fill_len: int) -> Admitted:
        """Match, load back (the device prefix locked meanwhile) and lock, in one step."""
        m = self.match(key, fill_len)
        if m.host_hit_length > 0:
            self.hold(m.last_device_node)
            prefix, last = self.load_back(m)
            self.release(m.last_device_node)
        else:
            # m is dropped here, so its freshly built index list can be the request's own
            prefix, last = m.device_indices, m.last_device_node
        loaded = len(prefix) - m.device_pages
        return Admitted(self.lock(key, prefix, last), m.device_pages, loaded)

    # ------------------------------------------------------------------------- memory --
    def alloc(self, pages: int, evict_tokens: int) -> list[int] | None:
        """``pages`` device pages, evicting ``evict_tokens`` first when fewer are free (SGLang's
        ``alloc_token_slots`` / ``alloc_paged_token_slots_extend``); ``None`` when the pool
        cannot supply them even then."""
        dev = self.cache.controller.device
        if dev.available_size() < evict_tokens:
            self.cache.evict(evict_tokens)
        return dev.alloc_pages(pages)

    def alloc_prompt(self, kv: ReqKV, prompt_tokens: int) -> list[int] | None:
        """Pages for the rest of a lone request's prompt (the partial last page included),
        evicting the full need plus one page of over-estimate when ``page_size > 1``. On
        ``None`` the request is aborted (:meth:`abort`)."""
        have = len(kv.kv)
        if not self.reserve_prompt(kv, prompt_tokens):
            return None
        return kv.kv[have:]

    def reserve_prompt(self, kv: ReqKV, prompt_tokens: int) -> bool:
        """:meth:`alloc_prompt` for a caller that does not need the new pages as a list of
        their own: they are only appended to ``kv.kv``. ``False``: aborted."""
        p = self.page_size
        have = len(kv.kv)
        need = -(-prompt_tokens // p) - have
        if need <= 0:
            return True
        dev = self.cache.controller.device
        evict_tokens = prompt_tokens - have * p + (p if p > 1 else 0)
        if dev.available_size() < evict_tokens:  # as alloc()
            self.cache.evict(evict_tokens)
        if not dev.alloc_into(kv.kv, need):
            self.abort(kv)
            return False
        return True

    def alloc_outputs(self, kv: ReqKV, kv_tokens: int) -> bool:
        """Decode pages of a lone request up to ``kv_tokens``: all at once when free, else one
        page at each page boundary, evicting one page each (the decode memory check for a batch
        of one). ``False``: the pool ran out; the request was aborted."""
        p = self.page_size
        need = -(-kv_tokens // p) - len(kv.kv)
        if need <= 0:
            return True
        dev = self.cache.controller.device
        if dev.free_page_count() >= need:
            dev.alloc_into(kv.kv, need)
            return True
        cache = self.cache
        for _ in range(need):  # one page at a time, as alloc(1, p) (evicting p tokens if short)
            if dev.available_size() < p:
                cache.evict(p)
            if not dev.alloc_into(kv.kv, 1):
                self.abort(kv)
                return False
        return True

    # ------------------------------------------------------------------------- insert --
    def after_prefill(self, kv: ReqKV, chunked: bool = False) -> None:
        """``cache_unfinished_req`` of ``kv.key`` (the caller sets it to what was prefilled)."""
        cache_unfinished_req(self.cache, kv, chunked=chunked)

    def finish(
        self, kv: ReqKV, prompt: PageKey, out_symbols: list[Hashable], kv_tokens: int
    ) -> None:
        """``cache_finished_req`` of prompt + outputs (``outputs="cache"``: the full pages of
        ``kv_tokens``) or of the prompt only (``"skip"``: still an insert, so it counts a hit)."""
        if self.outputs == "cache":
            full = kv_tokens // self.page_size
            kv.key = self.extend_key(prompt, out_symbols, full)
        else:
            kv.key = prompt
            full = len(prompt)
        cache_finished_req(self.cache, kv, insert_pages=full)

    def abort(self, kv: ReqKV) -> None:
        """Retraction or out-of-memory: free the request's own pages beyond its protected
        prefix and release its lock; nothing is inserted."""
        cache_finished_req(self.cache, kv, insert=False)


def prompt_page_key(req: PagedRequest, page_size: int) -> PageKey:
    """The paged key of ``req``'s full prompt pages (every SGLang version's lifecycle)."""
    n = req.input_length // page_size
    sym = req.symbols
    return sym if len(sym) == n and isinstance(sym, PageKey) else PageKey(sym[:n])


def extend_page_key(
    prompt: PageKey, out_symbols: list[Hashable], full: int, uniq: int
) -> tuple[PageKey, int]:
    """The first ``full`` pages of prompt + outputs, and the next unique-symbol counter:
    ``out_symbols`` grows with fresh unique symbols ``uniq - 1, uniq - 2, ...`` as needed."""
    n = len(prompt)
    if full <= n:
        return (prompt if full == n else PageKey(prompt[:full])), uniq
    short = full - n - len(out_symbols)
    if short > 0:
        # -(u+1), -(u+2), ... in one C-level range: the symbols one append at a time would
        # give, without a Python loop per output page
        out_symbols.extend(range(uniq - 1, uniq - 1 - short, -1))
        uniq -= short
    return ExtendedPageKey(prompt, out_symbols[: full - n]), uniq


def cache_unfinished_req(cache: HiRadixCache, req: ReqKV, chunked: bool = False) -> None:
    """Insert the request's full pages so far, free its duplicates, and re-pin the new path."""
    n = len(req.key)
    key = req.key if isinstance(req.key, PageKey) else PageKey(req.key)
    done = req.protected_pages
    # the next chunk of a chunked request: its locked path is walked without comparing keys
    # (the same decisions and clock values: insert_locked, rematch_locked) instead of from
    # the root each time; the path is kept from chunk to chunk while no node is split
    src = key_source(key)
    path, walked = None, False
    if chunked and done:
        path = req.path
        walked = (
            path is not None
            and req.path_splits == cache.splits
            and path[-1] is req.last_node
            and src is not None
            and req.path_src is src
        )
        if not walked:
            path = cache.locked_path(req.last_node, done, key)
    req.path = None
    # insert reads only the first n pages of the value it is given: no slice copy needed
    if path is None:
        prefix_pages = cache.insert(key, req.kv, chunked=chunked) // cache.page_size
    else:
        prefix_pages = cache.insert_locked(path, done, key, req.kv, walked=walked)
        prefix_pages //= cache.page_size
    if prefix_pages > req.protected_pages:
        cache.controller.free_device(req.kv[req.protected_pages : prefix_pages])
    m = cache.match_prefix(key) if path is None else cache.rematch_locked(path, done, key)
    if m.device_pages != n:
        raise AssertionError("cache_unfinished_req: re-match did not cover the inserted key")
    # the tree's pages now back the whole key: below protected_pages they already were the
    # request's; from prefix_pages on they are the request's own (inserted or adopted); only the
    # duplicates in between change
    if prefix_pages > req.protected_pages:
        req.kv[req.protected_pages : prefix_pages] = m.device_slice(
            req.protected_pages, prefix_pages
        )
    cache.move_lock_ref(req.last_node, m.last_device_node)  # dec_lock_ref(old); inc(new)
    if path is not None and src is not None:  # the path to the new last node, for the next chunk
        below: list[TreeNode] = []
        node: TreeNode | None = m.last_device_node
        while node is not None and node is not path[-1]:
            below.append(node)
            node = node.parent
        if node is not None:
            path.extend(reversed(below))  # the request's own list: extended in place
            req.path, req.path_splits, req.path_src = path, cache.splits, src
    req.last_node = m.last_device_node
    req.protected_pages = n


def cache_finished_req(
    cache: HiRadixCache, req: ReqKV, insert: bool = True, insert_pages: int | None = None
) -> None:
    """Insert the finished sequence (or only its first ``insert_pages`` pages), free what the tree
    did not take (duplicates and the unaligned tail), and release the request's lock.

    ``insert=False`` is the retraction path: nothing is inserted, the request's own pages beyond
    the protected prefix are freed.
    """
    n = len(req.key) if insert_pages is None else min(insert_pages, len(req.key))
    ctrl = cache.controller
    if insert:
        key = (
            req.key if n == len(req.key) and isinstance(req.key, PageKey) else PageKey(req.key[:n])
        )
        prefix_pages = cache.insert(key, req.kv) // cache.page_size  # reads req.kv[:n] only
        if prefix_pages > req.protected_pages:
            ctrl.free_device(req.kv[req.protected_pages : prefix_pages])
        tail = req.kv[n:]
    else:
        tail = req.kv[req.protected_pages :]
    if tail:
        ctrl.free_device(tail)
    cache.dec_lock_ref(req.last_node)
    req.kv = []
