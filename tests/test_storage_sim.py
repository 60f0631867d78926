"""The timed L3 stages (``sim.storage``) with the real policy core: closed-form call times.

Hand-made backend (``tests/test_storage_backends.py`` numbers): pages of 1,000 bytes, read at
1 MB/s (1 ms a page) and written at 0.5 MB/s; a call costs 10 / 20 / 30 ms (query / read /
write) plus 1 / 2 / 3 ms per page. So one 6-page prefetch queries for 10 + 6 = 16 ms and reads
for 20 + 12 + 6 = 38 ms. Cache set-up as STORAGE_TIER.md Appendix A: page size 4, device 64
tokens, host 128 tokens, prefetch threshold 8 tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
import simpy

from hicache.policy import HiRadixCache
from hicache.policy.storage import PageStore, StageCall, StorageController
from hicache.storage_backends import StorageBackendSpec
from sim.storage import SimStorage, StorageCallRow, StorageLink
from tests.policy.harness import Harness
from tests.test_storage_backends import spec

P = 4
PAGE_BYTES = 1000
QUERY_6 = 0.010 + 6 * 0.001
READ_6 = 0.020 + 6 * 0.002 + 6 * PAGE_BYTES / 1e6


class Node:
    """One instance: pools, cache with L3 attached, and its timed storage stages."""

    def __init__(
        self,
        env: simpy.Environment,
        link: StorageLink,
        *,
        backend: StorageBackendSpec | None = None,
        policy: str = "wait_complete",
        batch_pages: int = 128,
        ranks: int = 1,
        write_ranks: int | None = None,
        instance: int = 0,
        rows: list[StorageCallRow] | None = None,
    ) -> None:
        self.env = env
        self.h = Harness(device_tokens=64, host_tokens=128, page_size=P)
        assert self.h.host is not None
        self.store = PageStore()
        self.ctrl = StorageController(
            self.h.host, self.store, device_tokens=64, threshold=8, batch_pages=batch_pages
        )
        self.cache: HiRadixCache = self.h.cache
        self.cache.attach_storage(self.ctrl, prefetch_policy=policy, prefetch_threshold=8)
        self.sim = SimStorage(
            env, self.ctrl, backend or link.spec, link, PAGE_BYTES, ranks,
            write_ranks=write_ranks, instance=instance, rows=rows,
        )  # fmt: skip
        self.heard: list[tuple[str, float, int]] = []  # (kind, when, completed tokens then)
        self.sim.listeners.append(self._hear)

    def _hear(self, call: StageCall) -> None:
        self.heard.append((call.kind, self.env.now, call.op.completed_tokens))

    def hold(self, tokens: list[int]) -> None:
        """Put the pages of ``tokens`` (a prefix from the root) into L3."""
        self.store.set(self.ctrl.hasher.chain(0, self.h.key(tokens)))

    def prefetch(self, rid: str, tokens: list[int]) -> bool:
        root = self.cache.root
        symbols = tuple(self.h.key(tokens))
        return self.cache.prefetch_from_storage(
            rid, root, symbols, self.cache.last_hash(root), self.env.now
        )

    def rows(self, kind: str) -> list[StorageCallRow]:
        me = self.sim.instance
        return [r for r in self.sim.rows if r.kind == kind and r.instance == me]


def at(env: simpy.Environment, t: float, fn: Callable[[], object]) -> None:
    """Call ``fn`` at simulated time ``t``."""

    def proc() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(t)
        fn()

    env.process(proc())


def toks(first: int, pages: int = 6) -> list[int]:
    return list(range(first, first + pages * P))


def test_prefetch_finishes_at_query_plus_read_time() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()))
    n.hold(toks(0))
    assert n.prefetch("r1", toks(0))
    env.run()
    (q,) = n.rows("query")
    (r,) = n.rows("read")
    assert (q.start_s, q.pages, q.bytes) == (0.0, 6, 0) and q.end_s == pytest.approx(QUERY_6)
    assert (r.enqueue_s, r.start_s) == (q.end_s, q.end_s)
    assert r.end_s == pytest.approx(QUERY_6 + READ_6)  # 0.054
    assert (r.pages, r.bytes, r.discarded) == (6, 6000, 0)
    # progress becomes visible at the read's end, not before
    assert n.heard == [("query", q.end_s, 0), ("read", r.end_s, 24)]
    assert n.cache.check_prefetch_progress("r1", env.now)
    assert n.cache.pop_prefetch_loaded_tokens("r1") == 24
    st = n.sim.stats
    assert st.calls == {"query": 1, "read": 1, "write": 0}
    assert st.bytes_read == 6000 and st.bytes_written == 0
    assert st.busy_s["read"] == pytest.approx(READ_6)
    assert n.sim.link.busy_time("read") == pytest.approx(0.006)
    assert not n.sim.busy()


def test_wait_complete_is_not_done_before_the_read_ends() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()))
    n.hold(toks(0))
    n.prefetch("r1", toks(0))
    end = QUERY_6 + READ_6
    env.run(until=end - 1e-9)
    assert not n.cache.check_prefetch_progress("r1", env.now)
    env.run()
    assert env.now == pytest.approx(end)
    assert n.cache.check_prefetch_progress("r1", env.now)


def test_key_by_key_query_pays_up_to_the_first_miss() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec(query_stops_at_miss=True)))
    n.hold(toks(0, pages=2))  # 2 of the 6 pages are in L3
    n.prefetch("r1", toks(0))
    env.run()
    (q,) = n.rows("query")
    (r,) = n.rows("read")
    assert q.end_s == pytest.approx(0.010 + 3 * 0.001)  # 2 hits + the miss, not 6 pages
    assert r.pages == 2 and r.end_s == pytest.approx(q.end_s + 0.020 + 2 * 0.002 + 0.002)


def test_stages_are_fifo_and_pipelined() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()))
    n.hold(toks(0))
    n.hold(toks(1000))
    assert n.prefetch("r1", toks(0)) and n.prefetch("r2", toks(1000))
    env.run()
    q1, q2 = n.rows("query")
    r1, r2 = n.rows("read")
    assert q1.op_id < q2.op_id and r1.op_id == q1.op_id and r2.op_id == q2.op_id
    # r2's query waits for r1's; r2's read waits for r1's read, not for its own query
    assert q2.enqueue_s == 0.0 and q2.start_s == pytest.approx(QUERY_6)
    assert q2.end_s == pytest.approx(2 * QUERY_6)
    assert r1.start_s == pytest.approx(QUERY_6)
    assert r2.enqueue_s == pytest.approx(2 * QUERY_6) and r2.start_s == pytest.approx(r1.end_s)
    assert r2.end_s == pytest.approx(QUERY_6 + 2 * READ_6)
    assert [k for k, _, _ in n.heard] == ["query", "query", "read", "read"]


def test_batches_are_sequential_calls() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()), batch_pages=2)
    n.hold(toks(0))
    n.prefetch("r1", toks(0))
    env.run()
    q_call, r_call = 0.010 + 2 * 0.001, 0.020 + 2 * 0.002 + 0.002
    assert [r.pages for r in n.sim.rows] == [2, 2, 2, 2, 2, 2]
    reads = n.rows("read")
    assert [r.end_s for r in reads] == pytest.approx([3 * q_call + k * r_call for k in (1, 2, 3)])
    # progress steps up at the end of each read batch
    assert [c for k, _, c in n.heard if k == "read"] == [8, 16, 24]
    assert n.sim.link.events <= 2 * len(reads) + 1  # timers only at transfer starts and ends


def test_idle_stages_wake_on_new_work() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()))
    n.hold(toks(0))
    at(env, 1.0, lambda: n.prefetch("r1", toks(0)))
    env.run()
    (q,) = n.rows("query")
    assert (q.enqueue_s, q.start_s) == (1.0, 1.0)
    assert n.rows("read")[0].end_s == pytest.approx(1.0 + QUERY_6 + READ_6)


def test_two_instances_share_a_store_link() -> None:
    def run(shared: bool) -> list[float]:
        env = simpy.Environment()
        common = StorageLink(env, spec())
        nodes = [
            Node(env, common if shared else StorageLink(env, spec()), instance=i) for i in range(2)
        ]
        for i, n in enumerate(nodes):
            n.hold(toks(0))
            n.prefetch(f"r{i}", toks(0))
        env.run()
        return [n.rows("read")[0].end_s for n in nodes]

    alone = QUERY_6 + READ_6
    assert run(shared=False) == pytest.approx([alone, alone])
    # both reads put 6,000 B on the link at 0.048 s; fair sharing gives each half: 12 ms
    assert run(shared=True) == pytest.approx([alone + 0.006, alone + 0.006])


def test_terminated_prefetch_still_occupies_the_link() -> None:
    def run(abort_a: bool) -> tuple[StorageCallRow, StorageCallRow]:
        env = simpy.Environment()
        link, rows = StorageLink(env, spec()), list[StorageCallRow]()
        a, b = (Node(env, link, instance=i, rows=rows) for i in range(2))
        for n in (a, b):
            n.hold(toks(0))
        a.prefetch("a", toks(0))
        b.prefetch("b", toks(0))
        if abort_a:  # a is aborted while its read is being prepared (stage part, 16-48 ms)
            at(env, 0.030, lambda: a.cache.release_aborted_request("a"))
        env.run()
        (ra,) = a.rows("read")
        (rb,) = b.rows("read")
        assert rows == sorted(rows, key=lambda r: r.end_s)  # one shared table
        return ra, rb

    ra, rb = run(abort_a=True)
    assert ra.discarded == 6 and ra.bytes == 6000  # read, paid for, dropped
    assert rb.end_s == pytest.approx(QUERY_6 + READ_6 + 0.006)  # b still shared the link
    ra2, rb2 = run(abort_a=False)
    assert ra2.discarded == 0 and rb2.end_s == rb.end_s


def test_in_flight_batch_finishes_before_the_next_prefetch_reads() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()), policy="best_effort")
    n.hold(toks(0))
    n.hold(toks(1000))
    n.prefetch("r1", toks(0))
    n.prefetch("r2", toks(1000))
    # best_effort: r1 is let go at the first check after its read started; the batch goes on
    at(env, QUERY_6 + 0.001, lambda: n.cache.check_prefetch_progress("r1", env.now))
    env.run()
    r1, r2 = n.rows("read")
    assert r1.discarded == 6 and r1.end_s == pytest.approx(QUERY_6 + READ_6)
    assert r2.start_s == pytest.approx(r1.end_s) and r2.discarded == 0
    assert n.sim.stats.pages_discarded == 6


def test_backup_after_the_write_ack_crosses_the_link_per_rank() -> None:
    for write_ranks, link_s in ((1, 0.006), (2, 0.012)):
        env = simpy.Environment()
        n = Node(env, StorageLink(env, spec()), ranks=2, write_ranks=write_ranks)
        n.h.insert(list(range(12)))  # 3 pages, write_through
        n.h.ack_writes()  # D->H ack: the L3 backup is queued (3 pages)
        env.run()
        (w,) = n.rows("write")
        assert w.pages == 3 and w.bytes == 3000 * write_ranks
        assert w.end_s == pytest.approx(0.030 + 3 * 0.003 + link_s)
        n.cache.check_hicache_events()  # the ack is drained: pin released
        assert len(n.store) == 3 and not n.cache.ongoing_backup
        assert n.sim.stats.bytes_written == 3000 * write_ranks
        assert n.sim.link.busy_time("write") == pytest.approx(link_s)


def test_zero_page_calls_take_no_time_and_make_no_row() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()))
    at(env, 0.5, lambda: n.ctrl.write_storage([], []))
    env.run()
    assert env.now == 0.5 and not n.sim.rows
    assert n.sim.stats.empty_calls == 1 and n.sim.stats.calls["write"] == 0
    assert n.heard == [("write", 0.5, 0)]  # listeners still hear it (the ack is queued)
    (op,) = n.ctrl.ack_backup_queue
    assert op.completed_tokens == 0


def test_link_fair_sharing_closed_form() -> None:
    def run(aggregate: float) -> list[float]:
        env = simpy.Environment()
        link = StorageLink(env, spec(), aggregate=aggregate)  # 1 MB/s per direction
        ends: list[float] = []

        def go(t: float, nbytes: int) -> Generator[simpy.Event, Any, None]:
            yield env.timeout(t)
            yield link.transfer("read", nbytes)
            ends.append(env.now)

        env.process(go(0.0, 3000))
        env.process(go(0.001, 1000))
        env.run()
        assert link.events <= 2 * 2 + 1 and link.bytes_moved("read") == 4000
        return ends

    # a alone 1 ms (1,000 B), then both at 0.5 MB/s: b ends at 3 ms, a's last 1,000 B alone
    assert run(1.0) == pytest.approx([0.003, 0.004])
    # a store twice one client's bandwidth: each runs at its full 1 MB/s
    assert run(2.0) == pytest.approx([0.002, 0.003])


def test_link_directions_are_independent() -> None:
    env = simpy.Environment()
    link = StorageLink(env, spec())
    r, w = link.transfer("read", 1000), link.transfer("write", 1000)
    env.run()
    assert r.processed and w.processed and env.now == pytest.approx(0.002)
    assert link.busy_time("read") == pytest.approx(0.001)
    assert link.busy_time("write") == pytest.approx(0.002)
    with pytest.raises(ValueError, match="> 0 bytes"):
        link.transfer("read", 0)
    with pytest.raises(ValueError, match="aggregate"):
        StorageLink(env, spec(), aggregate=0.5)


def test_flush_during_calls_drops_them_without_a_crash() -> None:
    env = simpy.Environment()
    n = Node(env, StorageLink(env, spec()))
    n.hold(toks(0))
    n.hold(toks(1000))
    n.prefetch("r1", toks(0))
    n.prefetch("r2", toks(1000))
    # at 20 ms r1's read is in flight and r2's query too; the flush resets the controller
    at(env, 0.020, n.cache.flush)
    env.run()
    assert n.sim.stats.dropped_calls == 2
    _, q2 = n.rows("query")
    (r1,) = n.rows("read")  # the in-flight read still ran its course, its data unused
    assert r1.discarded == 6 and r1.end_s == pytest.approx(QUERY_6 + READ_6)
    assert q2.end_s == pytest.approx(2 * QUERY_6)  # r2's query ended too, after the reset
    assert not n.ctrl.busy() and not n.sim.busy()
