"""The L3 storage tier on the SimPy clock: the three storage stages and the link to the store.

:class:`SimStorage` drives one :class:`~hicache.policy.storage.StorageController` (one
instance; it stands for TP rank 0's three storage threads, the other ranks doing the same on
their own shards at the same time): a query, a read and a write process, each FIFO and one
backend call at a time. A call is ``begin`` -> hold for its time -> ``end`` (which applies its
effect: existence result, progress, releases, acks) -> notify :attr:`SimStorage.listeners`.
Its time (:class:`~hicache.storage_backends.StorageBackendSpec`) has two parts:

* on the stage, off the link: call latency, per-page cost and, on the generic path, the host
  memcpy (paid once: the ranks run in parallel);
* on the :class:`StorageLink`: the bytes of every rank that moves its shard (reads and writes
  only; ``page_bytes_per_rank x ranks`` per page).

The stage part comes first (request set-up, then data). Idle stages wait on an event re-armed
through ``ctrl.on_work``: no polling, and events only where a call starts or ends. A call that
is in flight when the controller is reset (a flush) runs its course and is dropped without
effect, as SGLang's storage threads finish theirs (STORAGE_TIER.md D3/D4; counted, never a
crash). Every call becomes a :class:`StorageCallRow`.

:class:`StorageLink` is built once per store: per instance for a local store, once for a store
that every instance shares. Each direction (``read``: store -> host, ``write``: host -> store)
is **fair-shared** (processor sharing): the calls in flight each progress at
``min(bandwidth, aggregate x bandwidth / n)``. With one instance on its own link there is at
most one call per direction, so this is the same as a FIFO; on a shared store concurrent calls
slow each other down instead of the later one waiting for the earlier one, which is how
RDMA/NIC and SSD bandwidth is split. It costs one timer per call start or end: all calls in a
direction progress at the same rate, so a virtual-time clock orders their finishes (the head of
a heap of finish tags), and a single pending timer is re-armed (generation counter) when the
set of calls changes. A call ends when its timer fires (by event identity, never by comparing
a leftover float with an epsilon).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import simpy

from hicache.policy.storage import BackupOp, PrefetchOp, StageCall, StorageController
from hicache.storage_backends import CALL_KINDS, StorageBackendSpec

#: Link directions: ``read`` = store -> host DRAM (prefetch), ``write`` = host -> store (backup).
LINK_DIRECTIONS = ("read", "write")


class StorageCallRow(NamedTuple):
    """One backend call (simulated seconds). ``enqueue_s``: when the call could have started
    (its operation reached the stage, or the stage's previous call of the same operation
    ended); ``start_s``/``end_s``: the call itself. ``discarded``: read pages dropped because
    the prefetch was terminated (bandwidth spent, data not used)."""

    instance: int
    kind: str
    op_id: int
    pages: int
    bytes: int
    discarded: int
    enqueue_s: float
    start_s: float
    end_s: float


STORAGE_CALL_COLUMNS = StorageCallRow._fields


# ------------------------------------------------------------------------------------------
# The link to the store
# ------------------------------------------------------------------------------------------


class _Direction:
    __slots__ = (
        "Bps",
        "busy_since",
        "busy_time",
        "bytes",
        "calls",
        "flows",
        "gen",
        "name",
        "rate",
        "seq",
        "t",
        "v",
    )

    def __init__(self, name: str, Bps: float) -> None:
        self.name = name
        self.Bps = Bps
        self.flows: list[tuple[float, int, simpy.Event]] = []  # (finish tag, seq, done)
        self.v = 0.0  # bytes each flow in service has received so far (virtual time)
        self.t = 0.0  # when ``v`` was last brought up to date
        self.rate = 0.0  # bytes/s each flow receives now
        self.gen = 0
        self.seq = 0
        self.busy_time = 0.0
        self.busy_since = 0.0
        self.bytes = 0
        self.calls = 0


class StorageLink:
    """The bytes path between host DRAM and one store, fair-shared per direction (see the module
    docstring). ``spec`` gives the per-direction bandwidth one client may use; ``aggregate`` is
    the store's total per direction in units of it (1: every client of this link shares one
    instance's bandwidth; k: up to k clients at full speed each)."""

    def __init__(
        self, env: simpy.Environment, spec: StorageBackendSpec, *, aggregate: float = 1.0
    ) -> None:
        if not aggregate >= 1.0:
            raise ValueError(f"aggregate must be >= 1, got {aggregate}")
        self.env = env
        self.spec = spec
        self.aggregate = aggregate
        self.dirs = {d: _Direction(d, spec.link_Bps(d)) for d in LINK_DIRECTIONS}
        self.events = 0  # timers armed (for tests: bounded per call)
        self.clients = 0  # SimStorage drivers on this link: at most one flow each per direction
        self._until = dict.fromkeys(LINK_DIRECTIONS, 0.0)  # busy-until of uncontended calls

    def uncontended(self) -> bool:
        """No transfer can ever be slowed: every client may have one flow per direction in
        flight and the link carries that many at full speed. Callers may then charge a
        transfer as ``bytes / bandwidth`` with no events (:meth:`account`)."""
        return self.clients <= self.aggregate

    def account(self, direction: str, nbytes: int, start: float, end: float) -> None:
        """Record an uncontended transfer over [start, end] (starts come in time order)."""
        d = self.dirs[direction]
        d.bytes += nbytes
        d.calls += 1
        until = self._until[direction]
        d.busy_time += max(0.0, end - max(start, until))
        self._until[direction] = max(until, end)

    def transfer(self, direction: str, nbytes: int) -> simpy.Event:
        """Start moving ``nbytes`` (> 0) in ``direction``; the event succeeds when they are
        through."""
        if nbytes <= 0:
            raise ValueError(f"a transfer moves > 0 bytes, got {nbytes}")
        d = self.dirs[direction]
        self._advance(d)
        done = self.env.event()
        if not d.flows:
            d.busy_since = self.env.now
        d.seq += 1
        heapq.heappush(d.flows, (d.v + nbytes, d.seq, done))
        d.bytes += nbytes
        d.calls += 1
        self._arm(d)
        return done

    def active(self, direction: str) -> int:
        """Transfers in flight in ``direction``."""
        return len(self.dirs[direction].flows)

    def busy_time(self, direction: str) -> float:
        """Seconds ``direction`` has had at least one transfer in flight so far."""
        d = self.dirs[direction]
        extra = self.env.now - d.busy_since if d.flows else 0.0
        return d.busy_time + extra

    def bytes_moved(self, direction: str) -> int:
        """Bytes of the transfers started in ``direction`` so far."""
        return self.dirs[direction].bytes

    # ---------------------------------------------------------------------------- internals --
    def _advance(self, d: _Direction) -> None:
        now = self.env.now
        if d.flows:
            d.v += (now - d.t) * d.rate
        d.t = now

    def _arm(self, d: _Direction) -> None:
        d.gen += 1
        if not d.flows:
            return
        n = len(d.flows)
        d.rate = min(d.Bps, self.aggregate * d.Bps / n)
        delay = max(0.0, (d.flows[0][0] - d.v) / d.rate)
        ev = self.env.timeout(delay)
        self.events += 1
        ev.callbacks.append(partial(self._on_timer, d, d.gen))

    def _on_timer(self, d: _Direction, gen: int, _event: simpy.Event) -> None:
        if gen != d.gen:
            return  # stale: the set of transfers changed since
        # armed for exactly the head's remaining bytes at a rate unchanged since (any change
        # re-arms), so its firing is the head's completion: snap the virtual clock to its tag
        tag = d.flows[0][0]
        d.v = tag
        d.t = self.env.now
        done: list[simpy.Event] = []
        while d.flows and d.flows[0][0] <= tag:  # equal tags finish together
            done.append(heapq.heappop(d.flows)[2])
        if not d.flows:
            d.busy_time += self.env.now - d.busy_since
            d.v = 0.0  # restart the virtual clock: keeps its floats small over long runs
        self._arm(d)
        for ev in done:
            ev.succeed()


# ------------------------------------------------------------------------------------------
# The three stages
# ------------------------------------------------------------------------------------------


@dataclass
class StorageSimStats:
    """Totals of one :class:`SimStorage` (per stage: ``query``, ``read``, ``write``)."""

    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CALL_KINDS, 0))
    pages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CALL_KINDS, 0))
    busy_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CALL_KINDS, 0.0))
    bytes_read: int = 0
    bytes_written: int = 0
    pages_discarded: int = 0  # read after their prefetch was terminated
    empty_calls: int = 0  # zero-page calls: no backend call, no time, no row
    dropped_calls: int = 0  # in flight when the controller was reset: time spent, no effect


class SimStorage:
    """One instance's storage stages (see the module docstring).

    ``page_bytes_per_rank``: bytes of one page on one rank. ``ranks``: ranks whose shards cross
    the link on reads (MHA: every TP rank; MLA-type models keep one replica per rank, and every
    rank reads it into its own host pool); ``write_ranks`` (default ``ranks``): the same for
    backups (MLA-type models: 1, rank 0 only). ``spec`` charges the stage part; ``link`` (built
    from the same spec) carries the bytes. ``hash_s_per_page``: the query thread's page-key
    hashing, charged on every queried page (STORAGE_TIER.md §5.1 measured >= 0.3 us per token at
    page size 64; 0 leaves it out). ``instance`` labels the rows; ``rows`` is the list they are
    appended to (pass one list to several instances for one table).

    :attr:`listeners` are called with each finished :class:`StageCall` (after its ``end``), e.g.
    for the scheduler to re-check that request's prefetch.
    """

    def __init__(
        self,
        env: simpy.Environment,
        ctrl: StorageController,
        spec: StorageBackendSpec,
        link: StorageLink,
        page_bytes_per_rank: int,
        ranks: int,
        *,
        write_ranks: int | None = None,
        hash_s_per_page: float = 0.0,
        instance: int = 0,
        rows: list[StorageCallRow] | None = None,
    ) -> None:
        write_ranks = ranks if write_ranks is None else write_ranks
        if ranks < 1 or write_ranks < 1:
            raise ValueError(f"ranks and write_ranks must be >= 1, got {ranks}, {write_ranks}")
        if page_bytes_per_rank < 0 or hash_s_per_page < 0:
            raise ValueError("page_bytes_per_rank and hash_s_per_page must be >= 0")
        self.env = env
        self.ctrl = ctrl
        self.spec = spec
        self.link = link
        link.clients += 1
        self.page_bytes = page_bytes_per_rank
        self.link_ranks = {"query": 0, "read": ranks, "write": write_ranks}
        self.hash_s_per_page = hash_s_per_page
        self.instance = instance
        self.rows: list[StorageCallRow] = rows if rows is not None else []
        self.listeners: list[Callable[[StageCall], None]] = []
        self.stats = StorageSimStats()
        self._stage_fns: dict[
            str, tuple[Callable[[], StageCall | None], Callable[[StageCall], None]]
        ] = {
            "query": (ctrl.query_begin, ctrl.query_end),
            "read": (ctrl.read_begin, ctrl.read_end),
            "write": (ctrl.write_begin, ctrl.write_end),
        }
        self._running = dict.fromkeys(CALL_KINDS, False)
        self._cur: dict[str, PrefetchOp | BackupOp | None] = dict.fromkeys(CALL_KINDS)
        self._ready: dict[str, dict[int, float]] = {k: {} for k in CALL_KINDS}
        self._last_end = dict.fromkeys(CALL_KINDS, 0.0)
        self._started: dict[str, float | None] = dict.fromkeys(CALL_KINDS)
        self._queues: dict[str, Any] = {
            "query": ctrl.prefetch_queue, "read": ctrl.prefetch_buffer, "write": ctrl.backup_queue,
        }  # fmt: skip
        ctrl.on_work.append(self._on_work)
        for kind in CALL_KINDS:  # work queued before we were attached
            self._on_work(kind)

    # ------------------------------------------------------------------------------ public --
    def busy(self) -> bool:
        """A call is in progress or work is queued for a stage."""
        return self.ctrl.busy() or any(t is not None for t in self._started.values())

    def busy_time(self, kind: str) -> float:
        """Seconds the ``kind`` stage has spent in calls so far (the current one included)."""
        started = self._started[kind]
        extra = self.env.now - started if started is not None else 0.0
        return self.stats.busy_s[kind] + extra

    # ---------------------------------------------------------------------------- internals --
    def _on_work(self, kind: str) -> None:
        """``ctrl.on_work``: the controller queued work for ``kind`` (an op appended to its
        queue, or its head op's next call). Note when a new op reached the stage; start the
        stage if it is free."""
        tail = self._queues[kind]
        if not tail:
            return
        op = tail[-1]
        if op is not self._cur[kind]:
            self._ready[kind].setdefault(op.op_id, self.env.now)
        if not self._running[kind]:
            self._next(kind)

    def _charged_pages(self, call: StageCall) -> int:
        """Pages whose per-page cost a call pays: all, except a key-by-key existence query,
        which stops after the first missing page (read without side effects: the hasher's
        ``match_chain`` does not touch the LRU)."""
        if call.kind != "query" or not self.spec.query_stops_at_miss:
            return call.pages
        return self.spec.query_pages_charged(call.pages, len(self.ctrl.query_probe(call)))

    def _next(self, kind: str) -> None:
        """Start ``kind``'s next call, if any (the stage is free). Callback-driven, not a
        process: one timer per call, nothing while idle."""
        env = self.env
        begin, end = self._stage_fns[kind]
        while True:
            call = begin()
            self._notify_instant()
            if call is None:
                self._running[kind] = False
                return
            op = call.op
            start = env.now
            if op is self._cur[kind]:
                enqueue = self._last_end[kind]
            else:
                self._cur[kind] = op
                enqueue = self._ready[kind].pop(op.op_id, start)
            if call.pages > 0:
                break
            # SGLang makes no backend call for an empty batch
            self._running[kind] = True
            end(call)
            self.stats.empty_calls += 1
            self._last_end[kind] = start
            self._notify(call)
        self._running[kind] = True
        self._started[kind] = start
        fixed = self.spec.stage_seconds(kind, self._charged_pages(call), self.page_bytes)
        if kind == "query":
            fixed += self.hash_s_per_page * call.pages
        nbytes = call.pages * self.page_bytes * self.link_ranks[kind]
        link = self.link
        done_before = self.ctrl.read_progress(op) if kind == "read" else 0  # type: ignore[arg-type]
        finish = partial(self._finish, kind, call, start, enqueue, nbytes, done_before)
        if nbytes > 0 and not link.uncontended():
            # the stage part, then the bytes on a link whose rate others' transfers change
            def transfer(_event: simpy.Event) -> None:
                link.transfer(kind, nbytes).callbacks.append(finish)

            env.timeout(fixed).callbacks.append(transfer)
            return
        # one timer for the call: its transfer runs at full speed whatever else flows
        move = nbytes / link.dirs[kind].Bps if nbytes > 0 else 0.0
        if nbytes > 0:
            link.account(kind, nbytes, start + fixed, start + fixed + move)
        env.timeout(fixed + move).callbacks.append(finish)

    def _finish(
        self,
        kind: str,
        call: StageCall,
        start: float,
        enqueue: float,
        nbytes: int,
        done_before: int,
        _event: simpy.Event,
    ) -> None:
        stats, op = self.stats, call.op
        if self._is_head(kind, op):
            self._stage_fns[kind][1](call)
            if isinstance(op, PrefetchOp) and op.done_time < 0:
                # its I/O is over: revoked by the query, or its reads ended (all, or stopped)
                q = self.ctrl.prefetch_queue if kind == "query" else self.ctrl.prefetch_buffer
                if (kind == "query" and op.hit_pages == 0) or (kind == "read" and op not in q):
                    op.done_time = self.env.now
        else:  # the controller was reset (flush) during the call: it ends, unused
            stats.dropped_calls += 1
        discarded = 0
        if kind == "read":
            discarded = call.pages - (self.ctrl.read_progress(op) - done_before)  # type: ignore[arg-type]
            stats.pages_discarded += discarded
            stats.bytes_read += nbytes
        elif kind == "write":
            stats.bytes_written += nbytes
        now = self.env.now
        self._started[kind] = None
        self._last_end[kind] = now
        stats.calls[kind] += 1
        stats.pages[kind] += call.pages
        stats.busy_s[kind] += now - start
        self.rows.append(
            StorageCallRow(self.instance, kind, op.op_id, call.pages, nbytes, discarded,
                           enqueue, start, now)
        )  # fmt: skip
        self._notify(call)
        self._next(kind)

    def _is_head(self, kind: str, op: PrefetchOp | BackupOp) -> bool:
        """``op`` still heads ``kind``'s queue (``StorageController.reset`` empties them)."""
        c = self.ctrl
        if kind == "query":
            return bool(c.prefetch_queue) and c.prefetch_queue[0] is op
        if kind == "read":
            return bool(c.prefetch_buffer) and c.prefetch_buffer[0] is op
        return bool(c.backup_queue) and c.backup_queue[0] is op

    def _notify(self, call: StageCall) -> None:
        for cb in self.listeners:
            cb(call)

    def _notify_instant(self) -> None:
        """Operations the stage finished without a call (0.5.23): the scheduler must drain
        their results as it drains a call's."""
        instant = self.ctrl.instant
        while instant:
            self._notify(instant.pop(0))


__all__ = [
    "LINK_DIRECTIONS",
    "STORAGE_CALL_COLUMNS",
    "SimStorage",
    "StorageCallRow",
    "StorageLink",
    "StorageSimStats",
]
