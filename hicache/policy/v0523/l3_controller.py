"""The L3 tier's controller half as SGLang 0.5.23 runs it (``HybridCacheController`` over
``HiCacheController``, ``managers/cache_controller.py`` and
``mem_cache/hybrid_cache/hybrid_cache_controller.py``), dense path, cache host mode.

It is 0.5.14's :class:`~hicache.policy.storage.StorageController` (same store, page keys, backup
stage and ``begin`` / ``end`` stepping, so the same drivers run it) with what changed
(SGLANG_0523.md §2.10):

* a prefetch holds **no host memory** while its existence query runs (``prefetch``); the query is
  **one** ``batch_exists`` over the whole span (``HybridCacheController._storage_hit_query``), or
  none at all when the span is taken as stored (``assume_stored``) or the op was terminated first;
* the query's result goes to ``prefetch_hit_queue``: the *scheduler* decides there whether to
  revoke or to allocate hit-sized host pages (:meth:`allocate_storage_hit`) and hand the op to
  the transfer stage;
* the transfer stage reads batch by batch and publishes its progress as acks
  (``ack_prefetch_queue``): the op's ``completed_tokens`` is what the scheduler has *drained*,
  not what the stage has read; a terminated or failed op stops at its next batch and sends its
  completion ack;
* the rate limit is half the host pool (``prefetch_capacity_limit = int(0.5 x host)``).

Host releases go through ``host_mem_release_queue`` and are freed at the scheduler's next drain,
in order, as in SGLang.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from hicache.policy.allocator import PageAllocator
from hicache.policy.storage import (
    STORAGE_BATCH_SIZE,
    PageHasher,
    PageStore,
    PrefetchOp,
    StageCall,
    StorageController,
)

#: Share of the host pool in-flight prefetches may request (cache mode, cache_controller.py:634).
PREFETCH_CAPACITY_SHARE_0523 = 0.5


@dataclass(eq=False, slots=True)
class PrefetchOp0523(PrefetchOp):
    """One 0.5.23 ``PrefetchOperation``. ``host_pages`` stays empty until the scheduler allocates
    the hit (``host_indices is None`` in SGLang: :attr:`allocated` False)."""

    assume_stored: bool = False
    allocated: bool = False
    storage_hit_count: int = 0
    """Tokens the query found (page multiple); cut to the allocation when it is partial."""
    stats_requested_tokens: int = 0
    storage_start: int = 0
    deadline_expired: bool = False
    io_pages: int = 0
    """Pages the transfer stage has read so far (published to the scheduler by acks)."""
    io_failed: bool = False
    io_done: bool = False
    hit_done: bool = False
    """Its query result has been drained (SGLang: the op left ``prefetch_hit_queue``)."""
    queried: bool = False
    """A ``batch_exists`` call ran for it (its result is a verdict on the span's keys)."""


class PrefetchAck(NamedTuple):
    """``PrefetchAck``: a progress ack (``completed_tokens``) or the completion ack."""

    op: PrefetchOp0523
    completed_tokens: int | None
    completed_req: bool


@dataclass
class Controller0523Stats:
    hit_queries: int = 0
    assumed_stored: int = 0
    progress_acks: int = 0
    completion_acks: int = 0
    hit_allocs: int = 0
    hit_allocs_partial: int = 0
    hit_alloc_failures: int = 0


class StorageController0523(StorageController):
    """See the module docstring. ``device_tokens`` is unused by 0.5.23's limit (kept so both
    versions build alike)."""

    def __init__(
        self,
        host: PageAllocator,
        store: PageStore,
        *,
        device_tokens: int = 0,
        threshold: int = 256,
        hasher: PageHasher | None = None,
        batch_pages: int = STORAGE_BATCH_SIZE,
        immediate: bool = False,
    ) -> None:
        super().__init__(
            host,
            store,
            device_tokens=device_tokens,
            threshold=threshold,
            hasher=hasher,
            batch_pages=batch_pages,
            immediate=immediate,
        )
        self.prefetch_capacity_limit = int(PREFETCH_CAPACITY_SHARE_0523 * host.capacity_tokens)
        self.prefetch_hit_queue: deque[PrefetchOp0523] = deque()
        self.ack_prefetch_queue: deque[PrefetchAck] = deque()
        self.counts = Controller0523Stats()

    # -- scheduler-side calls -------------------------------------------------------------------
    def prefetch(  # type: ignore[override]
        self,
        rid: Hashable,
        symbols: tuple[Hashable, ...],
        last_hash: int,
        now: float,
        assume_stored: bool = False,
    ) -> PrefetchOp0523:
        """``prefetch`` / ``submit_prefetch``: queue the existence query (no host pages yet)."""
        self._next_op += 1
        op = PrefetchOp0523(
            self._next_op, rid, [], symbols, last_hash, now, assume_stored=assume_stored
        )
        self.prefetch_queue.append(op)
        self.stats.prefetch_ops += 1
        self._kick("query")
        return op

    def allocate_storage_hit(
        self, op: PrefetchOp0523, hit_tokens: int, min_tokens: int, evict_host: object
    ) -> tuple[list[int] | None, int]:
        """``allocate_storage_hit(allow_partial=True)``: the hit's pages, after one host
        eviction of the hit's size; else as many whole pages as are free, if at least
        ``min_tokens``. Returns ``(pages or None, tokens)``."""
        host, ps = self.host, self.page_size
        pages = host.alloc(hit_tokens)
        if pages is None:
            evict_host(hit_tokens)  # type: ignore[operator]
            pages = host.alloc(hit_tokens)
        if pages is not None:
            self.counts.hit_allocs += 1
            return pages, hit_tokens
        avail = host.available_size()
        alloc_len = min(hit_tokens, avail - avail % ps)
        if alloc_len >= min_tokens:
            pages = host.alloc(alloc_len)
        if pages is None:
            self.counts.hit_alloc_failures += 1
        else:
            self.counts.hit_allocs_partial += 1
        return pages, alloc_len

    def start_transfer(self, op: PrefetchOp0523) -> None:
        """``prefetch_buffer.put``: hand an allocated hit to the transfer stage."""
        self.prefetch_buffer.append(op)
        self._kick("read")

    def append_host_mem_release(self, pages: list[int]) -> None:
        if pages:
            self.host_mem_release_queue.append(pages)

    def reset(self) -> None:
        """``reset``: the storage threads are joined and every queue cleared (0.5.21+); queries
        and transfers in flight are dropped with them."""
        self.prefetch_queue.clear()
        self.prefetch_hit_queue.clear()
        self.prefetch_buffer.clear()
        self.ack_prefetch_queue.clear()
        self.backup_queue.clear()
        self.ack_backup_queue.clear()
        self.host_mem_release_queue.clear()
        self.prefetch_tokens_occupied = 0

    # -- the query stage (the prefetch thread) --------------------------------------------------
    def query_begin(self) -> StageCall | None:
        """The next ``batch_exists`` call: the whole span of the head op. Ops that need no call
        (terminated before their turn, or taken as stored) finish here at once."""
        while self.prefetch_queue:
            op = self.prefetch_queue[0]
            assert isinstance(op, PrefetchOp0523)
            if op.terminated:
                self.prefetch_queue.popleft()
                self._finish_query(op, [])
                self._instant("query", op)
                continue
            if op.assume_stored:
                self.prefetch_queue.popleft()
                self.counts.assumed_stored += 1
                self._finish_query(op, self.hasher.chain(op.last_hash, op.symbols))
                self._instant("query", op)
                continue
            return StageCall("query", op, len(op.symbols))
        return None

    def query_end(self, call: StageCall) -> None:
        op = call.op
        assert isinstance(op, PrefetchOp0523) and self.prefetch_queue[0] is op
        self.stats.query_calls += 1
        self.stats.pages_queried += call.pages
        keys = self.query_probe(call)
        op.probe = None
        self.prefetch_queue.popleft()
        self.counts.hit_queries += 1
        op.queried = True
        self._finish_query(op, keys)

    def _finish_query(self, op: PrefetchOp0523, keys: list[int]) -> None:  # type: ignore[override]
        """The thread's tail: record the hit (page multiple) and queue it for the scheduler."""
        op.hit_keys = keys
        op.queried_pages = len(op.symbols)
        op.hit_pages = len(keys)
        op.storage_hit_count = len(keys) * self.page_size
        self.prefetch_hit_queue.append(op)

    # -- the transfer stage (prefetch_io_aux_func + _page_transfer) -----------------------------
    def read_begin(self) -> StageCall | None:
        """The next ``batch_get`` of the head op; an op that was terminated (or failed) stops
        here and sends its completion ack."""
        while self.prefetch_buffer:
            op = self.prefetch_buffer[0]
            assert isinstance(op, PrefetchOp0523)
            if op.io_failed or op.terminated or op.read_pages >= op.hit_pages:
                self._finish_transfer(op)
                self._instant("read", op)
                continue
            return StageCall("read", op, min(self.batch_pages, op.hit_pages - op.read_pages))
        return None

    def read_end(self, call: StageCall) -> None:
        op = call.op
        assert isinstance(op, PrefetchOp0523) and self.prefetch_buffer[0] is op
        st = self.stats
        st.read_calls += 1
        st.pages_read += call.pages
        start = op.read_pages
        got = self.store.get(op.hit_keys[start : start + call.pages])
        op.read_pages = start + call.pages
        op.io_pages += got
        st.pages_discarded += call.pages - got
        if got < call.pages:
            op.io_failed = True
        self.ack_prefetch_queue.append(PrefetchAck(op, op.io_pages * self.page_size, False))
        self.counts.progress_acks += 1
        if op.io_failed or op.read_pages >= op.hit_pages:
            self._finish_transfer(op)
        if self.prefetch_buffer:
            self._kick("read")

    def _finish_transfer(self, op: PrefetchOp0523) -> None:
        """The rest of the batches send acks that change nothing (their progress is what was
        read); then the completion ack."""
        self.prefetch_buffer.popleft()
        op.io_done = True
        left = op.hit_pages - op.read_pages
        done = op.io_pages * self.page_size
        for _ in range(-(-left // self.batch_pages) if left > 0 else 0):
            self.ack_prefetch_queue.append(PrefetchAck(op, done, False))
        op.read_pages = op.hit_pages
        self.ack_prefetch_queue.append(PrefetchAck(op, None, True))
        self.counts.completion_acks += 1

    def read_progress(self, op: PrefetchOp) -> int:
        """Pages read so far (the stage's own count: ``completed_tokens`` is what the
        scheduler has drained)."""
        assert isinstance(op, PrefetchOp0523)
        return op.io_pages

    def _instant(self, kind: str, op: PrefetchOp0523) -> None:
        """An op finished without a backend call: a timed driver must tell its listeners."""
        if self.on_work:
            self.instant.append(StageCall(kind, op, 0))

    def busy(self) -> bool:
        return bool(self.prefetch_queue or self.prefetch_buffer or self.backup_queue)


__all__ = ["PREFETCH_CAPACITY_SHARE_0523", "PrefetchAck", "PrefetchOp0523", "StorageController0523"]
