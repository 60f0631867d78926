"""The L3 storage tier's controller half (SGLang 0.5.14 ``HiCacheController`` storage methods).

See ``shared/design/STORAGE_TIER.md``. The tree-side bookkeeping (prefetch issue, progress
checks, termination, backups after write acks, control-queue drains) lives in
:mod:`hicache.policy.storage_tier`; this module holds what SGLang runs on its three storage
threads, made deterministic:

* :class:`PageHasher` gives each page its L3 key: a 64-bit hash of (previous page's key, page
  symbol), so a key stands for the whole token prefix up to the end of its page, as SGLang's
  chained SHA-256 does (one small hash per page, never of a long prefix).
* :class:`PageStore` is the backend's content: a set of page keys, optionally capped with a
  page-level LRU (the file backend's ``max_size`` evictor).
* :class:`StorageController` holds the operations and the queues between the scheduler and the
  three stages (query, transfer, backup). Each stage advances one backend call at a time through
  a ``*_begin`` / ``*_end`` pair: ``begin`` says what the call covers (so a timed driver can charge
  it), ``end`` applies its effect. Drivers decide *when*: tests step them by hand
  (:meth:`StorageController.run_query` ...), the cache-only replay runs them at once
  (``immediate=True``), the simulator makes them SimPy jobs.

Queues drained by the scheduler thread in SGLang (revokes, backup acks, host slot releases) are
plain deques here, drained by ``HiRadixCache.drain_storage_control_queues``.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hicache.policy.allocator import PageAllocator

#: Pages per backend call (queries, reads and writes), SGLang's ``STORAGE_BATCH_SIZE``.
STORAGE_BATCH_SIZE = 128

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")

#: Share of (host - device) tokens in-flight prefetches may request (``attach_storage_backend``).
PREFETCH_CAPACITY_SHARE = 0.8


class PageHasher:
    """Prefix-chained page keys: ``key(page i) = hash((key(page i-1), symbols of page i))``,
    from 0 for the empty prefix (the root), as SGLang chains SHA-256 over the previous key and
    the page's tokens. A 64-bit hash of a pair is not injective in theory; two different
    prefixes meet with a probability of about n^2 / 2^64 for n distinct pages (1e-7 for a
    million pages), which is the same kind of bet SGLang makes with SHA-256, at a fraction of
    the cost and with no table to keep. Symbols are the tree's page symbols (ints, or tuples
    of token ids), whose hashes do not vary between processes, so keys are reproducible."""

    __slots__ = ("_seeds",)

    def __init__(self) -> None:
        self._seeds: dict[str, int] = {}

    def seed(self, extra_key: str | None) -> int:
        """The chain start of a namespace: 0 without an extra key. SGLang ignores the extra key
        here (its defect D2); we keep namespaces apart and count what SGLang would have mixed."""
        if extra_key is None:
            return 0
        s = self._seeds.get(extra_key)
        if s is None:
            s = self._seeds[extra_key] = -(len(self._seeds) + 1)
        return s

    def chain(self, last: int, symbols: Sequence[Hashable]) -> list[int]:
        """Keys of ``symbols`` (one per page) following a page whose key is ``last``."""
        out: list[int] = []
        append = out.append
        for sym in symbols:
            last = hash((last, sym))
            append(last)
        return out

    find = chain  # no table: a key never stored is simply not found by the store


class PageStore:
    """What the backend holds: page keys, unbounded or capped with a page LRU.

    Capped like the file backend's evictor: recency is refreshed by reads and by a skipped
    rewrite of an existing page, not by existence queries; when a new page does not fit, least
    recently used pages go until ``eviction_ratio x capacity - 1`` pages remain.
    """

    def __init__(self, capacity_pages: int | None = None, eviction_ratio: float = 0.9) -> None:
        if capacity_pages is not None and capacity_pages < 1:
            raise ValueError(f"storage capacity must be >= 1 page, got {capacity_pages}")
        if not 0.0 < eviction_ratio <= 1.0:
            raise ValueError(f"eviction_ratio must be in (0, 1], got {eviction_ratio}")
        self.capacity_pages = capacity_pages
        self.eviction_ratio = eviction_ratio
        # recency is kept only when it can matter (a capped store)
        self._pages: set[int] | OrderedDict[int, None] = (
            set() if capacity_pages is None else OrderedDict()
        )
        self.pages_written = 0
        self.pages_skipped = 0
        self.pages_read = 0
        self.pages_evicted = 0

    def __len__(self) -> int:
        return len(self._pages)

    def __contains__(self, key: int) -> bool:
        return key in self._pages

    def exists_prefix(self, keys: Sequence[int]) -> int:
        """Number of consecutive existing keys from the first (``batch_exists``)."""
        pages = self._pages
        n = 0
        for k in keys:
            if k not in pages:
                break
            n += 1
        return n

    def get(self, keys: Sequence[int]) -> int:
        """Read: consecutive existing keys from the first, each refreshed (``batch_get``)."""
        pages = self._pages
        n = self.exists_prefix(keys)
        if isinstance(pages, OrderedDict):  # recency matters only to a capped store
            for k in keys[:n]:
                pages.move_to_end(k)
        self.pages_read += n
        return n

    def set(self, keys: Sequence[int]) -> bool:
        """Write (``batch_set``): existing keys are refreshed and skipped, new ones stored."""
        pages, cap = self._pages, self.capacity_pages
        if isinstance(pages, set):  # unbounded: no recency to keep
            before = len(pages)
            pages.update(keys)
            new = len(pages) - before
            self.pages_written += new
            self.pages_skipped += len(keys) - new
            return True
        assert isinstance(pages, OrderedDict)
        for k in keys:
            if k in pages:
                pages.move_to_end(k)
                self.pages_skipped += 1
                continue
            if cap is not None and len(pages) >= cap:
                keep = max(0, int(self.eviction_ratio * cap) - 1)
                while len(pages) > keep:
                    pages.popitem(last=False)
                    self.pages_evicted += 1
            pages[k] = None
            self.pages_written += 1
        return True

    def match_chain(self, last: int, symbols: Sequence[Hashable]) -> list[int]:
        """The keys of ``symbols`` chained from ``last`` (as :meth:`PageHasher.chain`), up to
        the first one not stored: what ``exists_prefix`` would count, without hashing the pages
        after a miss."""
        pages = self._pages
        out: list[int] = []
        for sym in symbols:
            last = hash((last, sym))
            if last not in pages:
                break
            out.append(last)
        return out

    def clear(self) -> None:
        self._pages.clear()


@dataclass(eq=False, slots=True)
class PrefetchOp:
    """One prefetch (SGLang ``PrefetchOperation``). Lengths in tokens; keys per page."""

    op_id: int
    rid: Hashable
    host_pages: list[int]
    symbols: tuple[Hashable, ...]
    last_hash: int
    start_time: float
    completed_tokens: int = 0
    terminated: bool = False
    hit_keys: list[int] = field(default_factory=list)
    queried_pages: int = 0  # pages whose existence was checked so far
    hit_pages: int = -1  # -1 until the query stage has finished
    read_pages: int = 0  # pages handed to read calls so far (including a discarded batch)
    probe: tuple[int, list[int]] | None = None  # (query start, stored keys found from there)
    done_time: float = -1.0  # when its I/O ended (revoked, or read to the end); timed drivers

    def increment(self, tokens: int) -> bool:
        if self.terminated:
            return False
        self.completed_tokens += tokens
        return True

    def mark_terminate(self) -> None:
        self.terminated = True


@dataclass(eq=False, slots=True)
class BackupOp:
    """One L2 -> L3 backup (SGLang ``StorageOperation``): a written node's whole segment."""

    op_id: int
    host_pages: list[int]
    hash_value: list[int]
    completed_tokens: int = 0
    done_pages: int = 0
    failed: bool = False


class StageCall(NamedTuple):
    """One backend call a stage is about to make: ``kind`` in query / read / write."""

    kind: str
    op: PrefetchOp | BackupOp
    pages: int


@dataclass
class StorageStats:
    """Controller-side totals (tokens unless named otherwise)."""

    query_calls: int = 0
    read_calls: int = 0
    write_calls: int = 0
    pages_queried: int = 0
    pages_read: int = 0  # read calls' pages, discarded ones included
    pages_discarded: int = 0  # read after termination: bandwidth spent, data dropped
    pages_backed_up: int = 0  # pages handed to write calls (existing ones included)
    backup_ops: int = 0
    prefetch_ops: int = 0
    revoked: int = 0


class StorageController:
    """The storage half of SGLang's ``HiCacheController`` (see the module docstring).

    ``host_tokens`` / ``device_tokens`` size the prefetch capacity limit; ``threshold`` is the
    parsed ``prefetch_threshold`` (the controller's revoke test uses ``max(threshold, page)``).
    """

    def __init__(
        self,
        host: PageAllocator,
        store: PageStore,
        *,
        device_tokens: int,
        threshold: int = 256,
        hasher: PageHasher | None = None,
        batch_pages: int = STORAGE_BATCH_SIZE,
        immediate: bool = False,
    ) -> None:
        if batch_pages < 1:
            raise ValueError(f"batch_pages must be >= 1, got {batch_pages}")
        self.host = host
        self.store = store
        self.page_size = host.page_size
        self.hasher = hasher if hasher is not None else PageHasher()
        self.batch_pages = batch_pages
        self.immediate = immediate
        self.prefetch_threshold = max(threshold, self.page_size)
        host_tokens = host.capacity_tokens
        self.prefetch_capacity_limit = max(
            0, int(PREFETCH_CAPACITY_SHARE * (host_tokens - device_tokens))
        )
        self.prefetch_tokens_occupied = 0
        self.prefetch_queue: deque[PrefetchOp] = deque()  # waiting for / in the query stage
        self.prefetch_buffer: deque[PrefetchOp] = deque()  # waiting for / in the read stage
        self.backup_queue: deque[BackupOp] = deque()
        self.prefetch_revoke_queue: deque[tuple[Hashable, int]] = deque()
        self.ack_backup_queue: deque[BackupOp] = deque()
        self.host_mem_release_queue: deque[list[int]] = deque()
        self.stats = StorageStats()
        self._next_op = 0
        # a timed driver's wake-ups: called with the stage ("query", "read", "write") that got
        # work (a new op at the tail of its queue, or its head op's next call)
        self.on_work: list[Callable[[str], None]] = []
        # 0.5.23: operations a stage finished without a backend call (terminated before their
        # turn, taken as stored): a timed driver tells its listeners (0.5.14: always empty)
        self.instant: list[StageCall] = []

    # -- scheduler-side calls -------------------------------------------------------------------
    def prefetch_rate_limited(self) -> bool:
        return self.prefetch_tokens_occupied >= self.prefetch_capacity_limit

    def prefetch(
        self,
        rid: Hashable,
        host_pages: list[int],
        symbols: tuple[Hashable, ...],
        last_hash: int,
        now: float,
    ) -> PrefetchOp:
        """Create the operation (``start_time`` = ``now``) and queue it for the query stage."""
        self._next_op += 1
        op = PrefetchOp(self._next_op, rid, host_pages, symbols, last_hash, now)
        self.prefetch_queue.append(op)
        self.stats.prefetch_ops += 1
        self._kick("query")
        return op

    def terminate_prefetch(self, op: PrefetchOp) -> tuple[int, list[int]]:
        """Freeze the operation's progress; returns (completed tokens, hit keys)."""
        op.mark_terminate()
        return op.completed_tokens, op.hit_keys

    def write_storage(self, host_pages: list[int], hash_value: list[int]) -> int:
        """Queue a backup of these host pages under these page keys; returns the op id."""
        self._next_op += 1
        op = BackupOp(self._next_op, host_pages, hash_value)
        self.backup_queue.append(op)
        self.stats.backup_ops += 1
        self._kick("write")
        return op.op_id

    def reset(self) -> None:
        """``HiCacheController.reset``'s storage part: pending queries run (their results are
        dropped with the queues), queued backups are dropped, occupancy goes to 0. The store
        keeps its content."""
        while self.prefetch_queue:  # the prefetch thread is joined: it finishes its queue
            call = self.query_begin()
            assert call is not None
            self.query_end(call)
        self.prefetch_buffer.clear()
        self.backup_queue.clear()
        self.prefetch_revoke_queue.clear()
        self.ack_backup_queue.clear()
        self.host_mem_release_queue.clear()
        self.prefetch_tokens_occupied = 0

    def read_progress(self, op: PrefetchOp) -> int:
        """Pages of ``op`` its reads have brought in so far."""
        return op.completed_tokens // self.page_size

    # -- the query stage (SGLang's prefetch thread) ---------------------------------------------
    def query_begin(self) -> StageCall | None:
        """The next ``batch_exists`` call: up to ``batch_pages`` pages of the head op."""
        if not self.prefetch_queue:
            return None
        op = self.prefetch_queue[0]
        left = len(op.symbols) - op.queried_pages
        return StageCall("query", op, min(self.batch_pages, left))

    def query_probe(self, call: StageCall) -> list[int]:
        """The stored keys from the start of ``call``'s pages, up to the first missing one
        (what its ``batch_exists`` finds). Computed once per call: a timed driver that needs
        it to charge the call (a key-by-key backend stops at the miss) asks at the start, and
        the call's result is then what the store held then."""
        op = call.op
        assert isinstance(op, PrefetchOp)
        start = op.queried_pages
        if op.probe is not None and op.probe[0] == start:
            return op.probe[1]
        last = op.hit_keys[-1] if op.hit_keys else op.last_hash
        keys = self.store.match_chain(last, op.symbols[start : start + call.pages])
        op.probe = (start, keys)
        return keys

    def query_end(self, call: StageCall) -> None:
        op = call.op
        assert isinstance(op, PrefetchOp) and self.prefetch_queue[0] is op
        st = self.stats
        st.query_calls += 1
        st.pages_queried += call.pages
        keys = self.query_probe(call)
        op.probe = None
        start = op.queried_pages
        hit = len(keys)
        op.hit_keys += keys
        op.queried_pages = start + call.pages
        if hit == call.pages and op.queried_pages < len(op.symbols):
            return  # the next chunk
        self.prefetch_queue.popleft()
        self._finish_query(op)

    def _finish_query(self, op: PrefetchOp) -> None:
        ps = self.page_size
        hit = len(op.hit_keys)
        if hit * ps < self.prefetch_threshold:
            # revoked: SGLang leaves the operation's hit list empty (a timeout then counts the
            # base alone) and every reserved slot goes back through the release queue
            self.prefetch_revoke_queue.append((op.rid, op.op_id))
            self.stats.revoked += 1
            if op.host_pages:
                self.host_mem_release_queue.append(op.host_pages)
            op.hit_keys = []
            op.hit_pages = 0
            return
        op.hit_pages = hit
        if hit < len(op.host_pages):
            self.host_mem_release_queue.append(op.host_pages[hit:])
        self.prefetch_buffer.append(op)
        self._kick("read")

    # -- the read stage (SGLang's prefetch IO thread) -------------------------------------------
    def read_begin(self) -> StageCall | None:
        """The next ``batch_get`` call: up to ``batch_pages`` hit pages of the head op."""
        if not self.prefetch_buffer:
            return None
        op = self.prefetch_buffer[0]
        return StageCall("read", op, min(self.batch_pages, op.hit_pages - op.read_pages))

    def read_end(self, call: StageCall) -> None:
        op = call.op
        assert isinstance(op, PrefetchOp) and self.prefetch_buffer[0] is op
        ps, st = self.page_size, self.stats
        st.read_calls += 1
        st.pages_read += call.pages
        start = op.read_pages
        got = self.store.get(op.hit_keys[start : start + call.pages])
        op.read_pages = start + call.pages
        before = op.completed_tokens
        # SGLang increments page by page and stops at the first refusal; nothing can set the
        # flag between two pages here, so one increment of the batch is the same
        if got:
            op.increment(got * ps)
        added = (op.completed_tokens - before) // ps
        st.pages_discarded += call.pages - added
        if added < call.pages:
            op.mark_terminate()
        if op.terminated or op.read_pages >= op.hit_pages:
            self.prefetch_buffer.popleft()
            done = op.completed_tokens // ps
            if done < op.hit_pages:
                self.host_mem_release_queue.append(op.host_pages[done : op.hit_pages])
        if self.prefetch_buffer:
            self._kick("read")

    # -- the backup stage (SGLang's backup thread) ----------------------------------------------
    def write_begin(self) -> StageCall | None:
        """The next ``batch_set`` call of the head backup (None when nothing is queued)."""
        if not self.backup_queue:
            return None
        op = self.backup_queue[0]
        left = len(op.hash_value) - op.done_pages
        return StageCall("write", op, min(self.batch_pages, left))

    def write_end(self, call: StageCall) -> None:
        op = call.op
        assert isinstance(op, BackupOp) and self.backup_queue[0] is op
        st = self.stats
        if call.pages:
            st.write_calls += 1
            st.pages_backed_up += call.pages
            start = op.done_pages
            ok = self.store.set(op.hash_value[start : start + call.pages])
            if ok:
                op.done_pages = start + call.pages
                op.completed_tokens += call.pages * self.page_size
            else:
                op.failed = True
        if op.failed or op.done_pages >= len(op.hash_value):
            self.backup_queue.popleft()
            self.ack_backup_queue.append(op)
        if self.backup_queue:
            self._kick("write")

    # -- stepping helpers (tests, immediate mode) -----------------------------------------------
    def run_query(self) -> bool:
        """One query call, if any is pending; True if one ran."""
        call = self.query_begin()
        if call is None:
            return False
        self.query_end(call)
        return True

    def run_read(self) -> bool:
        call = self.read_begin()
        if call is None:
            return False
        self.read_end(call)
        return True

    def run_write(self) -> bool:
        call = self.write_begin()
        if call is None:
            return False
        self.write_end(call)
        return True

    def run_all(self) -> None:
        """Every stage to completion (queries, then reads, then backups, repeatedly)."""
        while self.run_query() or self.run_read() or self.run_write():
            pass

    def busy(self) -> bool:
        return bool(self.prefetch_queue or self.prefetch_buffer or self.backup_queue)

    def _kick(self, kind: str) -> None:
        if self.immediate:
            return  # the cache runs ``run_all`` after each issue (see storage_tier)
        for cb in self.on_work:
            cb(kind)


__all__ = [
    "PREFETCH_POLICIES",
    "STORAGE_BATCH_SIZE",
    "BackupOp",
    "PageHasher",
    "PageStore",
    "PrefetchOp",
    "StageCall",
    "StorageController",
    "StorageStats",
]
